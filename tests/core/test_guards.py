"""Safety guards pinned down one by one: each test here fails on a mutant (`make mutation`) that
survived the rule tables and properties, in a condition that decides whether a busy, unowned or manager
node is touched, or in max_instances, min_instances, the reserve or a delay. docs/lab/mutation.md
lists the mutants left alive and why each one is harmless."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.builders import (
    NOW,
    Machine,
    assemble,
    hostname,
    launch_reason,
    machine,
    make_instance,
    make_node,
    make_policy,
    make_snapshot,
    make_task,
    make_tasks,
    make_worker,
)

from swarm_autoscaler.core.actions import (
    ActivateNode,
    Cordon,
    DrainNode,
    HostIdle,
    Launch,
    NodeUpdate,
    NothingWaits,
    NoWorker,
    Plan,
    RemoveNode,
    Retired,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.model import (
    Availability,
    InstanceState,
    NodeMarks,
    NodeStatus,
    Task,
    TypePolicy,
    Unavailable,
)
from swarm_autoscaler.core.plan import plan, plan_traced
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
    pair = Fresh((), (make_worker(1, unique=True, host=H1), make_worker(2, unique=True, host=H1)))
    assert violated(HostIdle(H1), pair) == f"worker {H1}, {H1} on {H1} has work or unique results now"
    assert violated(NoWorker(H1), pair) == f"a worker connected on {H1} since the plan ({H1}, {H1})"
    assert violated(Retired(H1), pair) == f"the scheduler kept worker {H1}, {H1} on {H1}"


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
    assert result.of_kind(Launch) == (Launch("m5.large", 1, launch_reason(1, "m5.large")),)


# ------------------------------------------------------------------------------------------ metrics


def test_a_member_of_no_known_type_counts_as_unknown() -> None:
    """The metrics label of a node whose instance is gone and that carries no type label."""
    orphan = make_node(1, status=NodeStatus.DOWN, labels={})
    cluster = classify(make_snapshot(nodes=[orphan]), make_policy())
    assert cluster.counts_by_type() == {("disconnected", "unknown"): 1}


def test_an_unknown_check_is_a_programming_error_that_names_it() -> None:
    stranger = object()
    with pytest.raises(AssertionError, match=f"unknown check {stranger!r}"):
        violated(stranger, Fresh((), ()))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ scale-down
#
# Policy delays (make_policy): drain_delay 60 s, termination_delay 120 s, node_down_timeout 300 s,
# max_start_time 600 s.

RUNNING = dataclasses.replace(make_task("r"), executing=True)


def _drained(n: int, since: float = NOW - 1000, type_name: str = "m5.large", **kw: Any) -> Machine:
    marks = NodeMarks(ready=True, drained_since=since)
    return machine(n, type_name, availability=Availability.DRAIN, marks=marks, **kw)


def _idle(n: int, since: float | None = NOW - 1000, **kw: Any) -> Machine:
    return machine(n, marks=NodeMarks(ready=True, empty_since=since), **kw)


def _terminated(result: Plan) -> set[str]:
    return {i for a in result.of_kind(Terminate) for i in a.instance_ids}  # type: ignore[union-attr]


def _drains(result: Plan) -> set[str]:
    return {a.node_id for a in result.of_kind(DrainNode)}  # type: ignore[union-attr]


def test_a_busy_drained_node_is_never_terminated_and_the_idle_one_after_it_is() -> None:
    busy, kept = _drained(1, processing=[RUNNING]), _drained(2, unique=True)
    result = plan(assemble(busy, kept, _drained(3)), make_policy())
    assert _terminated(result) == {"i-0003"}


def test_a_drained_node_is_terminated_from_termination_delay_on_and_not_before() -> None:
    result = plan(assemble(_drained(1, NOW - 119), _drained(2, NOW - 120)), make_policy())
    assert _terminated(result) == {"i-0002"}


def test_a_type_launched_in_the_plan_is_skipped_and_the_next_drained_node_is_terminated() -> None:
    """min_instances=4 over three machines launches an m5.large, the empty g4dn reserve a g4dn: four
    live beside the drained nodes. The drained m5.large stays (its type is launched); the drained
    m5.xlarge after it, of a type no longer allowed, goes."""
    fleet = (_drained(1), _drained(2, type_name="m5.xlarge"), _idle(3, NOW - 10))
    policy = make_policy((TypePolicy("m5.large"), TypePolicy("g4dn.xlarge", reserve=1)), min_instances=4)
    result = plan(assemble(*fleet), policy)
    assert {a.type_name for a in result.of_kind(Launch)} == {"m5.large", "g4dn.xlarge"}  # type: ignore[union-attr]
    assert _terminated(result) == {"i-0002"}


def test_termination_stops_at_min_instances_counting_what_the_plan_launches() -> None:
    """Three drained, one busy: min_instances=2 lets exactly two go. With a launch for pending work that
    cannot all be placed (max_instances), the launched machine counts: min 3 still lets two go."""
    fleet = (_drained(1), _drained(2), _drained(3), machine(4, processing=[RUNNING]))
    assert len(_terminated(plan(assemble(*fleet), make_policy(min_instances=2)))) == 2
    gpu_work = make_tasks(3, gpus=1, cpus=4, ram_gib=4)
    result = plan(assemble(*fleet, unrunnable=gpu_work), make_policy(min_instances=3, max_instances=5))
    assert [a.count for a in result.of_kind(Launch)] == [1]  # type: ignore[union-attr]
    assert len(_terminated(result)) == 2


def test_the_reserve_comes_on_top_of_min_instances_when_terminating() -> None:
    """m5.large keeps one drained node in reserve (the newest); of the two beyond it, min_instances=2
    (one busy active node, plus one) lets one go."""
    fleet = (_drained(1), _drained(2), _drained(3, age=10), machine(4, processing=[RUNNING]))
    policy = make_policy((TypePolicy("m5.large", reserve=1),), min_instances=2)
    assert len(_terminated(plan(assemble(*fleet), policy))) == 1


def test_a_drained_node_of_a_type_no_longer_allowed_has_no_reserve() -> None:
    policy = make_policy((TypePolicy("m5.xlarge", reserve=1),))
    assert _terminated(plan(assemble(_drained(1)), policy)) == {"i-0001"}


def test_drain_skips_busy_and_recently_emptied_nodes_and_takes_the_ones_after_them() -> None:
    fleet = (machine(1, processing=[RUNNING]), _idle(2, NOW - 59), _idle(3, NOW - 60), _idle(4, None))
    result = plan(assemble(*fleet), make_policy())
    assert _drains(result) == {"node-3"}


def test_a_node_drained_in_this_plan_is_not_also_cordoned() -> None:
    """Nothing pending: the idle node is drained; the two light ones may be consolidated, never it."""
    light = [dataclasses.replace(make_task(f"l{i}", cpus=0.5), executing=True) for i in range(2)]
    fleet = (_idle(1), machine(2, processing=light[:1]), machine(3, processing=light[1:]))
    result = plan(assemble(*fleet), make_policy())
    assert _drains(result) == {"node-1"}
    assert "node-1" not in {a.node_id for a in result.of_kind(Cordon)}  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------ repair


def _down(n: int, since: float, **kw: Any) -> Machine:
    return machine(n, status=NodeStatus.DOWN, marks=NodeMarks(ready=True, down_since=since), **kw)


def test_a_down_node_is_removed_from_node_down_timeout_on_and_never_while_busy() -> None:
    fleet = (_down(1, NOW - 299), _down(2, NOW - 300), _down(3, NOW - 5000, processing=[RUNNING]))
    # (every node down would trip the safety stop, test_safety_stop.py's subject: turned off here)
    result = plan(assemble(*fleet), dataclasses.replace(make_policy(), max_unready_share=1.0))
    # one Terminate that also removes the node (a RemoveNode first would fail the Terminate's NodeOurs)
    assert {n for a in result.of_kind(Terminate) for n in a.node_ids} == {"node-2"}  # type: ignore[union-attr]
    assert _terminated(result) == {"i-0002"}


def test_a_node_whose_instance_is_gone_is_removed_only_when_down_and_idle() -> None:
    """Nodes carrying our type label with no instance listed: the ready one and the busy down one stay."""
    ready = make_node(1, labels={"instance-type": "m5.large"})
    busy_down = make_node(2, status=NodeStatus.DOWN, labels={"instance-type": "m5.large"})
    idle_down = make_node(3, status=NodeStatus.DOWN, labels={"instance-type": "m5.large"})
    workers = [make_worker(1), make_worker(2, processing=[RUNNING])]
    result = plan(make_snapshot(nodes=[ready, busy_down, idle_down], workers=workers), make_policy())
    assert {a.node_id for a in result.of_kind(RemoveNode)} == {"node-3"}  # type: ignore[union-attr]


def _terminating(n: int, since: float, **kw: Any) -> Machine:
    """A machine whose termination went ahead `since`: drained (and by default its worker gone)."""
    kw = {"availability": Availability.DRAIN, "worker": False, **kw}
    return machine(n, marks=NodeMarks(ready=True, termination_started=since), **kw)


def test_a_termination_is_asked_again_from_termination_delay_on_never_for_a_busy_or_dying_machine() -> None:
    inst, node, _ = _terminating(4, NOW - 5000)
    dying = (dataclasses.replace(inst, state=InstanceState.SHUTTING_DOWN), node, None)
    fleet = (
        _terminating(1, NOW - 119),
        _terminating(2, NOW - 120),
        _terminating(3, NOW - 5000, worker=True, processing=[RUNNING]),
        dying,
        # ready, active, with a connected worker: it serves work, its mark is stale (never asked again)
        _terminating(5, NOW - 5000, worker=True, availability=Availability.ACTIVE),
    )
    assert _terminated(plan(assemble(*fleet), make_policy())) == {"i-0002"}


def test_an_instance_without_node_is_broken_from_max_start_time_on() -> None:
    young, old = make_instance(1, age=599), make_instance(2, age=600)
    assert _terminated(plan(make_snapshot(instances=[young, old]), make_policy())) == {"i-0002"}


# ------------------------------------------------------------------------------------------ launches


def _launches(result: Plan) -> dict[str, int]:
    return {a.type_name: a.count for a in result.of_kind(Launch)}  # type: ignore[union-attr]


def test_max_launch_per_tick_of_one_caps_the_launches() -> None:
    work = make_tasks(3, cpus=2, ram_gib=4)
    assert _launches(
        plan(make_snapshot(unrunnable=work), make_policy(("m5.large",), max_launch_per_tick=1))
    ) == {"m5.large": 1}


def test_the_reserve_does_not_count_towards_min_instances() -> None:
    policy = make_policy((TypePolicy("m5.large", reserve=1),), min_instances=2)
    assert _launches(plan(assemble(_drained(1)), policy)) == {"m5.large": 2}


def test_a_reserve_is_filled_with_the_last_launch_the_budget_allows_never_with_a_refused_type() -> None:
    policy = make_policy(
        (TypePolicy("m5.xlarge", reserve=1), TypePolicy("m5.large", reserve=1)), max_instances=2
    )
    snapshot = assemble(machine(1, processing=[RUNNING]), unavailable=[Unavailable("m5.xlarge", NOW + 60)])
    assert _launches(plan(snapshot, policy)) == {"m5.large": 1}


def test_a_reserve_counts_its_idle_machines_and_what_the_plan_launches_for_the_minimum() -> None:
    two = make_policy((TypePolicy("m5.large", reserve=2),))
    assert _launches(plan(assemble(_drained(1)), two)) == {"m5.large": 1}
    one_and_min = make_policy((TypePolicy("m5.large", reserve=1),), min_instances=1)
    assert _launches(plan(make_snapshot(), one_and_min)) == {"m5.large": 1}


# ------------------------------------------------------------------------------------------ consolidation


def _running(n: int, type_name: str, *cpus: float) -> Machine:
    tasks = [dataclasses.replace(make_task(f"w{n}-{i}", cpus=c), executing=True) for i, c in enumerate(cpus)]
    return machine(n, type_name, processing=tasks)


def _cordoned(*fleet: Machine) -> set[str]:
    return {a.node_id for a in plan(assemble(*fleet), make_policy()).of_kind(Cordon)}  # type: ignore[union-attr]


def test_a_worker_using_exactly_the_threshold_is_cordoned() -> None:
    """Three m5.large each running 1 of 2 CPUs (share 0.5 = consolidate_below)."""
    assert _cordoned(*(_running(n, "m5.large", 1) for n in (1, 2, 3))) == {"node-1"}


def test_no_cordon_without_room_for_its_tasks_and_the_next_largest_one() -> None:
    """Two m5.large each running 1 of 2 CPUs: the other has 1 CPU free, not 1 + 1."""
    assert _cordoned(_running(1, "m5.large", 1), _running(2, "m5.large", 1)) == set()


def test_the_least_used_worker_is_cordoned_first() -> None:
    fleet = (_running(1, "m5.large", 1), _running(2, "m5.large", 0.5), _running(3, "m5.large", 1))
    assert _cordoned(*fleet) == {"node-2"}


def test_one_worker_of_each_type_stays_uncordoned() -> None:
    """Four m5.xlarge running half a CPU each: three may go, the fourth stays."""
    assert _cordoned(*(_running(n, "m5.xlarge", 0.5) for n in (1, 2, 3, 4))) == {"node-1", "node-2", "node-3"}


# ------------------------------------------------------------------------------------------ marks


def _marks(result: Plan, node_id: str, before: NodeMarks) -> tuple[dict[str, object], str]:
    """The fields the plan's NodeUpdate changes on the node (it carries the node's whole new marks)."""
    [mark] = [a for a in result.of_kind(NodeUpdate) if a.node_id == node_id]  # type: ignore[union-attr]
    new = mark.marks  # type: ignore[union-attr]
    changed = {
        f.name: getattr(new, f.name)
        for f in dataclasses.fields(new)
        if getattr(new, f.name) != getattr(before, f.name)
    }
    return changed, mark.reason  # type: ignore[union-attr]


def test_an_active_node_sheds_a_stale_drained_mark_or_its_next_drain_would_end_at_once() -> None:
    """Left in place, drained_since from long ago would let the next drain terminate it with no wait."""
    before = NodeMarks(ready=True, empty_since=NOW - 10, drained_since=NOW - 5000)
    node = machine(1, marks=before)
    assert _marks(plan(assemble(node), make_policy()), "node-1", before) == (
        {"drained_since": None},
        "active again",
    )


def test_an_accepted_node_without_worker_is_marked_empty_with_that_reason() -> None:
    result = plan(assemble(machine(1, worker=False)), make_policy())
    assert _marks(result, "node-1", NodeMarks(ready=True)) == ({"empty_since": NOW}, "no worker")


def test_a_reactivated_node_sheds_its_empty_and_drained_marks() -> None:
    stale = NodeMarks(ready=True, empty_since=NOW - 5000, drained_since=NOW - 5000)
    drained = machine(1, availability=Availability.DRAIN, marks=stale)
    result = plan(assemble(drained, unrunnable=[make_task("t")]), make_policy(("m5.large",)))
    assert result.of_kind(ActivateNode)
    assert _marks(result, "node-1", stale)[0] == {"empty_since": None, "drained_since": None}


def _cordoned_machine(n: int, *tasks: Task) -> Machine:
    marks = NodeMarks(ready=True, cordoned_since=NOW - 30)
    return machine(n, "m5.xlarge", processing=tasks, retiring=True, marks=marks)


def test_every_cordoned_worker_a_task_waits_on_is_uncordoned_and_no_other() -> None:
    waiting, running = make_task("w"), dataclasses.replace(make_task("r"), executing=True)
    fleet = (_cordoned_machine(1, waiting), _cordoned_machine(2, running), _cordoned_machine(3, waiting))
    result = plan(assemble(*fleet, machine(4, "m5.xlarge", processing=[running])), make_policy())
    assert {a.node_id for a in result.of_kind(Uncordon)} == {"node-1", "node-3"}  # type: ignore[union-attr]


def test_idle_machines_make_room_even_when_one_task_alone_cannot_get_capacity() -> None:
    """At max_instances, a GPU task no machine has room for: the idle node is drained all the same."""
    fleet = (_idle(1), machine(2, processing=[RUNNING]))
    result = plan(assemble(*fleet, unrunnable=[make_task("g", gpus=1)]), make_policy(max_instances=2))
    assert _drains(result) == {"node-1"}


def test_the_trace_records_each_placement_on_an_existing_worker() -> None:
    _, trace = plan_traced(assemble(machine(1), unrunnable=[make_task("t")]), make_policy())
    assert [(key, n) for key, _, n in trace.placements] == [("tcp://10.0.0.1:8786", 1)]


# ------------------------------------------------------------------------------------------ odds and ends


def test_a_stale_ready_entry_of_a_node_that_joined_again_is_left_alone() -> None:
    """Swarm lists a node that left and joined again twice: the entry not picked is unowned when ready
    (nothing to remove: it may be the live one), disconnected when down."""
    inst = make_instance(1)
    picked, stale = make_node(1), dataclasses.replace(make_node(2, host=hostname(1)), id="node-9")
    cluster = classify(make_snapshot(instances=[inst], nodes=[picked, stale]), make_policy())
    assert [m.node.id for m in cluster.unowned if m.node] == ["node-9"]
    assert not any(
        a
        for a in plan(make_snapshot(instances=[inst], nodes=[picked, stale]), make_policy()).actions
        if getattr(a, "node_id", "") == "node-9"
    )


def test_workers_of_a_type_missing_from_the_catalogue_are_neither_cordoned_nor_a_crash() -> None:
    light = [dataclasses.replace(make_task(f"l{i}", cpus=0.5), executing=True) for i in range(2)]
    fleet = [machine(n, processing=light[n - 1 : n]) for n in (1, 2)]
    snapshot = dataclasses.replace(assemble(*fleet), instance_types=())
    assert not plan(snapshot, make_policy()).of_kind(Cordon)


def test_no_cordon_in_a_plan_that_launches() -> None:
    """Consolidating while the same plan adds a machine (here for min_instances) would undo itself."""
    fleet = [_running(n, "m5.xlarge", 0.5) for n in (1, 2, 3)]
    assert _cordoned(*fleet) and not plan(assemble(*fleet), make_policy(min_instances=4)).of_kind(Cordon)


def test_every_joined_node_missing_its_launch_labels_gets_them() -> None:
    """A machine launched without labels does not stop the ones after it from being labelled."""
    bare = machine(1)
    inst, node, worker = machine(2)
    labelled = (dataclasses.replace(inst, labels={"instance-type": "m5.large"}), node, worker)
    result = plan(assemble(bare, labelled), make_policy())
    assert [(a.node_id, a.labels) for a in result.of_kind(NodeUpdate) if a.labels] == [  # type: ignore[union-attr]
        ("node-2", (("instance-type", "m5.large"),))
    ]  # type: ignore[union-attr]


def test_the_trace_records_the_new_machines_and_their_capacity() -> None:
    _, trace = plan_traced(make_snapshot(unrunnable=[make_task("t")]), make_policy(("m5.large",)))
    assert [(b.type_name, b.count) for b in trace.new] == [("m5.large", 1)]
    assert set(trace.capacity) >= {"m5.large"}
