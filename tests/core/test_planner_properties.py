"""Invariants of plan() over random snapshots and policies (hypothesis)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from tests.builders import NOW, assemble, machine, make_policy
from tests.core.randomized import apply, clone, policies, worlds

from swarm_autoscaler.core.actions import (
    ActivateNode,
    Cordon,
    DrainNode,
    HostIdle,
    Launch,
    NodeUpdate,
    Plan,
    RemoveNode,
    Retired,
    RetireWorkers,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.cluster import Bucket, allowed, classify
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Availability, NodeMarks, Policy, Snapshot, TypePolicy
from swarm_autoscaler.core.plan import plan, plan_traced
from swarm_autoscaler.core.recheck import Fresh, violations
from swarm_autoscaler.core.vectors import fits, plus

# 80 examples, or fewer when the loaded profile asks for fewer (`make mutation` runs every property once
# per mutant: see tests/conftest.py).
FAST = settings(
    max_examples=min(80, settings.default.max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def launched(result: Plan) -> int:
    return sum(a.count for a in result.actions if isinstance(a, Launch))


@FAST
@given(worlds(), policies())
def test_deterministic_and_inputs_untouched(snapshot: Snapshot, policy: Policy) -> None:
    before = repr((snapshot, policy))
    first = plan(snapshot, policy)
    assert repr((snapshot, policy)) == before
    assert plan(clone(snapshot), policy) == first
    assert plan_traced(snapshot, policy)[0] == first


@FAST
@given(worlds(), policies())
def test_never_above_the_maximum(snapshot: Snapshot, policy: Policy) -> None:
    result = plan(snapshot, policy)
    alive = sum(1 for i in snapshot.instances if i.alive)
    if launched(result):
        assert alive + launched(result) <= policy.max_instances
    if policy.max_launch_per_tick:
        assert launched(result) <= policy.max_launch_per_tick


@FAST
@given(worlds(), policies())
def test_never_drains_retires_or_terminates_a_busy_node(snapshot: Snapshot, policy: Policy) -> None:
    """No machine with a task, or with the only copy of a result, is drained, removed or terminated;
    no worker with a task is retired. A worker holding results only may be retired (dask's
    `retire_workers` moves them first, keeping the worker when it cannot), and its node drained in the
    same plan only expecting it retired and idle (re-checked after the retirement)."""
    result = plan(snapshot, policy)
    busy_hosts = {w.hostname for w in snapshot.workers if w.busy}
    working = {w.address for w in snapshot.workers if w.processing}
    retired = {a for r in result.actions if isinstance(r, RetireWorkers) for a in r.addresses}
    host_of = {i.id: i.hostname for i in snapshot.instances} | {n.id: n.hostname for n in snapshot.nodes}
    for action in result.actions:
        match action:
            case DrainNode(hostname=host, expect=expect) if host in busy_hosts:
                on_host = [w for w in snapshot.workers if w.hostname == host]
                assert all(w.holding and w.address in retired for w in on_host), action
                assert {HostIdle(host), Retired(host)} <= set(expect), action
            case RemoveNode(hostname=host):
                assert host not in busy_hosts, action
            case Terminate(instance_ids=ids, node_ids=node_ids):
                assert not {host_of[k] for k in (*ids, *node_ids)} & busy_hosts, action
            case RetireWorkers(addresses=addresses):
                assert not working & set(addresses), action


ROLLED = ("drift:", "expiry:")


def _replaced_first(cordon: Cordon) -> bool:
    return cordon.reason.startswith(ROLLED) or "recommends rebalancing" in cordon.reason


@FAST
@given(worlds(), policies())
def test_cordons_only_while_nothing_waits(snapshot: Snapshot, policy: Policy) -> None:
    """A worker is cordoned only when the plan launches, activates and uncordons nothing (nothing is
    pending, or all of it was placed on capacity that is up), only if every task on it is executing (a
    waiting task would never start), and never the last uncordoned worker of its type, unless cheaper
    machines take its tasks (the cost-aware pass), none of which is pinned to its type."""
    result = plan(snapshot, policy)
    cordons = [a for a in result.actions if isinstance(a, Cordon)]
    # A drifted or expired machine is cordoned with its replacement launched in the same plan, and a
    # machine EC2 recommends rebalancing is cordoned with one launched early (docs/planning.md): those
    # cordons come with launches by design. A roll's replacement is of the rolled machine's type.
    rolls = [c for c in cordons if _replaced_first(c)]
    cordons = [c for c in cordons if not _replaced_first(c)]
    launched = {a.type_name for a in result.actions if isinstance(a, Launch)}
    type_of = {m.hostname: m.type_name for m in classify(snapshot, policy).active}
    for roll in rolls:
        if roll.reason.startswith(ROLLED):
            assert type_of[roll.hostname] in launched, roll
    if not cordons:
        return
    moving = (ActivateNode, Uncordon) if rolls else (Launch, ActivateNode, Uncordon)
    assert not any(isinstance(a, moving) for a in result.actions)
    assert policy.consolidate_below > 0
    workers = {w.address: w for w in snapshot.workers}
    for action in cordons:
        for address in action.addresses:
            assert all(t.executing for t in workers[address].processing), action
            if "cheaper machines" in action.reason:
                assert not any(t.pinned_type for t in workers[address].processing), action
    cordoned = {a for c in cordons for a in c.addresses if "cheaper machines" not in c.reason}
    cluster = classify(snapshot, policy)
    for type_name in {m.type_name for m in cluster.active}:
        mine = [
            w.address
            for m in cluster.active
            if m.type_name == type_name and not m.cordoned
            for w in m.workers
        ]
        if any(a in cordoned for a in mine):
            assert any(a not in cordoned for a in mine), type_name


@FAST
@given(worlds(), policies())
def test_never_touches_unowned_or_manager_nodes(snapshot: Snapshot, policy: Policy) -> None:
    cluster = classify(snapshot, policy)
    untouchable = {m.node.id for m in (*cluster.unowned, *cluster.manager) if m.node is not None}
    for action in plan(snapshot, policy).actions:
        node_ids = set(getattr(action, "node_ids", ())) | {getattr(action, "node_id", "")}
        assert not node_ids & untouchable, action


@FAST
@given(worlds(), policies())
def test_never_touches_a_node_that_is_not_ours_or_a_manager(snapshot: Snapshot, policy: Policy) -> None:
    """Only nodes of ours are drained, cordoned, uncordoned, activated or removed, and only their workers
    retired: nodes carrying our ownership label (`Node.ours`), or whose hostname matches one of our
    instances (EC2 tags prove those; planning rule 8 of docs/planning.md: such a node gets the label in the same
    plan, and act re-checks the label before a drain). Never a manager, never a node that is neither."""
    nodes = {n.id: n for n in snapshot.nodes}
    owned_hosts = {i.hostname for i in snapshot.instances}
    ours = {n.id for n in snapshot.nodes if (n.ours or n.hostname in owned_hosts) and not n.is_manager}
    ours_hosts = {nodes[i].hostname for i in ours}
    host_of = {i.id: i.hostname for i in snapshot.instances}
    for action in plan(snapshot, policy).actions:
        match action:
            case (
                DrainNode(node_id=node_id)
                | Cordon(node_id=node_id)
                | Uncordon(node_id=node_id)
                | ActivateNode(node_id=node_id)
                | RemoveNode(node_id=node_id)
            ):
                assert node_id in ours, action
            case RetireWorkers(addresses=addresses):
                hosts = {w.hostname for w in snapshot.workers if w.address in addresses}
                assert hosts <= ours_hosts, action
            case Terminate(instance_ids=ids, node_ids=node_ids):
                hosts = {host_of[i] for i in ids}
                for node_id in node_ids:
                    node = nodes[node_id]
                    assert node_id in ours or (node.hostname in hosts and not node.is_manager), action


DISRUPTIVE = (Terminate, DrainNode, RemoveNode, RetireWorkers, Cordon)


def test_every_disruptive_action_carries_expectations_that_hold_on_its_snapshot() -> None:
    """Each disruptive action states what must still hold when it runs (`expect`, re-checked by `act`
    right before it); on the very snapshot it was planned on, after the plan's gentle actions (labels),
    all of it holds. `Retired` checks are left out: they hold only after the plan's own RetireWorkers
    step.

    Not vacuous: every kind of disruptive action the samples reach must carry expectations in at least
    some samples (the planner fills them; until it does, this test fails)."""
    reached: Counter[str] = Counter()
    expecting: Counter[str] = Counter()

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(worlds(), policies())
    def sample(snapshot: Snapshot, policy: Policy) -> None:
        actions = plan(snapshot, policy).actions
        # act re-checks after the plan's gentle actions: a NodeUpdate carrying the ownership label has
        # made its node ours by then
        claimed = {
            a.node_id for a in actions if isinstance(a, NodeUpdate) and OWNERSHIP_LABEL in dict(a.labels)
        }
        nodes = tuple(dataclasses.replace(n, ours=True) if n.id in claimed else n for n in snapshot.nodes)
        fresh = Fresh(nodes, snapshot.workers)
        # act reads again after its retirements: the retired workers have left (their results moved)
        gone = {a for r in actions if isinstance(r, RetireWorkers) for a in r.addresses}
        after = Fresh(nodes, tuple(w for w in snapshot.workers if w.address not in gone))
        for action in actions:
            if not isinstance(action, DISRUPTIVE):
                continue
            kind = type(action).__name__
            reached[kind] += 1
            expecting[kind] += bool(action.expect)
            before_retire = dataclasses.replace(
                action, expect=tuple(c for c in action.expect if not isinstance(c, Retired))
            )
            assert violations(before_retire, fresh if isinstance(action, RetireWorkers) else after) == (), (
                action
            )

    sample()
    table = "\n".join(
        f"  {kind:<14} {expecting[kind]:4}/{n:<4} carry expectations" for kind, n in reached.items()
    )
    print(f"\ndisruptive actions sampled:\n{table}")
    assert set(reached) == {k.__name__ for k in DISRUPTIVE}, table
    assert all(expecting[kind] for kind in reached), f"actions planned without expectations:\n{table}"


@FAST
@given(worlds(), policies())
def test_every_placement_fits(snapshot: Snapshot, policy: Policy) -> None:
    _, trace = plan_traced(snapshot, policy)
    used: dict[str, tuple[float, ...]] = {}
    for key, gi, n in trace.placements:
        group = trace.groups[gi]
        type_name, _ = trace.bins[key]
        assert group.pinned in (None, type_name)
        used[key] = plus(used.get(key, trace.space.zero), group.vec, n)
    for key, total in used.items():
        assert fits(total, trace.bins[key][1]), (key, total)
    for bins in trace.new:
        total = trace.space.zero
        for gi, n in bins.pattern:
            assert trace.groups[gi].pinned in (None, bins.type_name)
            total = plus(total, trace.groups[gi].vec, n)
        assert fits(total, trace.capacity[bins.type_name])


@FAST
@given(worlds(), policies())
def test_pending_work_that_fits_gets_capacity_unless_the_maximum_is_reached(
    snapshot: Snapshot, policy: Policy
) -> None:
    result = plan(snapshot, policy)
    alive = sum(1 for i in snapshot.instances if i.alive)
    at_max = alive + launched(result) >= policy.max_instances or (
        policy.max_launch_per_tick and launched(result) >= policy.max_launch_per_tick
    )
    refused = any(u.until > snapshot.now for u in snapshot.unavailable)
    if not at_max and not refused:
        assert sum(n for _, n in result.placed) + len(result.unplaceable) == result.pending


def _launched_for_the_minimum_beside_a_drained_machine() -> tuple[Snapshot, Policy]:
    """The case the guard "never launch and terminate the same type" decides: min_instances=3 over two
    m5.large (one drained long ago), and an empty g4dn reserve. The plan launches one m5.large for the
    minimum and one g4dn for the reserve; counting both as live, the drained m5.large looks surplus."""
    snapshot = assemble(
        machine(1, marks=NodeMarks(ready=True, drained_since=NOW - 1000), availability=Availability.DRAIN),
        machine(2, marks=NodeMarks(ready=True, empty_since=NOW - 10)),
    )
    types = (TypePolicy("m5.large"), TypePolicy("g4dn.xlarge", reserve=1))
    return snapshot, make_policy(types, min_instances=3)


def test_a_type_launched_for_the_minimum_is_not_terminated_in_the_same_plan() -> None:
    """Without the guard the plan launches an m5.large and terminates one: churn for nothing."""
    snapshot, policy = _launched_for_the_minimum_beside_a_drained_machine()
    result = plan(snapshot, policy)
    assert {(a.type_name, a.count) for a in result.of_kind(Launch)} == {("m5.large", 1), ("g4dn.xlarge", 1)}  # type: ignore[union-attr]
    assert not result.of_kind(Terminate), result.actions


@FAST
@example(*_launched_for_the_minimum_beside_a_drained_machine())
@given(worlds(), policies())
def test_scale_down_never_terminates_a_type_it_launches(snapshot: Snapshot, policy: Policy) -> None:
    result = plan(snapshot, policy)
    types = {i.id: i.type_name for i in snapshot.instances}
    launching = {a.type_name for a in result.actions if isinstance(a, Launch)}
    for action in result.actions:
        if isinstance(action, Terminate) and action.reason.startswith("drained"):
            assert not {types[i] for i in action.instance_ids} & launching


@FAST
@given(worlds(), policies())
def test_every_transition_the_plan_causes_is_in_the_table(snapshot: Snapshot, policy: Policy) -> None:
    result = plan(snapshot, policy)
    before = classify(snapshot, policy).bucket_of()
    after = classify(apply(snapshot, result), policy).bucket_of()
    for key, bucket in before.items():
        assert allowed(bucket, after.get(key, Bucket.GONE)), (key, bucket, after.get(key), result.actions)
    for key in after.keys() - before.keys():
        assert allowed(Bucket.NEW, after[key]), (key, after[key])
