"""The simulated swarm running services (dynamic mode), and the daemon's workload port onto it.

`ServiceWorld` is the simulator's `World` (EC2 machines, swarm nodes, their lifecycle and billing) plus
swarm's orchestrator and scheduler for replicated services, simplified:

- **Orchestrator**: a service at `replicas` has that many tasks with desired state running; a missing
  one is created *pending* at once; a surplus one is shut down (pending ones first, then the ones on
  the node with the most tasks of that service, newest first): desired state shutdown, gone from its
  node `ServiceKnobs.task_stop_s` later.
- **Scheduler**: a pending task goes to a ready, *active* node whose labels meet its constraints
  (`node.labels.X==Y`, `!=`, `node.role`, `node.hostname`, `node.id`) and whose room fits its
  reservation; room is what the engine reports (the type's whole capacity, as docker counts it) minus
  the reservations of the tasks on it. Among those, swarm's spread: fewest tasks of the service, then
  fewest tasks, then node id. It is assigned at once and running `task_start_s` later.
- **Disruption**: a node drained, removed, or whose instance is stopped or terminated loses its tasks
  (swarm re-creates them pending). Losing a task that was on it (starting, running or stopping) is a
  *busy disruption*, recorded in `violations` as the dask world records its own. A paused node keeps
  its tasks.

`SimServicesWorkload` is the dynamic mode's `Workload` port onto this world, as the swarm services
adapter is onto a real swarm: it reads the nodes and tasks into `core.services` values and lets
`core.services.service_view` (the same pure conversion the adapter uses) turn them into the planner's
demand; retire and fence pause nodes, a fenced host with a task is refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from swarm_autoscaler.core.model import (
    Availability,
    InstanceType,
    NodeStatus,
    Policy,
    Worker,
)
from swarm_autoscaler.core.ports import Fence, WorkloadView
from swarm_autoscaler.core.services import ServiceTask, SwarmNode, busy_hosts, service_view
from swarm_autoscaler_lab.sim.servicetrace import Scale, ServiceSpec
from swarm_autoscaler_lab.sim.world import EPOCH, SIM_CLUSTER, World

ON_NODE = ("assigned", "running")


@dataclass(frozen=True, slots=True)
class ServiceKnobs:
    """How long a task takes to start once assigned (image present) and to stop once told to."""

    task_start_s: float = 5.0
    task_stop_s: float = 5.0


@dataclass(slots=True)
class SimTask:
    id: str
    spec: ServiceSpec
    created: float
    state: str = "pending"  # pending -> assigned -> running; removed when gone
    desired: str = "running"
    node_id: str = ""
    running_at: float | None = None

    def as_model(self) -> ServiceTask:
        return ServiceTask(
            self.id,
            self.spec.name,
            self.state,
            self.desired,
            self.node_id,
            self.spec.needs,
            self.spec.constraints,
        )


class NodeLike(Protocol):
    """A swarm worker node as placement sees it (`SimNode`, or `model.Node` in the demo)."""

    @property
    def id(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


def meets(constraints: Iterable[str], node: NodeLike) -> bool:
    """Whether swarm would place a task with these constraints on `node` (a worker)."""
    facts = {"node.role": "worker", "node.hostname": node.hostname, "node.id": node.id}
    for raw in constraints:
        text = raw.replace(" ", "")
        op = "!=" if "!=" in text else "=="
        key, _, value = text.partition(op)
        actual = node.labels.get(key[len("node.labels.") :]) if key.startswith("node.labels.") else None
        actual = facts.get(key, actual)
        if (actual == value) != (op == "=="):
            return False
    return True


@dataclass
class ServiceWorld(World):
    """The world with swarm services (module docstring). Build it with `jobs={}`."""

    service_knobs: ServiceKnobs = field(default_factory=ServiceKnobs)
    replicas: dict[str, int] = field(default_factory=dict)
    specs: dict[str, ServiceSpec] = field(default_factory=dict)
    tasks: dict[str, SimTask] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)  # created -> running, per task that ran
    lost: int = 0  # tasks lost with their node
    _task_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def schedule(self, changes: Iterable[Scale]) -> None:
        """Queue the trace's changes, and the end of each one with a duration unless a later change of
        its service comes first (`sim.servicetrace`)."""
        ordered = sorted(changes, key=lambda c: c.at_s)
        for i, change in enumerate(ordered):
            self.events.push(EPOCH + change.at_s, "scale", (change.spec, change.replicas))
            later = (c.at_s for c in ordered[i + 1 :] if c.spec.name == change.spec.name)
            if change.duration_s is not None and next(later, change.end_s + 1) > change.end_s:
                self.events.push(EPOCH + change.end_s, "scale", (change.spec, 0))

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "scale":
            spec, replicas = payload
            self.specs[spec.name], self.replicas[spec.name] = spec, replicas
            self._reconcile(spec.name)
        elif kind == "task-up":
            task = self.tasks.get(payload)
            if task is not None and task.state == "assigned" and task.desired == "running":
                task.state, task.running_at = "running", self.now
                self.waits.append(self.now - task.created)
        elif kind == "task-gone":
            self.tasks.pop(payload, None)
        else:
            super()._handle(kind, payload)
        self.place()

    # ------------------------------------------------------------------ orchestrator

    def live_tasks(self, service: str) -> list[SimTask]:
        return [t for t in self.tasks.values() if t.spec.name == service and t.desired == "running"]

    def _reconcile(self, service: str) -> None:
        live = self.live_tasks(service)
        want = self.replicas.get(service, 0)
        for _ in range(want - len(live)):
            task_id = f"{service}.{next(self._task_ids):06d}"
            self.tasks[task_id] = SimTask(task_id, self.specs[service], self.now)
        per_node: dict[str, int] = {}
        for t in live:
            per_node[t.node_id] = per_node.get(t.node_id, 0) + 1
        surplus = sorted(live, key=lambda t: (bool(t.node_id), -per_node[t.node_id], -t.created, t.id))
        for task in surplus[: max(0, len(live) - want)]:
            if not task.node_id:
                del self.tasks[task.id]
                continue
            task.desired = "shutdown"
            self.events.push(self.now + self.service_knobs.task_stop_s, "task-gone", task.id)

    # ------------------------------------------------------------------ scheduler

    def on_node(self, node_id: str) -> list[SimTask]:
        return [t for t in self.tasks.values() if t.node_id == node_id and t.state in ON_NODE]

    def place(self) -> None:
        """Give every pending task a node, as swarm's scheduler does (module docstring)."""
        pending = sorted((t for t in self.tasks.values() if t.state == "pending"), key=lambda t: t.id)
        if not pending:
            return
        nodes = {
            n.id: n
            for n in self.nodes.values()
            if n.availability is Availability.ACTIVE and n.status is NodeStatus.READY
        }
        room = {i: self.catalogue[n.type_name].resources for i, n in nodes.items()}
        count: dict[tuple[str, str], int] = {}  # (node id, service or "") -> tasks there
        for t in self.tasks.values():
            if t.node_id in nodes and t.state in ON_NODE:
                room[t.node_id] = room[t.node_id].saturating_sub(t.spec.needs)
                for k in ((t.node_id, t.spec.name), (t.node_id, "")):
                    count[k] = count.get(k, 0) + 1
        for task in pending:
            spec = task.spec
            fits = [
                n for n in nodes.values() if meets(spec.constraints, n) and spec.needs.fits_in(room[n.id])
            ]
            if not fits:
                continue
            # swarm's spread: fewest tasks of the service, then fewest tasks, then node id
            node = min(fits, key=lambda n: (count.get((n.id, spec.name), 0), count.get((n.id, ""), 0), n.id))
            task.node_id, task.state = node.id, "assigned"
            room[node.id] = room[node.id].saturating_sub(spec.needs)
            for k in ((node.id, spec.name), (node.id, "")):
                count[k] = count.get(k, 0) + 1
            self.events.push(self.now + self.service_knobs.task_start_s, "task-up", task.id)

    # ------------------------------------------------------------------ disruption

    def _evict(self, node_id: str, why: str) -> None:
        """The node's tasks are gone (a busy disruption when there were any); swarm re-creates them."""
        tasks = self.on_node(node_id)
        if not tasks:
            return
        node = self.nodes.get(node_id)
        self._violate(f"{why}: node {node.hostname if node else node_id} held {len(tasks)} service task(s)")
        self.lost += len(tasks)
        for task in tasks:
            del self.tasks[task.id]
        for service in sorted({t.spec.name for t in tasks}):
            self._reconcile(service)
        self.place()

    def set_availability(self, node_id: str, availability: Availability) -> None:
        super().set_availability(node_id, availability)
        if availability is Availability.DRAIN:
            self._evict(node_id, "drain set")
        self.place()

    def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        super().add_labels(node_id, labels)
        self.place()

    def _node_of(self, instance_ids: Sequence[str]) -> list[str]:
        return [i.node_id for i in (self.instances.get(x) for x in instance_ids) if i and i.node_id]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        nodes = self._node_of(instance_ids)
        super().terminate(instance_ids)
        for node_id in nodes:
            self._evict(node_id, "terminated its instance")

    def stop(self, instance_ids: Sequence[str]) -> None:
        nodes = self._node_of(instance_ids)
        super().stop(instance_ids)
        for node_id in nodes:
            self._evict(node_id, "stopped its instance")

    def remove_node(self, node_id: str) -> None:
        super().remove_node(node_id)
        self._evict(node_id, "node removed")

    # ------------------------------------------------------------------ the daemon's read

    def swarm_nodes(self) -> tuple[SwarmNode, ...]:
        return tuple(
            SwarmNode(n.as_model(), self.catalogue[n.type_name].resources) for n in self.nodes.values()
        )

    def service_tasks(self) -> tuple[ServiceTask, ...]:
        return tuple(t.as_model() for t in self.tasks.values())


class SimServicesWorkload:
    """The dynamic mode's workload port onto a `ServiceWorld` (module docstring)."""

    def __init__(self, world: ServiceWorld, catalogue: Sequence[InstanceType], policy: Policy) -> None:
        self.world = world
        self.catalogue = tuple(catalogue)
        self.policy = policy
        self._fenced: set[str] = set()  # node ids paused for a fence (daemon memory)

    @property
    def address(self) -> str:
        return "sim-swarm"

    def _view(self, with_pending: bool) -> WorkloadView:
        w = self.world
        return service_view(
            w.swarm_nodes(), w.service_tasks(), self.catalogue, self.policy, SIM_CLUSTER, with_pending
        )

    async def observe(self) -> WorkloadView:
        return self._view(with_pending=True)

    async def list_workers(self) -> tuple[Worker, ...]:
        return self._view(with_pending=False).workers

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Pause these nodes (addresses are node ids)."""
        done = [a for a in addresses if a in self.world.nodes]
        for node_id in done:
            self.world.set_availability(node_id, Availability.PAUSE)
        return tuple(done)

    async def cordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return ()

    async def uncordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return ()

    async def fence(self, hostnames: Sequence[str]) -> Fence:
        wanted = set(hostnames)
        for node in list(self.world.nodes.values()):
            ours = node.as_model().ours
            if node.hostname in wanted and ours and node.availability is Availability.ACTIVE:
                self.world.set_availability(node.id, Availability.PAUSE)
                self._fenced.add(node.id)
        view = self._view(with_pending=False)
        workers = tuple(w for w in view.workers if w.hostname in wanted)
        return Fence(workers, tuple(h for h in busy_hosts(view) if h in wanted))

    async def unfence(self, hostnames: Sequence[str]) -> None:
        wanted = set(hostnames)
        for node in list(self.world.nodes.values()):
            if node.id in self._fenced and node.hostname in wanted:
                self._fenced.discard(node.id)
                if node.availability is Availability.PAUSE:
                    self.world.set_availability(node.id, Availability.ACTIVE)

    async def wait_for_change(self, timeout: float) -> bool:
        return False  # the engine ticks on the virtual clock
