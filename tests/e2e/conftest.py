"""One local cloud for the whole e2e session: moto EC2, an in-process dask scheduler, a real dockerd swarm
manager and the machine emulator, which boots the daemon's instances into real dockerd swarm nodes. A
module whose tests launch machines turns on their real boot with the `real_boot` fixture (each runs its own
user data on its own dockerd node; its dask worker is the worker service's task); without it, none boots.

Only one local swarm may run per machine, so the cloud is session-scoped and every test leaves the fleet
back at the minimum plus the reserve (zero here: no reserve, no minimum, so that each scenario's launches
are its own). The cloud is always torn down (LocalCloud's exit stack, then LocalSwarm's full teardown).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from tests.e2e.helpers import booting_from_user_data, ec2_client

from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions, loopback_prefix
from swarm_autoscaler_lab.localcloud.dockerd import check_install
from swarm_autoscaler_lab.localcloud.registry import LocalRegistry
from swarm_autoscaler_lab.localcloud.registry import missing as registry_missing

E2E_TYPES: dict[str, dict[str, Any]] = {"m5.large": {}, "m5.xlarge": {}, "r5.large": {}}
CLUSTER = "e2e"


@pytest.fixture(scope="session")
def registry() -> Iterator[LocalRegistry]:
    """A real private registry with authentication on a loopback address (Debian's docker-registry,
    htpasswd): it stands in for ECR or a team's registry. The machines' worker image is pulled from it."""
    lacking = registry_missing()
    if lacking:
        pytest.fail(f"the e2e suite needs {', '.join(lacking)}: run scripts/ensure-services.sh")
    with LocalRegistry() as reg:
        yield reg


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def cloud(registry: LocalRegistry) -> AsyncIterator[LocalCloud]:
    missing = check_install()
    if missing:
        pytest.skip("the e2e suite needs a real local swarm: " + "; ".join(missing))
    # A VPC carved from loopback: each machine's PrivateIpAddress is the address its dockerd node
    # advertises and its boot sends from (join tickets, swarm's Status.Addr), as on EC2.
    options = LocalCloudOptions(
        fast=True,
        real_swarm=True,
        cluster_name=CLUSTER,
        allowed_types=E2E_TYPES,
        max_instances=6,
        seed=3,
        vpc_prefix=loopback_prefix(),
    )
    async with LocalCloud(options) as lc:
        # machines booting from user data pull the team worker image (no swarm_autoscaler) from it
        lc.registry = registry
        yield lc


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def real_boot(cloud: LocalCloud) -> AsyncIterator[None]:
    """For a test module: every machine launched boots as EC2 boots it, from its own user data on its own
    dockerd node, and its dask worker is the worker service's task (`LocalCloud.real_boot_on`)."""
    async with booting_from_user_data(cloud):
        yield


@pytest.fixture(scope="session")
def foreign_instance(cloud: LocalCloud) -> str:
    """An instance in the same EC2 that does not carry our ownership tags: the daemon must never touch it."""
    assert cloud.network is not None
    ec2 = ec2_client(cloud)
    reply = ec2.run_instances(
        ImageId=cloud.network.ami_id,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        SubnetId=cloud.network.subnet_ids[0],
    )
    return str(reply["Instances"][0]["InstanceId"])
