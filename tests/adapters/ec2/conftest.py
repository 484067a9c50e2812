"""A real moto server over HTTP for the EC2 adapter's contract tests, started once per session.

moto's state is process-wide, so every test gets its own cluster name (the ownership tag) and sees
only its own instances; fault rules are cleared after each test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from tests.adapters.ec2.ec2_helpers import (
    ACCESS_KEY,
    BOOT_SCRIPT,
    SECRET_KEY,
    TYPES,
    CloudFactory,
    cluster_ids,
    join_command,
)
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler_lab.localcloud import (
    FaultInjector,
    LocalNetwork,
    MotoServer,
    StrictEc2,
    provision_network,
)

# EC2's own rules where moto is generous, on for every adapter test: throttling above a request rate, a
# zone's room for a type, user data that must be base64 of at most 16 KiB (`localcloud.ec2_strict`). The
# rate and the room are EC2's order of magnitude, above what a test needs; `test_strict_ec2` tightens them
# and turns on the new instance's invisibility and vCPU quotas.
SUITE_STRICT = {"invisible_s": 0.0, "rate": 100.0, "burst": 200.0, "zone_capacity": 1000}


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer(seed=1) as server:
        server.faults.be_strict(StrictEc2(**SUITE_STRICT))
        yield server


@pytest.fixture(scope="session")
def network(moto_server: MotoServer) -> LocalNetwork:
    return provision_network(moto_server.endpoint)


@pytest.fixture
def faults(moto_server: MotoServer) -> Iterator[FaultInjector]:
    moto_server.faults.reset()
    yield moto_server.faults
    moto_server.faults.reset()


@pytest.fixture(scope="session")
async def raw_ec2(moto_server: MotoServer) -> AsyncIterator[Any]:
    """A plain aiobotocore client, for arranging and checking what the adapter did."""
    async with get_session().create_client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=moto_server.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=AioConfig(retries={"total_max_attempts": 1, "mode": "standard"}),  # see every injected fault
    ) as client:
        yield client


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
async def make_cloud(
    moto_server: MotoServer, network: LocalNetwork, clock: SteppedClock, faults: FaultInjector
) -> AsyncIterator[CloudFactory]:
    """Builds started clouds on the moto server, each with a fresh cluster name unless one is given."""
    clouds: list[Ec2Cloud] = []

    async def make(**overrides: Any) -> Ec2Cloud:
        options: dict[str, Any] = {
            "cluster_name": f"test-{next(cluster_ids)}",
            "region": network.region,
            "endpoint": moto_server.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "allowed_types": {name: (network.ami_id, BOOT_SCRIPT) for name in TYPES},
            "subnet_ids": network.subnet_ids,
            "security_group_ids": [network.security_group_id],
            "key_name": network.key_name,
            "iam_instance_profile": network.instance_profile,
            "custom_tags": {"team": "science"},
            "join_command": join_command,
            "clock": clock,
            "retry_initial": 0.01,
            "retry_max": 0.05,
            # exact back-off deadlines in the tests that step the clock; the jitter has its own test
            "capacity_backoff_jitter": 0.0,
        }
        options.update(overrides)
        cloud = await Ec2Cloud(**options).start()
        clouds.append(cloud)
        return cloud

    yield make
    for cloud in clouds:
        await cloud.close()
