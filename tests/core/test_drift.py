"""Drift and expiry (core/drift.py, docs/planning.md rule 13): an outdated machine is cordoned and
replaced first, in one plan, within the drift/expiry budget, never while do-not-disrupt holds it, and
its cordon is never undone for pending work. Plain dataclasses in, whole decisions out."""

from __future__ import annotations

import dataclasses

from tests.builders import NOW, assemble, machine, make_policy, make_task

from swarm_autoscaler.core.actions import Cordon, Launch, NodeOurs, NothingWaits, Uncordon
from swarm_autoscaler.core.budgets import DO_NOT_DISRUPT_LABEL
from swarm_autoscaler.core.drift import SPEC_LABEL
from swarm_autoscaler.core.model import Budget, NodeMarks, Policy, TypePolicy
from swarm_autoscaler.core.plan import plan

NEW_SPEC, OLD_SPEC = "new-ami-spec", "old-ami-spec"


def policy(**kw: object) -> Policy:
    types = (TypePolicy("m5.large", spec=NEW_SPEC), TypePolicy("m5.xlarge", spec=NEW_SPEC))
    return dataclasses.replace(make_policy(types), **kw)  # type: ignore[arg-type]


def busy(n: int, spec: str | None = OLD_SPEC, marks: NodeMarks = NodeMarks(ready=True)) -> tuple:  # type: ignore[type-arg]
    """A machine running one task (nothing waiting), launched with `spec` (None: before specs)."""
    task = dataclasses.replace(make_task(f"t{n}"), executing=True)
    inst, node, worker = machine(n, processing=[task], marks=marks)
    labels = {SPEC_LABEL: spec} if spec is not None else {}
    return dataclasses.replace(inst, labels=labels), node, worker


def test_a_drifted_busy_machine_is_cordoned_and_replaced_first_in_one_plan() -> None:
    result = plan(assemble(busy(1), busy(2, NEW_SPEC)), policy())
    why = f"drift: i-0001 was launched with spec {OLD_SPEC}; m5.large's is now {NEW_SPEC}"
    cordon = Cordon(
        "node-1",
        "ip-10-0-0-1",
        ("tcp://10.0.0.1:8786",),
        why,
        (NothingWaits("ip-10-0-0-1"), NodeOurs("node-1")),
        NodeMarks(ready=True, cordoned_since=NOW),
    )
    assert result.of_kind(Cordon) == (cordon,)
    # the replacement carries the current spec (every launch does)
    assert result.of_kind(Launch) == (
        Launch(
            "m5.large", 1, "1 to replace i-0001 first (drifted or expired)", labels=((SPEC_LABEL, NEW_SPEC),)
        ),
    )


def test_a_machine_from_before_specs_is_not_drifted_and_an_old_one_expires() -> None:
    assert plan(assemble(busy(1, None)), policy()).of_kind(Cordon) == ()
    old = plan(assemble(busy(1, None)), policy(max_machine_age=500.0))  # the machine is 1000 s old
    assert [c.reason for c in old.of_kind(Cordon)] == ["expiry: i-0001 is 1000s old (max_machine_age 500s)"]  # type: ignore[attr-defined]
    assert [(a.type_name, a.count) for a in old.of_kind(Launch)] == [("m5.large", 1)]  # type: ignore[attr-defined]


def test_once_cordoned_it_gets_no_second_replacement_and_stays_cordoned_under_pending_work() -> None:
    cordoned = NodeMarks(ready=True, cordoned_since=NOW - 30)
    inst, node, worker = busy(1, marks=cordoned)
    assert worker is not None
    rolling = (inst, node, dataclasses.replace(worker, retiring=True))  # cordoned: closing_gracefully
    waiting = dataclasses.replace(make_task("w"), executing=False)
    with_wait = (
        inst,
        node,
        dataclasses.replace(worker, retiring=True, processing=(*worker.processing, waiting)),
    )
    for snapshot in (
        assemble(rolling),
        assemble(rolling, unrunnable=[make_task("new")]),
        assemble(with_wait),
    ):
        result = plan(snapshot, policy())
        assert result.of_kind(Uncordon) == () and result.of_kind(Cordon) == ()
        assert all("replace i-0001" not in a.reason for a in result.of_kind(Launch))  # type: ignore[attr-defined]


def test_the_drift_budget_and_do_not_disrupt_hold_rolls() -> None:
    fleet = assemble(busy(1), busy(2), busy(3))
    one = plan(fleet, policy(budgets=(Budget(nodes=1, reasons=("drift",)),)))
    assert [c.node_id for c in one.of_kind(Cordon)] == ["node-1"]  # type: ignore[attr-defined]
    assert [(h.hostname, h.reason, h.by) for h in one.held] == [
        ("ip-10-0-0-2", "drift", "budget"),
        ("ip-10-0-0-3", "drift", "budget"),
    ]
    assert [a.count for a in one.of_kind(Launch)] == [1]  # type: ignore[attr-defined]
    inst, node, worker = busy(1)
    kept = (inst, dataclasses.replace(node, labels={DO_NOT_DISRUPT_LABEL: "true"}), worker)
    protected = plan(assemble(kept), policy())
    assert protected.of_kind(Cordon) == () and protected.of_kind(Launch) == ()
    assert [(h.reason, h.by) for h in protected.held] == [("drift", "do-not-disrupt")]


def test_an_idle_outdated_machine_is_left_to_scale_down_not_replaced() -> None:
    inst, node, worker = machine(1)
    idle = (dataclasses.replace(inst, labels={SPEC_LABEL: OLD_SPEC}), node, worker)
    result = plan(assemble(idle), policy())
    assert result.of_kind(Cordon) == () and result.of_kind(Launch) == ()


def test_at_the_maximum_only_as_many_roll_as_can_be_replaced() -> None:
    result = plan(assemble(busy(1), busy(2), busy(3)), policy(max_instances=4))
    assert len(result.of_kind(Cordon)) == 1 and [a.count for a in result.of_kind(Launch)] == [1]  # type: ignore[attr-defined]
