"""The warm pool's EC2 calls over the moto server: a pool launch stops itself after its boot script,
a start rewrites the user data with a fresh join and tags the start, a stop is refused for machines
that are not ours, and a start refused for capacity is reported and backed off."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import BOOT_SCRIPT, MANAGER, TOKEN, CloudFactory
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2_support import POOL_STOP_LINE, STARTED_AT_TAG, to_instance
from swarm_autoscaler.core.model import InstanceState, PoolPhase
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud import FaultInjector


async def _user_data(raw_ec2: Any, instance_id: str) -> str:
    attr = await raw_ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


async def test_a_pool_launch_prepares_then_stops_without_joining(
    make_cloud: CloudFactory, raw_ec2: Any
) -> None:
    cloud = await make_cloud()
    [inst] = (await cloud.launch("m5.large", 1, {"role": "gpu"}, pool=True)).instances
    [listed] = await cloud.list_instances()
    assert listed.pool is PoolPhase.PREPARE
    text = await _user_data(raw_ec2, inst.id)
    assert BOOT_SCRIPT in text and POOL_STOP_LINE in text and "swarm join" not in text
    assert text.index(BOOT_SCRIPT) < text.index(POOL_STOP_LINE)
    behaviour = await raw_ec2.describe_instance_attribute(
        InstanceId=inst.id, Attribute="instanceInitiatedShutdownBehavior"
    )
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "stop"


async def test_stop_then_start_joins_on_the_next_boot(
    make_cloud: CloudFactory, raw_ec2: Any, clock: SteppedClock
) -> None:
    cloud = await make_cloud()
    [inst] = (await cloud.launch("m5.large", 1, {})).instances
    await cloud.stop_instances([inst.id])
    await cloud.stop_instances([inst.id])  # idempotent
    [listed] = await cloud.list_instances()
    assert listed.state is InstanceState.STOPPED
    clock.step(3600)
    result = await cloud.start_instances([inst.id])
    assert [i.id for i in result.instances] == [inst.id] and not result.refused and result.error is None
    [listed] = await cloud.list_instances()
    assert listed.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert listed.pool is PoolPhase.START
    # the start time (EC2's clock: here the test's), which `launched_at` takes once it is later than
    # LaunchTime (moto keeps the first launch's; AWS moves it to the start)
    assert float(listed.tags[STARTED_AT_TAG]) == pytest.approx(clock.now)
    text = await _user_data(raw_ec2, inst.id)
    assert f"docker swarm join --token {TOKEN} {MANAGER}" in text
    assert "docker swarm leave --force" in text and "[scripts-user, always]" in text


async def test_a_start_refused_for_capacity_is_reported_and_backed_off(
    make_cloud: CloudFactory, faults: FaultInjector, clock: SteppedClock
) -> None:
    cloud = await make_cloud()
    [inst] = (await cloud.launch("c5.large", 1, {})).instances
    await cloud.stop_instances([inst.id])
    faults.fail("StartInstances", code="InsufficientInstanceCapacity", message="no capacity")
    result = await cloud.start_instances([inst.id])
    assert result.instances == () and result.error is None
    assert [(u.type_name, u.subnet_id) for u in result.refused] == [("c5.large", inst.subnet_id)]
    assert [(u.type_name, u.subnet_id) for u in cloud.unavailable(clock.now)] == [
        ("c5.large", inst.subnet_id)
    ]
    [listed] = await cloud.list_instances()
    assert listed.state is InstanceState.STOPPED


async def test_start_and_stop_refuse_instances_that_are_not_ours(make_cloud: CloudFactory) -> None:
    ours, theirs = await make_cloud(), await make_cloud()
    [inst] = (await theirs.launch("m5.large", 1, {})).instances
    with pytest.raises(ConfigurationError):
        await ours.stop_instances([inst.id])
    with pytest.raises(ConfigurationError):
        await ours.start_instances([inst.id])


def test_the_start_time_tag_moves_launched_at_forward() -> None:
    import datetime as dt

    launched = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    raw = {
        "InstanceId": "i-1",
        "InstanceType": "m5.large",
        "State": {"Name": "pending"},
        "LaunchTime": launched,
        "Tags": [{"Key": STARTED_AT_TAG, "Value": str(launched.timestamp() + 3600)}],
    }
    inst = to_instance(raw)
    assert inst is not None and inst.launched_at == launched.timestamp() + 3600
