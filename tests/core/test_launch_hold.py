"""A launch hold (a keeper's budget stop, `Snapshot.launch_hold`): the plan adds no machine, whatever is
pending, and removes nothing busy for it; without the hold the same snapshot launches."""

from __future__ import annotations

from dataclasses import replace

from tests.builders import assemble, machine, make_policy, make_tasks

from swarm_autoscaler.core.actions import Cordon, DrainNode, Launch, RetireWorkers, Terminate
from swarm_autoscaler.core.plan import held, plan

DISRUPTIVE = (Terminate, DrainNode, RetireWorkers, Cordon)


def test_a_held_cluster_launches_nothing_for_pending_work_and_keeps_its_busy_machines() -> None:
    busy = make_tasks(2, prefix="busy", cpus=1)
    snapshot = assemble(machine(1, processing=busy), unrunnable=make_tasks(20, cpus=2))
    policy = make_policy(min_instances=0, max_instances=10)
    assert any(isinstance(a, Launch) for a in plan(snapshot, policy).actions)  # without the hold
    hold = replace(snapshot, launch_hold="wallet w1 spent its budget")
    actions = plan(hold, policy).actions
    assert not any(isinstance(a, Launch) for a in actions)
    assert not any(isinstance(a, DISRUPTIVE) for a in actions)


def test_the_held_policy_caps_the_maximum_and_minimum_at_the_machines_alive() -> None:
    snapshot = assemble(machine(1), machine(2))
    policy = make_policy(min_instances=5, max_instances=10)
    assert held(snapshot, policy) == policy
    capped = held(replace(snapshot, launch_hold="spent"), policy)
    assert (capped.min_instances, capped.max_instances) == (2, 2)
    assert not any(
        isinstance(a, Launch) for a in plan(replace(snapshot, launch_hold="spent"), policy).actions
    )
