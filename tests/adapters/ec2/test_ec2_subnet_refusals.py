"""A type EC2 refuses in one subnet, over the moto server with the fault injector: the adapter launches
it in the other subnets and reports the one refused pair, and the planner, fed the adapter's
`unavailable`, keeps planning that type until every subnet refuses it."""

from __future__ import annotations

from dataclasses import replace

from tests.adapters.ec2.ec2_helpers import CloudFactory
from tests.builders import make_policy, make_snapshot, make_tasks
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.core.actions import Launch, Plan
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import Unavailable
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork

CHEAP, DEAR = "c5.large", "m5.large"  # $0.085/h and $0.096/h; a 1-CPU 1-GiB task fits either


def planned(cloud: Ec2Cloud, network: LocalNetwork, now: float) -> list[str]:
    """The types a plan launches for one pending task, given what the adapter reports refused."""
    policy = replace(make_policy(types=(CHEAP, DEAR)), subnets=network.subnet_ids)
    snapshot = make_snapshot(
        unrunnable=make_tasks(1),
        types=[CATALOGUE[CHEAP], CATALOGUE[DEAR]],
        unavailable=cloud.unavailable(now),
        now=now,
    )
    result: Plan = plan(snapshot, policy)
    return [a.type_name for a in result.actions if isinstance(a, Launch)]


async def test_a_type_refused_in_one_subnet_stays_in_the_plan_and_launches_elsewhere(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    first, *others = network.subnet_ids
    faults.refuse(CHEAP, subnet_id=first)
    cloud = await make_cloud()
    assert planned(cloud, network, clock.now) == [CHEAP]

    result = await cloud.launch(CHEAP, 1, {})
    assert [i.subnet_id for i in result.instances] == [others[0]]
    assert [(u.type_name, u.subnet_id) for u in result.refused] == [(CHEAP, first)]
    assert planned(cloud, network, clock.now) == [CHEAP]  # not the dearer type: other subnets are open

    calls = faults.calls().get("RunInstances", 0)
    again = await cloud.launch(CHEAP, 2, {})
    assert {i.subnet_id for i in again.instances} == set(others) and again.refused == ()
    assert faults.calls()["RunInstances"] == calls + 2  # straight to the open subnets, one machine each


async def test_a_type_refused_in_every_subnet_leaves_the_plan_until_one_reopens(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    faults.refuse(CHEAP)  # every subnet
    cloud = await make_cloud(capacity_backoff_initial=30.0)
    result = await cloud.launch(CHEAP, 1, {})
    assert result.instances == ()
    assert {u.subnet_id for u in result.refused} == set(network.subnet_ids)
    assert planned(cloud, network, clock.now) == [DEAR]
    assert all(isinstance(u, Unavailable) and u.until == clock.now + 30.0 for u in result.refused)
    clock.step(30.0)
    assert planned(cloud, network, clock.now) == [CHEAP]
