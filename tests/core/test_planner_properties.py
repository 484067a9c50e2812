"""Invariants of plan() over random snapshots and policies (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.core.randomized import apply, clone, policies, quiet_fleets, snapshots

from swarm_autoscaler.core.cluster import Bucket, allowed, classify
from swarm_autoscaler.core.model import (
    ActivateNode,
    Cordon,
    DrainNode,
    Launch,
    Plan,
    Policy,
    RemoveNode,
    RetireWorkers,
    Snapshot,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.plan import plan, plan_traced
from swarm_autoscaler.core.vectors import fits, plus

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def launched(result: Plan) -> int:
    return sum(a.count for a in result.actions if isinstance(a, Launch))


@FAST
@given(snapshots(), policies())
def test_deterministic_and_inputs_untouched(snapshot: Snapshot, policy: Policy) -> None:
    before = repr((snapshot, policy))
    first = plan(snapshot, policy)
    assert repr((snapshot, policy)) == before
    assert plan(clone(snapshot), policy) == first
    assert plan_traced(snapshot, policy)[0] == first


@FAST
@given(snapshots(), policies())
def test_never_above_the_maximum(snapshot: Snapshot, policy: Policy) -> None:
    result = plan(snapshot, policy)
    alive = sum(1 for i in snapshot.instances if i.alive)
    if launched(result):
        assert alive + launched(result) <= policy.max_instances
    if policy.max_launch_per_tick:
        assert launched(result) <= policy.max_launch_per_tick


@FAST
@given(st.one_of(snapshots(), quiet_fleets()), policies())
def test_never_drains_retires_or_terminates_a_busy_node(snapshot: Snapshot, policy: Policy) -> None:
    result = plan(snapshot, policy)
    busy_hosts = {w.hostname for w in snapshot.workers if w.busy}
    host_of = {i.id: i.hostname for i in snapshot.instances} | {n.id: n.hostname for n in snapshot.nodes}
    for action in result.actions:
        match action:
            case DrainNode(hostname=host) | RemoveNode(hostname=host):
                assert host not in busy_hosts, action
            case Terminate(instance_ids=ids, node_ids=node_ids):
                assert not {host_of[k] for k in (*ids, *node_ids)} & busy_hosts, action
            case RetireWorkers(addresses=addresses):
                assert not {w.address for w in snapshot.workers if w.busy} & set(addresses), action


@FAST
@given(st.one_of(snapshots(), quiet_fleets()), policies())
def test_cordons_only_while_nothing_waits(snapshot: Snapshot, policy: Policy) -> None:
    """A worker is cordoned only when nothing is pending, only if every task on it is executing (a
    waiting task would never start), and never the last uncordoned worker of its type."""
    result = plan(snapshot, policy)
    cordons = [a for a in result.actions if isinstance(a, Cordon)]
    if not cordons:
        return
    assert not any(isinstance(a, Launch | ActivateNode | Uncordon) for a in result.actions)
    assert policy.consolidate_below > 0
    workers = {w.address: w for w in snapshot.workers}
    for action in cordons:
        for address in action.addresses:
            assert all(t.executing for t in workers[address].processing), action
    cordoned = {a for c in cordons for a in c.addresses}
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
@given(snapshots(), policies())
def test_never_touches_unowned_or_manager_nodes(snapshot: Snapshot, policy: Policy) -> None:
    cluster = classify(snapshot, policy)
    untouchable = {m.node.id for m in (*cluster.unowned, *cluster.manager) if m.node is not None}
    for action in plan(snapshot, policy).actions:
        node_ids = set(getattr(action, "node_ids", ())) | {getattr(action, "node_id", "")}
        assert not node_ids & untouchable, action


@FAST
@given(st.one_of(snapshots(), quiet_fleets()), policies())
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
@given(snapshots(), policies())
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


@FAST
@given(snapshots(), policies())
def test_scale_down_never_terminates_a_type_it_launches(snapshot: Snapshot, policy: Policy) -> None:
    result = plan(snapshot, policy)
    types = {i.id: i.type_name for i in snapshot.instances}
    launching = {a.type_name for a in result.actions if isinstance(a, Launch)}
    for action in result.actions:
        if isinstance(action, Terminate) and action.reason.startswith("drained"):
            assert not {types[i] for i in action.instance_ids} & launching


@FAST
@given(st.one_of(snapshots(), quiet_fleets()), policies())
def test_every_transition_the_plan_causes_is_in_the_table(snapshot: Snapshot, policy: Policy) -> None:
    result = plan(snapshot, policy)
    before = classify(snapshot, policy).bucket_of()
    after = classify(apply(snapshot, result), policy).bucket_of()
    for key, bucket in before.items():
        assert allowed(bucket, after.get(key, Bucket.GONE)), (key, bucket, after.get(key), result.actions)
    for key in after.keys() - before.keys():
        assert allowed(Bucket.NEW, after[key]), (key, after[key])
