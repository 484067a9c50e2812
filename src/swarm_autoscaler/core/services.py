"""Dynamic mode: docker swarm service tasks as the planner's demand. Pure; the swarm services adapter
reads the tasks, this module turns them into the same `WorkloadView` the dask adapter produces, so the
one planner (virtual assignment, activation, reserve, warm pool, base per type, launch, fallback) runs
unchanged.

- **Demand**: a task whose desired state is running and that swarm has not given a node yet (states
  new, allocated, pending: "no suitable node", for lack of resources or of a node matching its
  constraints) is unrunnable work. Its needs are its service's `Resources.Reservations` (NanoCPUs,
  MemoryBytes, GenericResources; an `NVIDIA-GPU` or `gpu` kind counts as GPUs).
- **Constraints**: `node.labels.instance-type==T` pins the task to type T; `node.role==worker` and a
  constraint on this cluster's ownership label are met by every machine the daemon launches. Any other
  `==` constraint (another node label, a hostname, a manager role) names something no launched machine
  carries: the task is pinned to the constraint itself, which no allowed type is, so the planner reports
  it unplaceable with that reason. `!=` constraints and engine/platform ones are not read.
- **Busy**: every ready, non-manager node becomes one synthetic worker (address = node id) whose
  processing tasks are the service tasks assigned, starting or running on it. Tasks of global services
  (service mode Global: monitoring agents, one per node) and of the daemon's own service do not count,
  so they never keep a node busy nor take its room.
- **Room**: a worker's resources are its type's capacity minus the type's overhead (the engine's own
  report for a node of unknown type); the planner subtracts the reservations of its tasks.
- A worker is `retiring` while its node is not active (paused by a fence or retirement, or drained).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.cluster import TYPE_LABEL
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Availability,
    InstanceType,
    Node,
    NodeStatus,
    Policy,
    Resources,
    Task,
    Worker,
)
from swarm_autoscaler.core.ports import WorkloadView

# Swarm task states (docker/swarmkit api/types.proto), in lifecycle order.
WAITING_STATES = frozenset({"new", "allocated", "pending"})
ON_NODE_STATES = frozenset({"assigned", "accepted", "preparing", "ready", "starting", "running"})

# A pin that is a constraint no launched machine meets starts with this (see `unplaceable_reason`).
CONSTRAINT_PIN = "node."


@dataclass(frozen=True, slots=True)
class ServiceTask:
    """One swarm task as the adapter reads it.

    `state` and `desired` are swarm's task state and desired state; `node_id` is empty until swarm
    assigns it. `needs` are its reservations, `constraints` its service's placement constraints as
    written. `global_service`: its service's mode is Global. `ours`: its service is the daemon's own."""

    id: str
    service: str
    state: str
    desired: str = "running"
    node_id: str = ""
    needs: Resources = Resources()
    constraints: tuple[str, ...] = ()
    global_service: bool = False
    ours: bool = False
    message: str = ""

    @property
    def waiting(self) -> bool:
        """Pending for a node: demand."""
        return self.desired == "running" and self.state in WAITING_STATES and not self.node_id

    @property
    def on_node(self) -> bool:
        """Assigned to a node and not finished (whatever its desired state: a task shutting down still
        runs there until it stops)."""
        return bool(self.node_id) and self.state in ON_NODE_STATES

    @property
    def load(self) -> bool:
        """It counts as load: not a global service's, not the daemon's own."""
        return not self.global_service and not self.ours


@dataclass(frozen=True, slots=True)
class SwarmNode:
    """A swarm node with what its engine reports it has (`Description.Resources`)."""

    node: Node
    reported: Resources = Resources()


def pin_of(constraints: Iterable[str], cluster_name: str) -> str | None:
    """The type a task's constraints pin it to; a constraint no launched machine meets (returned as
    written, see `CONSTRAINT_PIN`); or None when any machine the daemon launches meets them."""
    types: set[str] = set()
    met = {(f"node.labels.{OWNERSHIP_LABEL}", cluster_name), ("node.role", "worker")}  # every launch
    for raw in constraints:
        text = raw.replace(" ", "")
        if "==" not in text:
            continue  # "!=" and anything else: not read (docs/dynamic-mode.md says what it cannot see)
        key, value = text.split("==", 1)
        if key == f"node.labels.{TYPE_LABEL}":
            types.add(value)
        elif (key, value) not in met and key.startswith(
            ("node.labels.", "node.hostname", "node.id", "node.role")
        ):
            return text
    if len(types) > 1:
        return f"{CONSTRAINT_PIN}labels.{TYPE_LABEL}=={'&'.join(sorted(types))}"
    return next(iter(types), None)


def capacity_of(swarm_node: SwarmNode, catalogue: Mapping[str, InstanceType], policy: Policy) -> Resources:
    """A node's room for tasks: its type's capacity minus the type's overhead, or what the engine
    reports when the node's type is unknown."""
    type_name = swarm_node.node.labels.get(TYPE_LABEL, "")
    known = catalogue.get(type_name)
    if known is None:
        return swarm_node.reported
    tp = policy.type_policy(type_name)
    return known.resources.saturating_sub(tp.overhead) if tp is not None else known.resources


def as_task(
    task: ServiceTask,
    cluster_name: str,
    executing: bool,
    pins: dict[tuple[str, ...], str | None] | None = None,
) -> Task:
    """The planner's task; `pins` memoises `pin_of` by constraints (a service's tasks share them)."""
    if pins is None:
        return Task(task.id, task.needs, pin_of(task.constraints, cluster_name), executing=executing)
    if task.constraints not in pins:
        pins[task.constraints] = pin_of(task.constraints, cluster_name)
    return Task(task.id, task.needs, pins[task.constraints], executing=executing)


def service_view(
    nodes: Sequence[SwarmNode],
    tasks: Sequence[ServiceTask],
    catalogue: Sequence[InstanceType],
    policy: Policy,
    cluster_name: str,
    with_pending: bool = True,
) -> WorkloadView:
    """The swarm's service tasks as the planner's workload: one worker per ready non-manager node with
    the load on it, and the tasks waiting for a node as unrunnable (only when `with_pending`)."""
    types = {t.name: t for t in catalogue}
    pins: dict[tuple[str, ...], str | None] = {}
    on_node: dict[str, list[Task]] = {}
    for task in tasks:
        if task.load and task.on_node:
            on_node.setdefault(task.node_id, []).append(as_task(task, cluster_name, True, pins))
    workers = tuple(
        Worker(
            address=n.node.id,
            name=n.node.hostname,
            hostname=n.node.hostname,
            resources=capacity_of(n, types, policy),
            processing=tuple(sorted(on_node.get(n.node.id, ()), key=lambda t: t.key)),
            retiring=n.node.availability != Availability.ACTIVE,
        )
        for n in sorted(nodes, key=lambda n: n.node.id)
        if not n.node.is_manager and n.node.status == NodeStatus.READY
    )
    pending = tuple(
        as_task(t, cluster_name, False, pins)
        for t in sorted(tasks, key=lambda t: t.id)
        if with_pending and t.load and t.waiting
    )
    return WorkloadView(workers, pending)


def busy_hosts(view: WorkloadView) -> tuple[str, ...]:
    """The hosts of the workers that hold a task (for a fence's refusals)."""
    return tuple(sorted({w.hostname for w in view.workers if w.processing}))


def dynamic_policy(policy: Policy) -> Policy:
    """The policy as the dynamic mode runs it: consolidation off, since no service task can be cordoned
    away from a node the way a dask worker is (the daemon and the simulator both apply it); and machines
    join paused (`Policy.join_paused`), taken in by the planner, so that a machine planned as broken
    that joins before its termination lands is never given a task by swarm."""
    return dataclasses.replace(policy, consolidate_below=0.0, join_paused=True)
