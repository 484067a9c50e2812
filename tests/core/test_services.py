"""Dynamic mode's rules: swarm service tasks turned into the planner's demand (core/services.py), and
the shared planner's decisions on it (launch, activation, base, unplaceable, drain only when empty)."""

from __future__ import annotations

from dataclasses import replace

from tests.builders import (
    CATALOGUE,
    NOW,
    hostname,
    make_instance,
    make_node,
    make_policy,
    make_snapshot,
)

from swarm_autoscaler.core.actions import ActivateNode, DrainNode, Launch, NodeUpdate, Unplaceable
from swarm_autoscaler.core.cluster import TYPE_LABEL
from swarm_autoscaler.core.model import (
    GIB,
    OWNERSHIP_LABEL,
    Availability,
    NodeMarks,
    NodeStatus,
    Resources,
    TypePolicy,
)
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.ports import WorkloadView
from swarm_autoscaler.core.services import ServiceTask, SwarmNode, busy_hosts, pin_of, service_view

CLUSTER = "c1"


def seat(n: int, type_name: str = "m5.large", **kw: object) -> SwarmNode:
    labels = {TYPE_LABEL: type_name, OWNERSHIP_LABEL: CLUSTER}
    return SwarmNode(make_node(n, labels=labels, **kw), Resources.of(64, 256 * GIB))  # type: ignore[arg-type]


def pending(i: int, cpus: float = 1, ram_gib: float = 1, **kw: object) -> ServiceTask:
    return ServiceTask(f"p{i:03d}", "web", "pending", needs=Resources.of(cpus, int(ram_gib * GIB)), **kw)  # type: ignore[arg-type]


def running(i: int, node: int, cpus: float = 1, **kw: object) -> ServiceTask:
    needs = Resources.of(cpus, GIB)
    return ServiceTask(f"r{i:03d}", "web", "running", node_id=f"node-{node}", needs=needs, **kw)  # type: ignore[arg-type]


def view(nodes: list[SwarmNode], tasks: list[ServiceTask], policy: object = None) -> WorkloadView:
    return service_view(nodes, tasks, CATALOGUE, policy or make_policy(), CLUSTER)  # type: ignore[arg-type]


def snapshot_of(nodes: list[SwarmNode], tasks: list[ServiceTask], policy: object = None, **kw: object):  # type: ignore[no-untyped-def]
    v = view(nodes, tasks, policy)
    instances = [make_instance(int(n.node.id.split("-")[1]), n.node.labels[TYPE_LABEL]) for n in nodes]
    return make_snapshot(instances, [n.node for n in nodes], v.workers, v.unrunnable, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ demand


def test_pending_tasks_are_unrunnable_with_their_reservations() -> None:
    v = view([], [pending(1, cpus=3, ram_gib=2), ServiceTask("x", "web", "new", needs=Resources.of(1))])
    assert [(t.key, t.needs) for t in v.unrunnable] == [
        ("p001", Resources.of(3, 2 * GIB)),
        ("x", Resources.of(1)),
    ]


def test_finished_shut_down_and_global_tasks_are_no_demand() -> None:
    tasks = [
        pending(1, desired="shutdown"),
        ServiceTask("done", "web", "complete", desired="shutdown"),
        pending(2, global_service=True),
        pending(3, ours=True),
    ]
    assert view([], tasks).unrunnable == ()


def test_constraints_pin_to_types_or_to_what_no_launch_carries() -> None:
    assert pin_of([f"node.labels.{TYPE_LABEL} == g4dn.xlarge"], CLUSTER) == "g4dn.xlarge"
    assert pin_of(["node.role==worker", f"node.labels.{OWNERSHIP_LABEL}=={CLUSTER}"], CLUSTER) is None
    assert pin_of([f"node.labels.{TYPE_LABEL}!=m5.large"], CLUSTER) is None
    assert pin_of(["node.labels.zone==eu"], CLUSTER) == "node.labels.zone==eu"
    assert pin_of(["node.role==manager"], CLUSTER) == "node.role==manager"
    both = [f"node.labels.{TYPE_LABEL}==m5.large", f"node.labels.{TYPE_LABEL}==c5.2xlarge"]
    assert pin_of(both, CLUSTER) == f"node.labels.{TYPE_LABEL}==c5.2xlarge&m5.large"


# ------------------------------------------------------------------------------------------ busy and room


def test_a_node_is_busy_with_any_task_on_it_but_global_and_own_ones() -> None:
    nodes = [seat(1), seat(2), seat(3), seat(4)]
    tasks = [
        running(1, 1),
        ServiceTask("s", "db", "starting", node_id="node-2", needs=Resources.of(1)),
        running(3, 3, global_service=True),
        running(4, 4, ours=True),
    ]
    v = view(nodes, tasks)
    assert [len(w.processing) for w in v.workers] == [1, 1, 0, 0]
    assert all(t.executing for w in v.workers for t in w.processing)
    assert busy_hosts(v) == (hostname(1), hostname(2))


def test_room_is_type_capacity_less_overhead_else_what_the_engine_reports() -> None:
    policy = make_policy(types=(TypePolicy("m5.large", overhead=Resources.of(0.5, GIB)),))
    unknown = SwarmNode(make_node(2, labels={}), Resources.of(6, 12 * GIB))
    v = view([seat(1), unknown], [], policy)
    assert [w.resources for w in v.workers] == [Resources.of(1.5, 7 * GIB), Resources.of(6, 12 * GIB)]


def test_managers_and_nodes_not_ready_get_no_worker_and_paused_ones_retire() -> None:
    nodes = [
        seat(1, manager=True),
        seat(2, status=NodeStatus.DOWN),
        seat(3, availability=Availability.PAUSE),
        seat(4),
    ]
    v = view(nodes, [])
    assert [(w.address, w.retiring) for w in v.workers] == [("node-3", True), ("node-4", False)]


# ------------------------------------------------------------------------------------------ the shared planner


def test_replicas_reserving_more_than_the_fleet_has_launch() -> None:
    nodes = [seat(1)]  # m5.large: 2 CPUs
    tasks = [running(0, 1, cpus=2), *(pending(i, cpus=2) for i in range(3))]
    result = plan(snapshot_of(nodes, tasks), make_policy(types=("m5.large",)))
    launches = result.of_kind(Launch)
    assert [(a.type_name, a.count) for a in launches] == [("m5.large", 3)]  # type: ignore[attr-defined]
    assert result.pending == 3


def test_a_task_fitting_the_room_left_on_a_node_launches_nothing() -> None:
    nodes = [seat(1, "m5.xlarge")]  # 4 CPUs, 2 reserved by the running task
    tasks = [running(0, 1, cpus=2), pending(1, cpus=2)]
    assert plan(snapshot_of(nodes, tasks), make_policy()).of_kind(Launch) == ()


def test_an_instance_type_constraint_launches_that_type() -> None:
    tasks = [pending(1, constraints=(f"node.labels.{TYPE_LABEL}==c5.2xlarge",))]
    result = plan(snapshot_of([], tasks), make_policy())
    assert [(a.type_name, a.count) for a in result.of_kind(Launch)] == [("c5.2xlarge", 1)]  # type: ignore[attr-defined]


def test_a_drained_node_is_activated_for_pending_tasks() -> None:
    drained = seat(1, availability=Availability.DRAIN, marks=NodeMarks(ready=True, drained_since=NOW - 10))
    result = plan(snapshot_of([drained], [pending(1)]), make_policy())
    assert [a.node_id for a in result.of_kind(ActivateNode)] == ["node-1"]  # type: ignore[attr-defined]
    assert result.of_kind(Launch) == ()


def test_a_constraint_no_launched_machine_meets_is_unplaceable_with_its_reason() -> None:
    result = plan(snapshot_of([], [pending(1, constraints=("node.labels.zone==eu",))]), make_policy())
    assert result.unplaceable == (
        Unplaceable(
            "p001", "constrained to node.labels.zone==eu, which no machine the daemon launches carries"
        ),
    )
    assert result.of_kind(Launch) == ()


def test_too_big_a_reservation_is_unplaceable() -> None:
    result = plan(snapshot_of([], [pending(1, cpus=100)]), make_policy())
    assert [u.task_key for u in result.unplaceable] == ["p001"]
    assert "more than any allowed instance type offers" in result.unplaceable[0].reason


def test_a_node_running_a_task_is_never_drained_an_empty_one_is() -> None:
    empty = NodeMarks(ready=True, empty_since=NOW - 3600)
    nodes = [seat(1, marks=empty), seat(2, marks=empty)]
    result = plan(snapshot_of(nodes, [running(0, 1)]), make_policy())
    assert [a.node_id for a in result.of_kind(DrainNode)] == ["node-2"]  # type: ignore[attr-defined]


def test_the_base_per_type_holds_with_no_service_at_all() -> None:
    policy = make_policy(types=(TypePolicy("m5.large", minimum=2),))
    result = plan(snapshot_of([], []), policy)
    assert [(a.type_name, a.count) for a in result.of_kind(Launch)] == [("m5.large", 2)]  # type: ignore[attr-defined]


def test_a_global_task_alone_does_not_keep_a_node() -> None:
    empty = NodeMarks(ready=True, empty_since=NOW - 3600)
    result = plan(snapshot_of([seat(1, marks=empty)], [running(0, 1, global_service=True)]), make_policy())
    assert [a.node_id for a in result.of_kind(DrainNode)] == ["node-1"]  # type: ignore[attr-defined]


def test_the_view_is_deterministic_whatever_the_order_read() -> None:
    nodes = [seat(2), seat(1)]
    tasks = [pending(2), running(1, 2), pending(1), running(0, 1)]
    assert view(nodes, tasks) == view(list(reversed(nodes)), list(reversed(tasks)))
    assert replace(view(nodes, tasks)) == view(nodes, tasks)


def test_room_subtracts_both_the_overhead_and_the_reservations_on_the_node() -> None:
    # m5.xlarge: 4 CPUs, less 1 of overhead, less 2 reserved by the running task: 1 left, 2 wanted
    policy = make_policy(types=(TypePolicy("m5.xlarge", overhead=Resources.of(1)), TypePolicy("m5.large")))
    nodes = [seat(1, "m5.xlarge")]
    tasks = [running(0, 1, cpus=2), pending(1, cpus=2)]
    (worker,) = view(nodes, tasks, policy).workers
    assert worker.resources.cpus == 3 and [t.needs.cpus for t in worker.processing] == [2]
    launches = plan(snapshot_of(nodes, tasks, policy), policy).of_kind(Launch)
    assert [(a.type_name, a.count) for a in launches] == [("m5.large", 1)]  # type: ignore[attr-defined]
    # without the overhead the same task fits the room left: nothing is launched
    assert plan(snapshot_of(nodes, tasks), make_policy()).of_kind(Launch) == ()


def test_activation_picks_the_drained_node_of_the_type_a_constraint_needs_and_restores_its_labels() -> None:
    drained = NodeMarks(ready=True, drained_since=NOW - 10)
    nodes = [
        seat(1, "m5.large", availability=Availability.DRAIN, marks=drained),
        seat(2, "c5.2xlarge", availability=Availability.DRAIN, marks=drained),
    ]
    # node 2 lost its type label (an operator's `docker node update --label-rm`): its instance keeps it
    stripped = replace(nodes[1].node, labels={OWNERSHIP_LABEL: CLUSTER})
    nodes[1] = replace(nodes[1], node=stripped)
    task = pending(1, constraints=(f"node.labels.{TYPE_LABEL}==c5.2xlarge",))
    v = view(nodes, [task])
    types = {1: "m5.large", 2: "c5.2xlarge"}
    instances = [
        replace(make_instance(n, t), labels={TYPE_LABEL: t, OWNERSHIP_LABEL: CLUSTER})
        for n, t in types.items()
    ]
    snapshot = make_snapshot(instances, [n.node for n in nodes], v.workers, v.unrunnable)
    result = plan(snapshot, make_policy())
    assert [a.node_id for a in result.of_kind(ActivateNode)] == ["node-2"]  # type: ignore[attr-defined]
    labelled = [a for a in result.of_kind(NodeUpdate) if a.labels]  # type: ignore[attr-defined]
    assert [(a.node_id, a.labels) for a in labelled] == [("node-2", ((TYPE_LABEL, "c5.2xlarge"),))]  # type: ignore[attr-defined]
    assert result.of_kind(Launch) == ()
