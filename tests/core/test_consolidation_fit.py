"""Consolidation's room check counts every task it places on a worker, not just the last one: the
mutation run on core/consolidate.py found that forgetting the earlier ones (each task checked against
the worker's whole free room) left every test green, and that cordons a worker whose tasks and the
next one cannot all fit elsewhere (a cordon undone a tick later: a flap)."""

from __future__ import annotations

import dataclasses

from tests.builders import assemble, machine, make_policy, make_task

from swarm_autoscaler.core.actions import Cordon
from swarm_autoscaler.core.model import Task
from swarm_autoscaler.core.plan import plan


def running(*cpus: float) -> tuple[Task, ...]:
    return tuple(
        dataclasses.replace(make_task(f"t{c}-{i}", cpus=c), executing=True) for i, c in enumerate(cpus)
    )


def test_two_tasks_placed_on_one_worker_both_take_its_room() -> None:
    # m5.xlarge: 4 CPUs. Worker 2 (2 of 4 CPUs used) could move its two 1-CPU tasks to worker 1, whose
    # room is 2.5 CPUs, but then worker 1 has 0.5 left: not room for the next 1.5-CPU task, and no
    # other worker has any. So nothing is cordoned. Counting only one of the two tasks, worker 1 would
    # keep 1.5 CPUs and worker 2 would be cordoned.
    snapshot = assemble(
        machine(1, "m5.xlarge", processing=running(1.5)),
        machine(2, "m5.xlarge", processing=running(1, 1)),
    )
    policy = make_policy(types=("m5.xlarge",), consolidate_below=0.5)
    assert not [a for a in plan(snapshot, policy).actions if isinstance(a, Cordon)]
    # With room for the next task left over, a worker is cordoned: the check is not just refusing.
    roomier = assemble(
        machine(1, "m5.xlarge", processing=running(0.5)),
        machine(2, "m5.xlarge", processing=running(1, 1)),
    )
    assert [a for a in plan(roomier, policy).actions if isinstance(a, Cordon)]
