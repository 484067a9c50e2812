"""Marks stamped in the future by a clock ahead of the cloud's: the delay restarts from now, so it
neither freezes until that clock is caught up nor fires early (clockmarks.py)."""

from __future__ import annotations

import pytest
from tests.builders import NOW, assemble, machine, make_policy, make_task

from swarm_autoscaler.core.actions import DrainNode, NodeUpdate, Plan, Terminate
from swarm_autoscaler.core.clockmarks import FUTURE_TOLERANCE
from swarm_autoscaler.core.model import Availability, NodeMarks, NodeStatus
from swarm_autoscaler.core.plan import plan

POLICY = make_policy(drain_delay=60, termination_delay=120, node_down_timeout=300)
AHEAD = (600.0, 3600.0)  # how far ahead the clock that wrote the mark was
RESTAMP = "mark stamped in the future (a clock ahead): delay restarts now"


def restamp(n: int, why: str = RESTAMP, **changes: float | None) -> NodeUpdate:
    """The NodeUpdate of a ready node whose marks become `changes` (it carries the whole marks)."""
    return NodeUpdate(f"node-{n}", why, NodeMarks(ready=True, **changes))  # type: ignore[arg-type]


@pytest.mark.parametrize("ahead", AHEAD)
def test_an_empty_mark_in_the_future_restarts_the_drain_delay(ahead: float) -> None:
    future = assemble(machine(1, marks=NodeMarks(ready=True, empty_since=NOW + ahead)))
    assert plan(future, POLICY) == Plan((restamp(1, empty_since=NOW),))
    # From the restamped mark: not early (59 s), and not frozen until the writer's clock (60 s).
    for elapsed, drains in ((59.0, False), (60.0, True)):
        later = assemble(machine(1, marks=NodeMarks(ready=True, empty_since=NOW)), now=NOW + elapsed)
        got = plan(later, POLICY).actions
        assert any(isinstance(a, DrainNode) for a in got) is drains, (elapsed, got)


@pytest.mark.parametrize("ahead", AHEAD)
def test_a_drained_mark_in_the_future_terminates_no_earlier(ahead: float) -> None:
    marks = NodeMarks(ready=True, drained_since=NOW + ahead)
    future = assemble(machine(1, worker=False, availability=Availability.DRAIN, marks=marks))
    assert plan(future, POLICY) == Plan((restamp(1, drained_since=NOW),))
    later = assemble(
        machine(
            1, worker=False, availability=Availability.DRAIN, marks=NodeMarks(ready=True, drained_since=NOW)
        ),
        now=NOW + 120,
    )
    assert any(isinstance(a, Terminate) for a in plan(later, POLICY).actions)


@pytest.mark.parametrize("ahead", AHEAD)
def test_a_down_mark_in_the_future_removes_the_node_no_earlier(ahead: float) -> None:
    marks = NodeMarks(ready=True, down_since=NOW + ahead)
    future = assemble(machine(1, worker=False, status=NodeStatus.DOWN, marks=marks))
    assert plan(future, POLICY) == Plan((restamp(1, down_since=NOW),))
    later_marks = NodeMarks(ready=True, down_since=NOW)
    later = assemble(machine(1, worker=False, status=NodeStatus.DOWN, marks=later_marks), now=NOW + 300)
    # down past node_down_timeout: one Terminate that removes the node too
    got = plan(later, POLICY).actions
    assert any(isinstance(a, Terminate) and a.node_ids == ("node-1",) for a in got), got


def test_every_future_mark_of_a_node_is_restamped_in_one_action() -> None:
    marks = NodeMarks(ready=True, termination_started=NOW + 3600, cordoned_since=NOW + 3600)
    got = plan(assemble(machine(1, retiring=True, marks=marks)), POLICY)
    # terminating (the mark says so) and not yet stuck: only the restamp
    assert got == Plan((restamp(1, termination_started=NOW, cordoned_since=NOW),))


def test_a_mark_slightly_ahead_is_left_alone() -> None:
    """Two replicas' readings of EC2's clock differ by a second or so: no churn for that."""
    marks = NodeMarks(ready=True, empty_since=NOW + FUTURE_TOLERANCE)
    assert plan(assemble(machine(1, marks=marks)), POLICY) == Plan()


def test_a_later_decision_on_the_node_overrides_the_restamp() -> None:
    """A node with work again clears its empty mark, wherever that mark pointed."""
    busy = machine(1, processing=[make_task("t1")], marks=NodeMarks(ready=True, empty_since=NOW + 3600))
    got = plan(assemble(busy), POLICY)
    assert got.actions == (restamp(1, f"{RESTAMP}; has work again", empty_since=None),)
