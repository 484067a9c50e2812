"""One deployment, one identity, against a real moto server over HTTP (moto stands in for EC2's
DescribeInstances, RunInstances and tags): two deployments that share a cluster name in one account and
region (two daemons left at the same AUTOSCALER_CLUSTER_NAME) never touch each other's machines, and the
second one to start is refused with one line. The deployment ids stand for the swarms' ids
(`SwarmOrchestrator.swarm_id`, read from docker at start). A copy of one of our machines (the console's
"launch more like this", which copies every tag) is never ours: moto returns each instance's own
`ClientToken` in DescribeInstances as EC2 does, and the copy is a RunInstances of the test's own (moto
has no console) with the original's tags under a token of its own."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.adapters.ec2.ec2_helpers import CloudFactory, launch_more_like_this

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, DEPLOYMENT_TAG, OWNER_TAG, OWNER_VALUE
from swarm_autoscaler.adapters.ec2_identity import claim
from swarm_autoscaler.adapters.ec2_launch_token import LAUNCH_TOKEN_TAG
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


async def _raw(raw_ec2: Any, instance_id: str) -> dict[str, Any]:
    found = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    raw: dict[str, Any] = found["Reservations"][0]["Instances"][0]
    return raw


async def test_a_console_copy_of_our_machine_is_not_ours_and_is_never_touched(
    make_cloud: CloudFactory, raw_ec2: Any
) -> None:
    """Every launch (on demand, spot, into the warm pool) writes its ClientToken in a tag, which EC2
    gives back as the instance's own; a copy carries the tag but not the token: it is left out of the
    listing, logged once, and every stop, start or terminate of it is refused. A warm-pool machine
    keeps its token through a stop and a start and stays ours."""
    cloud = await make_cloud(capacities={"m5.large": ("spot", "on-demand")})
    await claim(cloud, "swarm-a")
    (machine,) = (await cloud.launch("t3.micro", 1, {})).instances
    (spot,) = (await cloud.launch("m5.large", 1, {})).instances
    (warm,) = (await cloud.launch("t3.micro", 1, {}, pool=True)).instances
    assert (await _raw(raw_ec2, spot.id)).get("InstanceLifecycle") == "spot"
    for mine in (machine, spot, warm):
        raw = await _raw(raw_ec2, mine.id)
        tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
        assert raw["ClientToken"] == tags[LAUNCH_TOKEN_TAG]  # EC2's echo, which the check rests on

    copy = await launch_more_like_this(raw_ec2, machine.id)
    assert await _tags(raw_ec2, copy) == await _tags(raw_ec2, machine.id)  # every tag, ownership too
    with capture_logs() as logs:
        first = {i.id for i in await cloud.list_instances()}
        second = {i.id for i in await cloud.list_instances()}
    assert first == second == {machine.id, spot.id, warm.id}
    told = [e for e in logs if e.get("instance_id") == copy]
    assert len(told) == 1 and told[0]["log_level"] == "warning", logs  # one line, naming it and why
    assert "ClientToken" in told[0]["why"]
    for disrupt in (cloud.terminate, cloud.stop_instances, cloud.start_instances):
        with pytest.raises(ConfigurationError, match="refusing to"):
            await disrupt([copy])
    assert await _state(raw_ec2, copy) in ("pending", "running")

    await cloud.stop_instances([warm.id])
    started = await cloud.start_instances([warm.id])
    assert [i.id for i in started.instances] == [warm.id]
    assert warm.id in {i.id for i in await cloud.list_instances()}  # its token survived stop and start
    await cloud.terminate([machine.id, spot.id, warm.id])
    await raw_ec2.terminate_instances(InstanceIds=[copy])  # the shared moto: leave nothing running
