"""Safety guards pinned down one by one: each test here fails on a mutant (`make mutation`) that
survived the rule tables and properties, in a condition that decides whether a busy, unowned or manager
node is touched, or in max_instances, min_instances, the reserve or a delay. The README's Reliability
section lists the mutants left alive and why each one is harmless."""

from __future__ import annotations

import pytest
from tests.builders import (
    NOW,
    assemble,
    hostname,
    machine,
    make_node,
    make_policy,
    make_snapshot,
    make_task,
    make_worker,
)

from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.model import (
    HostIdle,
    Launch,
    NodeMarks,
    NodeStatus,
    NothingWaits,
    NoWorker,
    Plan,
    Retired,
    Task,
)
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.recheck import Fresh, violated, violations

H1 = hostname(1)


# ------------------------------------------------------------------------------------------ recheck


def test_nothing_waits_on_a_host_without_worker() -> None:
    """A cordon re-checked after its worker left must not crash act (nor pass for a wrong reason)."""
    assert violated(NothingWaits(H1), Fresh((make_node(1),), ())) is None


def test_actions_without_expectations_pass_the_recheck() -> None:
    """A Launch has no `expect` field at all: nothing to check, and no crash."""
    assert violations(Launch("m5.large", 1, "why"), Fresh((), ())) == ()


def test_the_skip_reason_names_the_worker_and_counts_what_waits() -> None:
    """The reason a skipped action logs says which worker moved and how: an operator reads it."""
    one, two = make_worker(1, processing=[make_task("a")], host=H1), make_worker(2)
    fresh = Fresh((), (one,))
    assert violated(HostIdle(H1), fresh) == f"worker {H1} on {H1} has work or unique results now"
    assert violated(NoWorker(H1), fresh) == f"a worker connected on {H1} since the plan ({H1})"
    assert violated(Retired(H1), fresh) == f"the scheduler kept worker {H1} on {H1}"
    waiting = Fresh((), (make_worker(1, processing=[make_task("a"), Task("b", make_task().needs)], host=H1),))
    assert violated(NothingWaits(H1), waiting) == f"2 task(s) now wait on the worker of {H1}"
    assert violated(HostIdle(H1), Fresh((), (two,))) is None


# ------------------------------------------------------------------------------------------ capacity


def _node_without_worker(empty_since: float | None) -> Plan:
    """An accepted active node whose worker is not connected (restarting, or reactivated and starting),
    idle since `empty_since`, and one pending task that fits it."""
    node = machine(1, worker=False, marks=NodeMarks(ready=True, empty_since=empty_since))
    return plan(assemble(node, unrunnable=[make_task("t")]), make_policy(("m5.large",), max_start_time=600))


@pytest.mark.parametrize("empty_since", [None, NOW - 10, NOW - 599])
def test_a_node_whose_worker_may_still_start_is_capacity(empty_since: float | None) -> None:
    result = _node_without_worker(empty_since)
    assert dict(result.placed) == {"active": 1}
    assert not result.of_kind(Launch)


@pytest.mark.parametrize("empty_since", [NOW - 600, NOW - 5000])
def test_a_node_whose_worker_did_not_start_within_max_start_time_is_no_capacity(empty_since: float) -> None:
    result = _node_without_worker(empty_since)
    assert dict(result.placed) == {"new": 1}
    assert result.of_kind(Launch) == (Launch("m5.large", 1, _launch_reason(1, "m5.large")),)


def _launch_reason(tasks: int, type_name: str) -> str:
    return f"{tasks} pending task(s) need new capacity; cheapest fitting type: {type_name}"


# ------------------------------------------------------------------------------------------ metrics


def test_a_member_of_no_known_type_counts_as_unknown() -> None:
    """The metrics label of a node whose instance is gone and that carries no type label."""
    orphan = make_node(1, status=NodeStatus.DOWN, labels={})
    cluster = classify(make_snapshot(nodes=[orphan]), make_policy())
    assert cluster.counts_by_type() == {("disconnected", "unknown"): 1}
