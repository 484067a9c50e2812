"""The planner reads time only relative to `Snapshot.now`: moving every time of a snapshot by the same
skew (now, launch times, marks, task starts, back-off deadlines) moves the plan's marks by that skew
and changes no decision. With the daemon on EC2's clock (adapters/ec2_clock.py) every time it sees is
in one time base, so this is what makes a host clock off by up to an hour harmless."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.core.randomized import policies, snapshots

from swarm_autoscaler.core.actions import (
    Cordon,
    DrainNode,
    NodeUpdate,
    Plan,
    RemoveNode,
    RetireWorkers,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.clockmarks import TIME_MARKS
from swarm_autoscaler.core.model import NodeMarks, Policy, Snapshot, Task
from swarm_autoscaler.core.plan import plan

SKEWS = (-3600.0, -600.0, 600.0, 3600.0)


def _task(task: Task, d: float) -> Task:
    return task if task.started is None else dataclasses.replace(task, started=task.started + d)


def _marks(marks: NodeMarks, d: float) -> NodeMarks:
    moved = {name: getattr(marks, name) + d for name in TIME_MARKS if getattr(marks, name) is not None}
    return dataclasses.replace(marks, **moved)


def shift(snapshot: Snapshot, d: float) -> Snapshot:
    """The same world read on a clock `d` seconds off."""
    return dataclasses.replace(
        snapshot,
        now=snapshot.now + d,
        instances=tuple(dataclasses.replace(i, launched_at=i.launched_at + d) for i in snapshot.instances),
        nodes=tuple(dataclasses.replace(n, marks=_marks(n.marks, d)) for n in snapshot.nodes),
        workers=tuple(
            dataclasses.replace(w, processing=tuple(_task(t, d) for t in w.processing))
            for w in snapshot.workers
        ),
        unrunnable=tuple(_task(t, d) for t in snapshot.unrunnable),
        queued=tuple(_task(t, d) for t in snapshot.queued),
        unavailable=tuple(dataclasses.replace(u, until=u.until + d) for u in snapshot.unavailable),
    )


def shift_plan(result: Plan, d: float) -> Plan:
    def moved(action: object) -> object:
        # every action that carries a node's marks (None: unchanged)
        if (
            not isinstance(action, NodeUpdate | DrainNode | Cordon | Uncordon | Terminate)
            or action.marks is None
        ):
            return action
        return dataclasses.replace(action, marks=_marks(action.marks, d))

    return dataclasses.replace(result, actions=tuple(moved(a) for a in result.actions))  # type: ignore[misc]


def time_driven(result: Plan, now: float) -> bool:
    """A decision that depends on time: a mark stamped now, or a delay or an age that ran out."""
    disruptive = (DrainNode, RemoveNode, RetireWorkers, Terminate)
    return any(
        isinstance(a, disruptive)
        or (isinstance(a, NodeUpdate) and a.marks is not None and now in dataclasses.astuple(a.marks))
        for a in result.actions
    )


def test_a_skew_applied_to_every_time_changes_no_decision() -> None:
    reached: Counter[str] = Counter()

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(snapshots(), policies(), st.sampled_from(SKEWS))
    def check(snapshot: Snapshot, policy: Policy, skew: float) -> None:
        base = plan(snapshot, policy)
        assert plan(shift(snapshot, skew), policy) == shift_plan(base, skew)
        reached["samples"] += 1
        reached["time-driven"] += time_driven(base, snapshot.now)

    check()
    share = reached["time-driven"] / reached["samples"]
    print(f"time-driven decisions in {share:.0%} of {reached['samples']} samples")
    assert share >= 0.3
