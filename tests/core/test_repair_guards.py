"""Repair's guards that the mutation run on the merged planner (core/shrink.py) found without a test:
which re-check a broken machine's termination carries, and that the node of a machine whose
termination was asked is removed only once EC2 is really shutting the instance down."""

from __future__ import annotations

import dataclasses

from tests.builders import NOW, assemble, hostname, machine, make_policy

from swarm_autoscaler.core.actions import HostIdle, NodeOurs, NoWorker, RemoveNode, Terminate
from swarm_autoscaler.core.model import InstanceState, NodeMarks, NodeStatus
from swarm_autoscaler.core.plan import plan


def test_a_stopped_machine_whose_idle_worker_is_still_listed_is_terminated_only_while_it_stays_idle() -> None:
    inst, node, worker = machine(1)
    stopped = dataclasses.replace(
        inst, state=InstanceState.STOPPED
    )  # no pool: ended, whatever its worker does
    (end,) = [
        a for a in plan(assemble((stopped, node, worker)), make_policy()).actions if isinstance(a, Terminate)
    ]
    assert end.reason.startswith("stopped outside the warm pool")
    # Its worker is re-checked as idle right before the termination; "no worker" would never hold for it.
    assert end.expect == (HostIdle(hostname(1)), NodeOurs(node.id))
    assert NoWorker(hostname(1)) not in end.expect


def test_the_node_of_a_machine_whose_termination_was_asked_stays_while_its_instance_runs() -> None:
    marks = NodeMarks(ready=True, termination_started=NOW - 10)  # asked 10 s ago, not yet stuck
    inst, node, _ = machine(1, worker=False, status=NodeStatus.DOWN, marks=marks)
    policy = make_policy()
    running = plan(assemble((inst, node, None)), policy).actions
    assert not any(isinstance(a, RemoveNode) for a in running)  # EC2 may still refuse: it can come back
    shutting = dataclasses.replace(inst, state=InstanceState.SHUTTING_DOWN)
    going = plan(assemble((shutting, node, None)), policy).actions
    assert [a.node_id for a in going if isinstance(a, RemoveNode)] == [node.id]
