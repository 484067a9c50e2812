"""The EC2 adapter against the strict local EC2 (`localcloud.ec2_strict`), each rule standing in for what
EC2 does and moto does not: a new instance unknown to DescribeInstances and CreateTags for a moment
(eventual consistency), RequestLimitExceeded above a request rate, a zone with room for only so many
machines of a type, a vCPU quota per instance family, and user data that must be base64 of at most
16 KiB. The adapter's tests all run with the strict EC2's throttling, zone capacity and user-data rules
on (`conftest.moto_server`); these turn on each of the others."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError
from tests.adapters.ec2.ec2_helpers import BOOT_SCRIPT, CloudFactory, wire
from tests.fakes import FakeWorkload, SteppedClock

from swarm_autoscaler.adapters.ec2_launch import quota_name
from swarm_autoscaler.adapters.ec2_support import HOSTNAME_TAG
from swarm_autoscaler.core.actions import Launch
from swarm_autoscaler.core.model import GIB, Policy, Resources, Task, TypePolicy
from swarm_autoscaler.daemon.loop import InFlightCloud
from swarm_autoscaler.daemon.tick import ActConfig, Ports, run_tick
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, StrictEc2
from swarm_autoscaler_lab.localcloud.ec2_strict import running_now as running
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

TYPE = "m5.large"
GPU = "g4dn.xlarge"  # 4 vCPUs, in the "G and VT" quota


@pytest.fixture
def strict(faults: FaultInjector) -> Iterator[Any]:
    """Sets a stricter EC2 for one test, then puts the suite's back."""
    before = faults.strict

    def use(**rules: Any) -> StrictEc2:
        faults.be_strict(StrictEc2(**rules))
        assert faults.strict is not None
        return faults.strict

    yield use
    faults.be_strict(before)


async def test_a_new_instance_is_unknown_to_create_tags_for_a_moment(
    make_cloud: CloudFactory, strict: Any
) -> None:
    strict(invisible_s=0.3)
    cloud = await make_cloud(retry_initial=0.05, retry_max=1.0)
    (instance,) = (await cloud.launch(TYPE, 1, {})).instances
    # CreateTags of the hostname was answered NotFound, then retried until EC2 knew the id
    assert cloud.stats.new_id_not_found >= 1 and cloud.stats.hostname_tag_failures == 0
    (listed,) = [i for i in await cloud.list_instances() if i.id == instance.id]
    assert listed.tags[HOSTNAME_TAG] == instance.hostname


async def test_a_new_instance_is_missing_from_listings_for_a_moment_and_the_loop_still_counts_it(
    make_cloud: CloudFactory, network: LocalNetwork, strict: Any
) -> None:
    rules = strict(invisible_s=0.5)
    cloud = await make_cloud(allowed_types={TYPE: (network.ami_id, "")})
    cloud._tag_hostname = _no_hostname_tag  # type: ignore[method-assign]  # launch returns at once
    in_flight = InFlightCloud(cloud)
    (instance,) = (await in_flight.launch(TYPE, 1, {})).instances
    assert instance.id not in {i.id for i in await cloud.list_instances()} and rules.hidden >= 1
    assert instance.id in {i.id for i in await in_flight.list_instances()}  # counted: no second launch
    await asyncio.sleep(0.6)
    assert instance.id in {i.id for i in await cloud.list_instances()}


async def _no_hostname_tag(instance: object) -> None:
    """Stands in for the adapter's best-effort hostname tag, so that the listing comes right after
    RunInstances, as the next tick's can on a loaded EC2."""


async def test_throttling_above_a_rate_is_retried_and_counted(make_cloud: CloudFactory, strict: Any) -> None:
    # 12 requests at once against a bucket of 3 refilled at 2 a second: they need 4.5 s to go through,
    # far more than a loaded machine takes to send them (at 20 a second, a loaded CI machine once sent
    # them slowly enough that none was throttled), and the retries allow up to ~10 s.
    rules = strict(rate=2.0, burst=3.0)
    cloud = await make_cloud(retry_attempts=12, retry_initial=0.1, retry_max=1.0)
    await asyncio.gather(*(cloud.list_instances() for _ in range(12)))
    assert rules.throttled > 0 and cloud.stats.throttled["DescribeInstances"] == rules.throttled


async def test_a_zone_with_room_for_two_gives_two_and_the_rest_goes_elsewhere(
    make_cloud: CloudFactory, network: LocalNetwork, strict: Any
) -> None:
    strict(zone_capacity=2)
    only = "m6i.large"  # launched by no other test: each zone's room is for this test alone
    cloud = await make_cloud(allowed_types={only: (network.ami_id, BOOT_SCRIPT)}, spread_subnets=False)
    first = await cloud.launch(only, 5, {})
    assert sorted(i.subnet_id for i in first.instances).count(network.subnet_ids[0]) == 2
    assert len(first.instances) == 5 and cloud.stats.partial_launches == 2  # 2 + 2 + 1
    more = await cloud.launch(only, 3, {})
    assert len(more.instances) == 1 and more.refused  # only the third zone had room left


async def test_a_vcpu_quota_gives_what_fits_then_says_which_quota_to_raise(
    make_cloud: CloudFactory, network: LocalNetwork, strict: Any
) -> None:
    quota = "Running On-Demand G and VT instances"
    used = sum(v for t, _, v in running("us-east-1") if quota_name(t, "on-demand") == quota)  # earlier tests'
    strict(vcpu_quotas={quota: used + 8})  # room for two more g4dn.xlarge
    cloud = await make_cloud(allowed_types={GPU: (network.ami_id, BOOT_SCRIPT)}, spread_subnets=False)
    result = await cloud.launch(GPU, 3, {})
    assert len(result.instances) == 2 and result.error is None
    assert cloud.stats.quota_refusals == {(GPU, "on-demand", "VcpuLimitExceeded"): 1}
    assert {u.subnet_id for u in result.refused} == set(network.subnet_ids)  # no zone can help


async def test_user_data_must_be_base64_of_at_most_16_kib(
    make_cloud: CloudFactory, network: LocalNetwork, raw_ec2: Any, strict: Any
) -> None:
    strict()
    base = {"ImageId": network.ami_id, "InstanceType": TYPE, "MinCount": 1, "MaxCount": 1}
    with pytest.raises(ClientError, match="limited to 16384 bytes"):
        await raw_ec2.run_instances(**base, UserData="x" * (16 * 1024 + 1))  # botocore base64-encodes it
    # what the adapter sends passes, and a boot script too long for EC2 never leaves the process
    cloud = await make_cloud()
    assert len((await cloud.launch(TYPE, 1, {})).instances) == 1
    # refused at start-up, naming the type (adapters.boot_scripts.check_user_data), before any launch
    with pytest.raises(
        ConfigurationError, match=rf"instance type {TYPE} is \d+ bytes, over EC2's limit of 16384"
    ):
        await make_cloud(allowed_types={TYPE: (network.ami_id, "echo " + "x" * 17000)})


async def test_a_quota_refusal_falls_through_to_the_next_type_in_the_same_tick(
    make_cloud: CloudFactory, network: LocalNetwork, strict: Any, clock: SteppedClock
) -> None:
    """Stands in for EC2's VcpuLimitExceeded when the account's Standard on-demand vCPU quota is used up
    (a new account's is small): the cheapest fit (m5.large) is refused at once in every zone, and a type
    counted against another quota (x2iedn.xlarge, the X family's) is launched in the same tick, not a
    tick later. Checked at the wire: the RunInstances requests botocore sent, in order."""
    standard = quota_name(TYPE, "on-demand")
    used = sum(v for t, _, v in running("us-east-1") if quota_name(t, "on-demand") == standard)
    rules = strict(vcpu_quotas={standard: used})  # no room left for one more Standard machine
    other = "x2iedn.xlarge"
    cloud = await make_cloud(allowed_types={n: (network.ami_id, BOOT_SCRIPT) for n in (TYPE, other)})
    sent = wire(cloud, "RunInstances")
    described = {t.name: t for t in await cloud.instance_types([TYPE, other])}
    catalogue = {  # the test's own prices: the cheapest fit is m5.large
        TYPE: dataclasses.replace(described[TYPE], price_per_hour=0.096),
        other: dataclasses.replace(described[other], price_per_hour=0.667),
    }
    policy = Policy(
        allowed_types=(TypePolicy(TYPE), TypePolicy(other)),
        min_instances=0,
        max_instances=5,
        max_start_time=300,
        drain_delay=30,
        termination_delay=60,
        subnets=tuple(network.subnet_ids),  # a type is out once every one of them refused it
    )
    workload = FakeWorkload(unrunnable=[Task("job", Resources.of(1.0, 2 * GIB))])
    ports = Ports(InFlightCloud(cloud), MemorySwarm(), workload)

    result = await run_tick(ports, policy, catalogue, clock(), config=ActConfig(cloud.cluster_name))

    assert [(p["InstanceType"], p["MinCount"]) for p in sent] == [(TYPE, "1"), (other, "1")]
    assert rules.over_quota == 1 and cloud.stats.quota_refusals == {
        (TYPE, "on-demand", "VcpuLimitExceeded"): 1
    }
    launched = [o for o in result.outcomes if isinstance(o.action, Launch)]
    assert [(o.action.type_name, o.ok, o.kind) for o in launched] == [
        (TYPE, False, "capacity"),
        (other, True, ""),
    ]
    assert [i.type_name for i in await ports.cloud.list_instances()] == [other]  # counted: no second launch
