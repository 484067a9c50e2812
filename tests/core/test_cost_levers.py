"""Properties of the cost levers on fleets drawn for them (`cost_fleets()`), and how often
the samples reach each lever: the cost-aware cordon across types, consolidation under load and the
per-type queue threshold. (The general planner properties run on `worlds()`, whose reach table
counts consolidation under load; fleets for the other two are rare there, so they get their own
samples and their own reach table here.)"""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import HealthCheck, given, settings
from tests.builders import Machine, assemble, machine, make_policy, make_task
from tests.core.randomized import cost_fleets, policies

from swarm_autoscaler.core.actions import Cordon, DrainNode, Launch, Plan, RetireWorkers, Terminate
from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.model import Policy, Snapshot, TypePolicy
from swarm_autoscaler.core.plan import BELOW_SURGE, plan
from swarm_autoscaler.core.recheck import Fresh, violations

SAMPLES = 300
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _cheaper(result: Plan) -> list[Cordon]:
    return [a for a in result.actions if isinstance(a, Cordon) and "cheaper machines" in a.reason]


@FAST
@given(cost_fleets(), policies())
def test_the_levers_never_touch_a_busy_machine_and_their_cordons_hold_on_their_snapshot(
    snapshot: Snapshot, policy: Policy
) -> None:
    result = plan(snapshot, policy)
    assert plan(snapshot, policy) == result
    busy = {w.hostname for w in snapshot.workers if w.busy}
    working = {w.address for w in snapshot.workers if w.processing}
    fresh = Fresh(snapshot.nodes, snapshot.workers)
    for action in result.actions:
        if isinstance(action, DrainNode):
            assert action.hostname not in busy, action
        if isinstance(action, RetireWorkers):
            assert not working & set(action.addresses), action
        if isinstance(action, Terminate):
            busy_nodes = {x.id for x in snapshot.nodes if x.hostname in busy}
            assert not busy_nodes & set(action.node_ids), action
        if isinstance(action, Cordon):
            assert violations(action, fresh) == (), action


@FAST
@given(cost_fleets(), policies())
def test_a_cost_aware_cordon_moves_only_short_unpinned_running_tasks_and_only_when_nothing_waits(
    snapshot: Snapshot, policy: Policy
) -> None:
    """Its tasks all run (none waits), none is pinned, dask expects each to end within the tolerated
    wait; nothing is pending; its type is dearer than some uncordoned worker's that stays."""
    result = plan(snapshot, policy)
    cheaper = _cheaper(result)
    if not cheaper:
        return
    assert result.pending == 0
    workers = {w.address: w for w in snapshot.workers}
    types = {m.hostname: m.type_name for m in classify(snapshot, policy).active}
    prices = {t.name: t.price_per_hour or 0.0 for t in snapshot.instance_types}
    prices |= {t.name: t.price_per_hour for t in policy.allowed_types if t.price_per_hour is not None}
    cordoned = {a for c in result.actions if isinstance(c, Cordon) for a in c.addresses}
    staying = [w for w in snapshot.workers if w.address not in cordoned and not w.retiring]
    for action in cheaper:
        for address in action.addresses:
            for task in workers[address].processing:
                assert task.executing and task.pinned_type is None, action
                assert task.started is not None and task.expected is not None, action
                assert task.started + task.expected <= snapshot.now + policy.tolerated_wait, action
        mine = prices[types[action.hostname]]
        assert any(prices[types[w.hostname]] < mine for w in staying), action


@FAST
@given(cost_fleets(), policies())
def test_a_queue_threshold_holds_back_only_a_short_queue_of_a_type_with_a_worker_up(
    snapshot: Snapshot, policy: Policy
) -> None:
    result = plan(snapshot, policy)
    held = dict(result.placed).get(BELOW_SURGE, 0)
    if not held:
        return
    thresholds = [t.surge_above for t in policy.allowed_types if t.surge_above]
    assert thresholds and held <= max(thresholds)
    up = {m.type_name for m in classify(snapshot, policy).active if m.workers and not m.cordoned}
    assert any(t.name in up and t.surge_above for t in policy.allowed_types)
    # a type held back launches nothing for pending tasks in this plan (a top-up to the minimum may)
    held_types = {t.name for t in policy.allowed_types if t.surge_above and t.name in up}
    launched = {a.type_name for a in result.actions if isinstance(a, Launch) and "pending task" in a.reason}
    assert held_types - launched, (held_types, launched)


CASES = {
    "cost-aware cordon (cheaper machines)": lambda s, p, r: bool(_cheaper(r)),
    "queue threshold holds launches back": lambda s, p, r: dict(r.placed).get(BELOW_SURGE, 0) > 0,
}
FLOORS = {"cost-aware cordon (cheaper machines)": 0.015, "queue threshold holds launches back": 0.043}


def test_the_cost_fleets_reach_every_lever() -> None:
    counts: Counter[str] = Counter()
    total = 0

    @settings(
        max_examples=SAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cost_fleets(), policies())
    def sample(snapshot: Snapshot, policy: Policy) -> None:
        nonlocal total
        total += 1
        result = plan(snapshot, policy)
        counts.update(name for name, reached in CASES.items() if reached(snapshot, policy, result))

    sample()
    rows = [(name, counts[name] / total, FLOORS[name]) for name in CASES]
    table = "\n".join(f"  {name:<40} {share:6.1%}  (floor {floor:.1%})" for name, share, floor in rows)
    print(f"\nshare of {total} cost-lever samples reaching each lever:\n{table}")
    assert not [n for n, share, floor in rows if share < floor], table


def _busy(n: int) -> Machine:
    """An m5.large whose 2 CPUs are taken by a running 2-CPU task."""
    task = dataclasses.replace(make_task(f"run-{n}", cpus=2, ram_gib=1), executing=True)
    return machine(n, processing=[task])


def test_a_held_queue_counts_whole_the_tasks_beyond_the_launch_budget_included() -> None:
    """Found by the planner property in CI: two 2-CPU tasks queued for m5.large (threshold 2, workers
    up), the budget one machine. Both wait for the workers there; before, only the one packed into the
    dropped bin was counted and the other was in no tally."""
    queued = [make_task(f"q-{i}", cpus=2, ram_gib=1, pinned="m5.large") for i in range(2)]
    policy = make_policy([TypePolicy("m5.large", surge_above=2)], max_instances=4)
    result = plan(assemble(_busy(1), _busy(2), _busy(3), unrunnable=queued), policy)
    assert result.of_kind(Launch) == ()
    assert dict(result.placed) == {BELOW_SURGE: 2} and result.pending == 2


def test_the_budget_a_held_type_leaves_goes_to_the_other_types_tasks() -> None:
    """The m5.large queue is held (threshold 2, a worker up); the m5.xlarge task gets the one launch the
    budget allows, whichever type the packing tried first."""
    queued = [make_task("q-m5", cpus=2, ram_gib=1, pinned="m5.large")]
    other = [make_task("q-xl", cpus=2, ram_gib=1, pinned="m5.xlarge")]
    types = [TypePolicy("m5.large", surge_above=2), TypePolicy("m5.xlarge")]
    for unrunnable in (queued + other, other + queued):
        result = plan(assemble(_busy(1), unrunnable=unrunnable), make_policy(types, max_instances=2))
        assert [(a.type_name, a.count) for a in result.of_kind(Launch)] == [("m5.xlarge", 1)]  # type: ignore[union-attr]
        assert dict(result.placed) == {BELOW_SURGE: 1, "new": 1}
