"""The local EC2 itself: moto's server with instance-type validation on, and its fault injector."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

from swarm_autoscaler.core.catalogue import CATALOGUE, known_type
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer


async def _run(raw_ec2: Any, network: LocalNetwork, type_name: str) -> str:
    result = await raw_ec2.run_instances(
        ImageId=network.ami_id, InstanceType=type_name, MinCount=1, MaxCount=1, SubnetId=network.subnet_ids[0]
    )
    return str(result["Instances"][0]["InstanceId"])


async def test_validation_rejects_a_bogus_instance_type(raw_ec2: Any, network: LocalNetwork) -> None:
    with pytest.raises(ClientError) as raised:
        await _run(raw_ec2, network, "m5.gigantic")

    assert raised.value.response["Error"]["Code"].startswith("InvalidInstanceType")
    assert (await _run(raw_ec2, network, "m5.large")).startswith("i-")


async def test_seeded_refusals_replay_the_same_sequence(
    raw_ec2: Any, network: LocalNetwork, faults: FaultInjector
) -> None:
    async def outcomes() -> list[bool]:
        seen = []
        for _ in range(12):
            try:
                await _run(raw_ec2, network, "t3.nano")
                seen.append(True)
            except ClientError as exc:
                assert exc.response["Error"]["Code"] == "InsufficientInstanceCapacity"
                assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 500
                seen.append(False)
        return seen

    faults.refuse("t3.nano", probability=0.5)
    faults.reseed(42)
    first = await outcomes()
    faults.reseed(42)
    second = await outcomes()

    assert first == second
    assert True in first and False in first
    assert faults.capacity_refusals == 2 * first.count(False)


async def test_rules_change_at_run_time(raw_ec2: Any, network: LocalNetwork, faults: FaultInjector) -> None:
    faults.refuse("t3.small", subnet_id="subnet-elsewhere")
    assert (await _run(raw_ec2, network, "t3.small")).startswith("i-")  # another subnet: not refused

    faults.refuse("t3.small")
    with pytest.raises(ClientError, match="InsufficientInstanceCapacity"):
        await _run(raw_ec2, network, "t3.small")

    faults.allow("t3.small")
    assert (await _run(raw_ec2, network, "t3.small")).startswith("i-")
    with pytest.raises(ValueError, match="probability"):
        faults.refuse("t3.small", probability=1.5)


async def test_throttling_is_injected_for_the_next_calls_only(raw_ec2: Any, faults: FaultInjector) -> None:
    faults.throttle("DescribeAvailabilityZones", times=1)

    with pytest.raises(ClientError, match="RequestLimitExceeded"):
        await raw_ec2.describe_availability_zones()
    zones = await raw_ec2.describe_availability_zones()

    assert zones["AvailabilityZones"]
    assert faults.calls()["DescribeAvailabilityZones"] == 2


def test_server_starts_on_a_free_port_and_stops() -> None:
    def zones(endpoint: str) -> list[Any]:
        client = botocore.session.get_session().create_client(
            "ec2",
            region_name="eu-west-1",
            endpoint_url=endpoint,
            aws_access_key_id="x",
            aws_secret_access_key="y",
            config=Config(retries={"total_max_attempts": 1}, connect_timeout=2),
        )
        return list(client.describe_availability_zones()["AvailabilityZones"])

    with MotoServer() as server:
        endpoint = server.endpoint
        assert endpoint.startswith("http://127.0.0.1:")
        assert zones(endpoint)

    with pytest.raises(EndpointConnectionError):
        zones(endpoint)
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.endpoint


def test_catalogue_covers_the_families() -> None:
    for family, sizes in {
        "t3": ("nano", "micro", "small", "medium", "large", "xlarge", "2xlarge"),
        "m5": ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge"),
        "c5": ("large", "xlarge", "2xlarge", "4xlarge", "9xlarge", "12xlarge", "18xlarge", "24xlarge"),
        "r5": ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge"),
        "g4dn": ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge"),
        "p3": ("2xlarge", "8xlarge", "16xlarge"),
    }.items():
        for size in sizes:
            assert known_type(f"{family}.{size}"), f"{family}.{size}"
    assert not known_type("m5.gigantic")
    p3 = CATALOGUE["p3.8xlarge"]
    assert (p3.resources.cpus, p3.resources.ram, p3.resources.gpus) == (32.0, 244 * GIB, 4)
    assert all(t.price_per_hour and t.price_per_hour > 0 for t in CATALOGUE.values())
