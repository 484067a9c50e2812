"""A machine whose boot failed stops itself (`adapters.boot_scripts`); the adapter backs its type off
at once. moto stands in for EC2: the test stops the instance through the API, as the machine's own
`shutdown -h now` does with InstanceInitiatedShutdownBehavior=stop (the daemon itself stops only warm
pool machines)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import BOOT_SCRIPT, CloudFactory
from tests.fakes import SteppedClock

from swarm_autoscaler.core.model import InstanceState
from swarm_autoscaler.errors import ConfigurationError


async def test_a_machine_that_stopped_itself_backs_its_type_off_once(
    make_cloud: CloudFactory, raw_ec2: Any, clock: SteppedClock
) -> None:
    cloud = await make_cloud()
    [inst] = (await cloud.launch("m5.large", 1, {})).instances
    [pool] = (await cloud.launch("c5.large", 1, {}, pool=True)).instances
    await raw_ec2.stop_instances(InstanceIds=[inst.id, pool.id])
    listed = {i.id: i for i in await cloud.list_instances()}
    assert listed[inst.id].state in (InstanceState.STOPPING, InstanceState.STOPPED)
    [refusal] = cloud.unavailable(clock.now)  # the pool machine stopped by design: not a failure
    assert (refusal.type_name, refusal.subnet_id) == ("m5.large", inst.subnet_id)
    first_until = refusal.until
    await cloud.list_instances()  # seen again: no second strike
    assert [u.until for u in cloud.unavailable(clock.now)] == [first_until]


async def test_user_data_over_ec2s_limit_is_a_start_up_error_naming_the_type(
    make_cloud: CloudFactory,
) -> None:
    with pytest.raises(ConfigurationError, match=r"instance type c5\.large is \d+ bytes, over EC2's limit"):
        await make_cloud(
            allowed_types={"m5.large": ("ami-1", BOOT_SCRIPT), "c5.large": ("ami-1", "#" * 16000)}
        )
