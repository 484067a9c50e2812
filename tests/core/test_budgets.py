"""Disruption budgets and do-not-disrupt (core/budgets.py, docs/planning.md rule 12): the one gate
every voluntary disruption passes. Plain dataclasses in, whole decisions out."""

from __future__ import annotations

import dataclasses
import time

from tests.builders import NOW, assemble, hostname, machine, make_policy, make_task

from swarm_autoscaler.core.actions import Cordon, DrainNode, Held, NodeUpdate, RetireWorkers, Terminate
from swarm_autoscaler.core.budgets import DO_NOT_DISRUPT_LABEL, allowed, in_window
from swarm_autoscaler.core.model import Availability, Budget, NodeMarks, Policy
from swarm_autoscaler.core.plan import plan

LONG_EMPTY = NodeMarks(ready=True, empty_since=NOW - 1000)


def idle_fleet(n: int) -> tuple:  # type: ignore[type-arg]
    return tuple(machine(k, marks=LONG_EMPTY) for k in range(1, n + 1))


def budgeted(*budgets: Budget) -> Policy:
    return dataclasses.replace(make_policy(), budgets=budgets)


def disrupted(result: object) -> list[str]:
    """The hosts whose drain the plan starts."""
    return [a.hostname for a in result.actions if isinstance(a, DrainNode)]  # type: ignore[attr-defined]


def test_without_budgets_every_idle_machine_is_scaled_down() -> None:
    result = plan(assemble(*idle_fleet(4)), make_policy())
    assert len(disrupted(result)) == 4 and result.held == ()


def test_a_count_budget_starts_that_many_and_holds_the_rest_with_their_marks() -> None:
    result = plan(assemble(*idle_fleet(4)), budgeted(Budget(nodes=1)))
    assert disrupted(result) == [hostname(1)]
    assert [a.addresses for a in result.of_kind(RetireWorkers)] == [(a,) for a in ["tcp://10.0.0.1:8786"]]  # type: ignore[attr-defined]
    why = "the empty budget allows 1 machine(s) in disruption at once; 1 already are"
    empty = tuple(h for h in result.held if h.reason == "empty")
    assert empty == tuple(Held(hostname(k), "empty", "budget", why) for k in (2, 3, 4))
    # (consolidation then picks idle ones to cordon: the same budget, all reasons, holds them)
    assert {(h.reason, h.by) for h in result.held if h.reason != "empty"} <= {("consolidation", "budget")}
    assert result.of_kind(Cordon) == ()
    # a held machine's drained mark is held with it: no NodeUpdate says it was drained
    drained = [a for a in result.of_kind(NodeUpdate) if a.marks is not None and a.marks.drained_since]  # type: ignore[attr-defined]
    assert drained == []


def test_a_share_budget_rounds_up_and_counts_machines_already_in_disruption() -> None:
    drained = machine(
        5, worker=False, availability=Availability.DRAIN, marks=NodeMarks(True, drained_since=NOW - 5)
    )
    result = plan(assemble(*idle_fleet(4), drained), budgeted(Budget(share=0.5)))
    # 50% of 5 nodes is 2.5 -> 3 in disruption at once; the drained one counts: 2 more start
    assert disrupted(result) == [hostname(1), hostname(2)]
    assert [h.hostname for h in result.held if h.reason == "empty"] == [hostname(3), hostname(4)]
    assert result.of_kind(Cordon) == ()  # the budget is spent: consolidation starts nothing either


def test_continuing_a_counted_disruption_is_never_held() -> None:
    """A drained machine past termination_delay is terminated even with a budget of 0 (the budget bounds
    starts; this one is already in disruption and only costs money held)."""
    drained = machine(
        1, worker=False, availability=Availability.DRAIN, marks=NodeMarks(True, drained_since=NOW - 500)
    )
    result = plan(assemble(drained, *idle_fleet(0)), budgeted(Budget(nodes=0)))
    assert [a.instance_ids for a in result.of_kind(Terminate)] == [("i-0001",)]  # type: ignore[attr-defined]


def test_the_smallest_active_budget_for_the_reason_wins_and_windows_apply_in_utc() -> None:
    t = time.gmtime(NOW)
    now_s = t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec
    inside = Budget(nodes=0, start=now_s - 60, end=now_s + 60, days=(t.tm_wday,))
    outside = Budget(nodes=0, start=now_s + 60, end=now_s + 120)
    other_day = Budget(nodes=0, days=((t.tm_wday + 1) % 7,))
    assert in_window(inside, NOW) and not in_window(outside, NOW) and not in_window(other_day, NOW)
    policy = budgeted(Budget(nodes=3), Budget(share=0.5), inside, outside, other_day)
    assert allowed(policy, "empty", 4, NOW) == 0
    assert allowed(budgeted(Budget(nodes=3), Budget(share=0.5)), "empty", 4, NOW) == 2
    assert allowed(budgeted(Budget(nodes=0, reasons=("drift",))), "empty", 4, NOW) is None
    assert disrupted(plan(assemble(*idle_fleet(2)), budgeted(outside, other_day))) == [
        hostname(1),
        hostname(2),
    ]
    assert disrupted(plan(assemble(*idle_fleet(2)), budgeted(inside))) == []


def test_a_node_labelled_do_not_disrupt_is_never_scaled_down() -> None:
    inst, node, worker = machine(1, marks=LONG_EMPTY)
    kept = (inst, dataclasses.replace(node, labels={**node.labels, DO_NOT_DISRUPT_LABEL: "true"}), worker)
    result = plan(assemble(kept, machine(2, marks=LONG_EMPTY)), make_policy())
    assert disrupted(result) == [hostname(2)]
    assert result.held == (
        Held(hostname(1), "empty", "do-not-disrupt", f"its node carries {DO_NOT_DISRUPT_LABEL}=true"),
    )


def test_a_worker_running_a_do_not_disrupt_task_is_never_consolidated() -> None:
    """Two m5.xlarge workers each a quarter used: consolidation cordons one (the control); with the
    tasks annotated do_not_disrupt, none, and the plan says which it held."""

    def light(n: int, keep: bool) -> tuple:  # type: ignore[type-arg]
        task = dataclasses.replace(make_task(f"t{n}"), executing=True, do_not_disrupt=keep)
        return machine(n, "m5.xlarge", processing=[task])

    control = plan(assemble(light(1, False), light(2, False)), make_policy())
    assert len(control.of_kind(Cordon)) == 1
    kept = plan(assemble(light(1, True), light(2, True)), make_policy())
    assert kept.of_kind(Cordon) == ()
    assert [(h.reason, h.by) for h in kept.held] == [("consolidation", "do-not-disrupt")]
    assert "annotated do_not_disrupt (t" in kept.held[0].why
