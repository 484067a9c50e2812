"""The bookkeeping steps (core/marks.py) go through every active member, whatever the one before it
needed: the mutation run found that keeping only the last member's marks, or stopping at the first
member without a cordon mark or with a stale one, left every test green. Each would stall a fleet:
idle machines never start their drain delay, a task waiting on a cordoned worker never starts."""

from __future__ import annotations

import dataclasses

from tests.builders import NOW, assemble, machine, make_policy, make_task

from swarm_autoscaler.core.actions import NodeUpdate, Uncordon
from swarm_autoscaler.core.model import NodeMarks
from swarm_autoscaler.core.plan import plan

CORDONED = NodeMarks(ready=True, empty_since=NOW - 10, cordoned_since=NOW - 30)


def test_every_idle_member_starts_its_drain_delay() -> None:
    snapshot = assemble(machine(1), machine(2), machine(3))  # three idle workers, no mark yet
    marked = {
        a.node_id for a in plan(snapshot, make_policy()).actions if isinstance(a, NodeUpdate) and a.marks
    }
    assert marked == {"node-1", "node-2", "node-3"}


def test_a_task_waiting_on_a_cordoned_worker_uncordons_it_whatever_members_come_first() -> None:
    waiting = dataclasses.replace(make_task("w", cpus=0.5), executing=False)
    snapshot = assemble(
        machine(1, processing=(dataclasses.replace(make_task("r"), executing=True),)),  # no cordon mark
        machine(2, marks=CORDONED),  # a stale cordon mark: its worker runs again
        machine(3, processing=(waiting,), retiring=True, marks=CORDONED),  # cordoned, a task waits on it
    )
    actions = plan(snapshot, make_policy()).actions
    assert [a.node_id for a in actions if isinstance(a, Uncordon)] == ["node-3"]
    stale = [a for a in actions if isinstance(a, NodeUpdate) and a.node_id == "node-2"]
    assert stale and stale[0].marks is not None and stale[0].marks.cordoned_since is None
