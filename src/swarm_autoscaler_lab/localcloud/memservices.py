"""Swarm services on an in-memory swarm: what the dynamic mode's demo and chaos world run for the daemon to scale.

`MemoryServices` keeps replicated services and their tasks beside a `MemorySwarm` and plays swarm's
orchestrator and scheduler on the wall clock, as `sim.swarmsim.ServiceWorld` does on the virtual one
(same constraint matching, `sim.swarmsim.meets`; same spread; room is the machine type's whole capacity
less the reservations there). The Docker Engine API imitation (`localcloud.dockerapi`) serves its
`GET /services` and `GET /tasks` in docker's JSON, so the daemon's own swarm services adapter reads them.

Call `step()` often (the demo does, every 0.1 s): it drops the tasks of nodes that are gone, down or
drained (a task that was on such a node is a *busy disruption*, kept in `disruptions`), retires stopped
tasks, starts assigned ones, re-creates missing replicas and places pending tasks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from swarm_autoscaler.core.model import Availability, InstanceType, NodeStatus, Resources
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.sim.servicetrace import ServiceSpec
from swarm_autoscaler_lab.sim.swarmsim import meets

ON_NODE = ("assigned", "running")


@dataclass(slots=True)
class MemTask:
    id: str
    service_id: str
    spec: ServiceSpec
    created: float
    state: str = "pending"
    desired: str = "running"
    node_id: str = ""
    hostname: str = ""
    due: float = 0.0  # assigned: when it runs; shutting down: when it is gone


@dataclass
class MemoryServices:
    """Replicated services on `swarm`; `type_of(hostname)` names the machine type of a node's host."""

    swarm: MemorySwarm
    type_of: Callable[[str], str | None]
    catalogue: Mapping[str, InstanceType]
    start_s: float = 0.5
    stop_s: float = 0.5
    clock: Callable[[], float] = time.monotonic
    replicas: dict[str, int] = field(default_factory=dict)
    specs: dict[str, ServiceSpec] = field(default_factory=dict)
    tasks: dict[str, MemTask] = field(default_factory=dict)
    disruptions: list[str] = field(default_factory=list)
    placed: list[tuple[float, str, str, str]] = field(default_factory=list)  # (t, task, host, type)
    waits: list[float] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def scale(self, spec: ServiceSpec, replicas: int) -> None:
        self.specs[spec.name], self.replicas[spec.name] = spec, replicas

    def service_id(self, name: str) -> str:
        return f"svc-{name}"

    # ------------------------------------------------------------------ swarm's loop

    def step(self) -> None:
        now = self.clock()
        for task in list(self.tasks.values()):
            self._follow(task, now)
        for name in sorted(self.specs):
            self._reconcile(name, now)
        self._place(now)

    def _follow(self, task: MemTask, now: float) -> None:
        if not task.node_id:
            return
        node = self.swarm.nodes.get(task.node_id)
        if node is None or node.status is not NodeStatus.READY or node.availability is Availability.DRAIN:
            why = "gone" if node is None else "down" if node.status is not NodeStatus.READY else "drained"
            self.disruptions.append(f"{task.id} lost: its node {task.hostname} is {why}")
            del self.tasks[task.id]
        elif task.desired == "shutdown" and now >= task.due:
            del self.tasks[task.id]
        elif task.state == "assigned" and now >= task.due:
            task.state = "running"
            self.waits.append(now - task.created)

    def _reconcile(self, name: str, now: float) -> None:
        live = [t for t in self.tasks.values() if t.spec.name == name and t.desired == "running"]
        want = self.replicas.get(name, 0)
        for _ in range(want - len(live)):
            task_id = f"{name}.{next(self._ids):04d}"
            self.tasks[task_id] = MemTask(task_id, self.service_id(name), self.specs[name], now)
        for task in sorted(live, key=lambda t: (bool(t.node_id), -t.created, t.id))[
            : max(0, len(live) - want)
        ]:
            if not task.node_id:
                del self.tasks[task.id]
            else:
                task.desired, task.due = "shutdown", now + self.stop_s

    def _room(self, hostname: str) -> Resources | None:
        itype = self.catalogue.get(self.type_of(hostname) or "")
        return itype.resources if itype is not None else None

    def _place(self, now: float) -> None:
        pending = sorted((t for t in self.tasks.values() if t.state == "pending"), key=lambda t: t.id)
        if not pending:
            return
        nodes = {
            n.id: n
            for n in self.swarm.nodes.values()
            if not n.is_manager and n.status is NodeStatus.READY and n.availability is Availability.ACTIVE
        }
        room = {i: r for i, n in nodes.items() if (r := self._room(n.hostname)) is not None}
        count: dict[tuple[str, str], int] = {}
        for t in self.tasks.values():
            if t.node_id in room and t.state in ON_NODE:
                room[t.node_id] = room[t.node_id].saturating_sub(t.spec.needs)
                for k in ((t.node_id, t.spec.name), (t.node_id, "")):
                    count[k] = count.get(k, 0) + 1
        for task in pending:
            spec = task.spec
            fits = [i for i in room if meets(spec.constraints, nodes[i]) and spec.needs.fits_in(room[i])]
            if not fits:
                continue
            node_id = min(fits, key=lambda i: (count.get((i, spec.name), 0), count.get((i, ""), 0), i))
            hostname = nodes[node_id].hostname
            task.node_id, task.hostname, task.state, task.due = (
                node_id,
                hostname,
                "assigned",
                now + self.start_s,
            )
            room[node_id] = room[node_id].saturating_sub(spec.needs)
            for k in ((node_id, spec.name), (node_id, "")):
                count[k] = count.get(k, 0) + 1
            self.placed.append((now, task.id, hostname, self.type_of(hostname) or "?"))

    # ------------------------------------------------------------------ what the engine API serves

    def on_node(self) -> dict[str, list[MemTask]]:
        out: dict[str, list[MemTask]] = {}
        for t in self.tasks.values():
            if t.node_id and t.state in ON_NODE:
                out.setdefault(t.node_id, []).append(t)
        return out

    def node_resources(self, hostname: str) -> dict[str, Any] | None:
        """The machine's whole capacity, as its engine reports it (before the daemon labels the node)."""
        room = self._room(hostname)
        if room is None:
            return None
        generic = [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": room.gpus}}] if room.gpus else []
        # a machine's other resources (its GPUs' memory, VRAM) as the node-generic-resource its engine has
        generic += [{"DiscreteResourceSpec": {"Kind": k, "Value": int(v)}} for k, v in room.generic]
        return {"NanoCPUs": int(room.cpus * 1e9), "MemoryBytes": room.ram, "GenericResources": generic}

    def services_json(self) -> list[dict[str, Any]]:
        return [
            {
                "ID": self.service_id(name),
                "Spec": {
                    "Name": name,
                    "Mode": {"Replicated": {"Replicas": self.replicas[name]}},
                    "Labels": {},
                },
            }
            for name in sorted(self.specs)
        ]

    def tasks_json(self) -> list[dict[str, Any]]:
        return [_task_json(t) for t in sorted(self.tasks.values(), key=lambda t: t.id)]


def _task_json(task: MemTask) -> dict[str, Any]:
    spec = task.spec
    reservations: dict[str, Any] = {"NanoCPUs": int(spec.cpus * 1e9), "MemoryBytes": spec.needs.ram}
    if spec.gpus:
        reservations["GenericResources"] = [{"DiscreteResourceSpec": {"Kind": "gpu", "Value": spec.gpus}}]
    status: dict[str, Any] = {"State": task.state}
    if task.state == "pending":
        status["Err"] = "no suitable node (insufficient resources or unmet constraints)"
    return {
        "ID": task.id,
        "ServiceID": task.service_id,
        "NodeID": task.node_id,
        "DesiredState": task.desired,
        "Status": status,
        "Spec": {
            "Resources": {"Reservations": reservations},
            "Placement": {"Constraints": list(spec.constraints)},
        },
    }
