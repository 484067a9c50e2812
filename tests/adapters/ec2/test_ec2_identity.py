"""One deployment, one identity, against a real moto server over HTTP (moto stands in for EC2's
DescribeInstances, RunInstances and tags): two deployments that share a cluster name in one account and
region (two daemons left at the same AUTOSCALER_CLUSTER_NAME) never touch each other's machines, and the
second one to start is refused with one line. The deployment ids stand for the swarms' ids
(`SwarmOrchestrator.swarm_id`, read from docker at start)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import CloudFactory

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, DEPLOYMENT_TAG, OWNER_TAG, OWNER_VALUE
from swarm_autoscaler.adapters.ec2_identity import claim
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud import LocalNetwork


async def _tags(raw_ec2: Any, instance_id: str) -> dict[str, str]:
    found = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    raw = found["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in raw.get("Tags", ())}


async def _state(raw_ec2: Any, instance_id: str) -> str:
    found = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    return str(found["Reservations"][0]["Instances"][0]["State"]["Name"])


async def test_a_second_deployment_under_the_same_name_is_refused_and_touches_nothing(
    make_cloud: CloudFactory, raw_ec2: Any
) -> None:
    first = await make_cloud()
    await claim(first, "swarm-a")
    launched = (await first.launch("t3.micro", 2, {})).instances
    for instance in launched:
        assert (await _tags(raw_ec2, instance.id))[DEPLOYMENT_TAG] == "swarm-a"
    volumes = await raw_ec2.describe_volumes(
        Filters=[{"Name": "tag:" + DEPLOYMENT_TAG, "Values": ["swarm-a"]}]
    )
    assert volumes["Volumes"], "the volume carries the deployment too"

    second = await make_cloud(cluster_name=first.cluster_name)
    with pytest.raises(ConfigurationError) as refused:
        await claim(second, "swarm-b")
    message = str(refused.value)
    assert message.startswith("AUTOSCALER_CLUSTER_NAME: ") and "\n" not in message
    assert "swarm swarm-a" in message and launched[0].id in message

    # Started at the same moment (before the first launched): the second holds its own id and still
    # sees, stops and terminates nothing of the first.
    second.deployment = "swarm-b"
    assert await second.list_instances() == ()
    with pytest.raises(ConfigurationError, match="refusing to terminate"):
        await second.terminate([launched[0].id])
    assert {await _state(raw_ec2, i.id) for i in launched} <= {"pending", "running"}
    assert {i.id for i in await first.list_instances()} == {i.id for i in launched}


async def test_machines_from_before_deployment_ids_stay_their_name_s(
    make_cloud: CloudFactory, raw_ec2: Any, network: LocalNetwork
) -> None:
    """A machine launched by a version without deployment ids (ownership tags only) is not another
    deployment's: the upgraded daemon starts and keeps managing it."""
    cloud = await make_cloud()
    old = await raw_ec2.run_instances(
        ImageId=network.ami_id, InstanceType="t3.micro", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": OWNER_TAG, "Value": OWNER_VALUE}, {"Key": CLUSTER_TAG, "Value": cloud.cluster_name}]}],
    )  # fmt: skip
    old_id = old["Instances"][0]["InstanceId"]
    await claim(cloud, "swarm-a")
    assert [i.id for i in await cloud.list_instances()] == [old_id]
    await cloud.terminate([old_id])
    assert await _state(raw_ec2, old_id) in ("shutting-down", "terminated")
