"""The simulated world (EC2, the swarm, the dask scheduler) and the daemon's ports onto it.

`World` is the truth: it outlives daemon restarts. The port classes (`SimCloud`, `SimOrchestrator`,
`SimWorkload`) are the daemon's side: whatever they keep in memory (the capacity back-off cache) is lost
when the simulated daemon restarts, exactly like the real adapters' memory. The daemon's durable state
lives only in instance tags and node marks, which the world keeps.

Machine lifecycle: `launch` creates a *pending* instance; after its join delay it is *running* and its
node joins the swarm (active, ready, carrying the launch labels); a worker starts `worker_start_s` later
on an active node. A never-join instance turns running but its node never appears. Terminating makes
the instance *shutting-down* (listed for `shutdown_s`, then gone), kills its worker and marks its node
down. Draining a node stops its worker; activating it starts one again; a retired worker is restarted
by swarm after `worker_start_s` while its node stays active (docker's default restart policy).

Safety accounting: draining, terminating, removing or retiring a machine whose worker holds tasks (or
the only copy of a result: retiring moves results first) is a
*busy termination*; each one is recorded with its time and reason in `violations`. A machine EC2 gave
notice for is exempt: EC2 takes it anyway (spot, `Knobs.spot_price_factor`: a notice at the rate
`Faults.interruption_after` draws, then EC2 takes the machine `notice_s` later, counted in `reclaims`).

Why one file of this size: the truth and the daemon's ports onto it share the same tables; the port
classes are thin views, and the scheduler's rules are in `sim.scheduler`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm_autoscaler.core.backoff import DEFAULT_INITIAL, DEFAULT_MAXIMUM, CapacityBackoff, launch_subnets
from swarm_autoscaler.core.model import (
    Availability,
    Instance,
    InstanceState,
    InstanceType,
    Node,
    NodeMarks,
    NodeStatus,
    PoolPhase,
    Resources,
    Unavailable,
    Worker,
)
from swarm_autoscaler.core.ports import Fence, LaunchResult, WorkloadView, is_ours
from swarm_autoscaler.errors import ConfigurationError, NotFoundError
from swarm_autoscaler_lab.sim.fences import SimFences
from swarm_autoscaler_lab.sim.scheduler import EventQueue, Scheduler, SimWorker
from swarm_autoscaler_lab.sim.trace import Job

EPOCH = 1_700_000_000.0  # virtual t=0, so that times look like the real epoch seconds the core expects
# The cluster the simulated daemon runs for: its launches carry OWNERSHIP_LABEL=SIM_CLUSTER, and a node
# carrying it is ours (the engine passes the same name to `run_tick`).
SIM_CLUSTER = "sim"
# The subnet of an instance launched without one (EC2 picks): a start refused there backs off that
# (type, subnet) pair only, never the launches that let EC2 pick, as on EC2.
DEFAULT_SUBNET = "subnet-default"


@dataclass(frozen=True, slots=True)
class Knobs:
    """Physical delays of the simulated machines (seconds)."""

    join_s: float = 90.0
    join_jitter_s: float = 30.0
    worker_start_s: float = 20.0
    running_after_s: float = 30.0  # pending -> running for an instance that never joins
    shutdown_s: float = 30.0
    backoff_initial_s: float = DEFAULT_INITIAL  # the daemon's capacity back-off (settings), doubling
    backoff_max_s: float = DEFAULT_MAXIMUM
    pool_start_s: float = 30.0  # a stopped warm-pool machine started: until its node joins
    volume_gib: float = 100.0  # each machine's EBS volume, paid while it is stopped in the warm pool
    gib_month_usd: float = 0.08  # gp3's price per GiB-month
    # The client keeps every result until the last job finished (False: releases each as it arrives).
    hold_results: bool = False
    # The dask scheduler runs the packing preload (`adapters.dask_packing`; False: dask's own objective).
    dask_packing: bool = False
    # Spot: above 0, every machine launched to work is spot, billed at this fraction of its on-demand
    # price, and EC2 may interrupt it (`Faults.interruption_after`): a notice, then the machine is taken
    # `notice_s` later (the daemon sees the notice as `Instance.interrupted_at`, as from the queue).
    spot_price_factor: float = 0.0
    notice_s: float = 120.0


class Faults:
    """Which launches EC2 refuses, which machines never join, when the daemon restarts, and each
    machine's join delay. The base class injects nothing; see `RandomFaults` and `ScriptedFaults`."""

    def refuse(self, call_no: int, type_name: str, subnet_id: str = "") -> bool:
        """Whether the `call_no`-th launch call (one per subnet tried) is refused for capacity."""
        return False

    def never_joins(self, instance_no: int) -> bool:
        return False

    def restart(self, tick_no: int) -> bool:
        return False

    def join_delay(self, instance_no: int, knobs: Knobs) -> float:
        return knobs.join_s

    def refuse_start(self, call_no: int, type_name: str) -> bool:
        """Whether the `call_no`-th start of a warm-pool machine is refused for capacity."""
        return False

    def interruption_after(self, instance_no: int) -> float | None:
        """Seconds from a spot machine's launch to EC2's interruption notice (None: never)."""
        return None


@dataclass(slots=True)
class SimInstance:
    id: str
    no: int
    type_name: str
    launched_at: float
    hostname: str
    tags: Mapping[str, str]
    state: InstanceState = InstanceState.PENDING
    ended_at: float | None = None  # termination requested (billing stops)
    node_id: str | None = None
    view: Instance | None = None
    subnet_id: str = ""
    pool: PoolPhase | None = None
    billed_from: float = 0.0  # start of the stretch not billed yet (running, or stopped: disk only)
    joins: int = 0
    spot: bool = False
    interrupted_at: float | None = None

    def as_model(self) -> Instance:
        if self.view is None:
            self.view = Instance(
                self.id,
                self.type_name,
                self.state,
                self.launched_at,
                self.hostname,
                subnet_id=self.subnet_id,
                tags=self.tags,
                labels=self.tags,  # the launch labels, kept as tags as the EC2 adapter does
                pool=self.pool,
                spot=self.spot,
                interrupted_at=self.interrupted_at,
            )
        return self.view


@dataclass(slots=True)
class SimNode:
    id: str
    hostname: str
    instance_id: str
    type_name: str
    labels: Mapping[str, str]
    availability: Availability = Availability.ACTIVE
    status: NodeStatus = NodeStatus.READY
    marks: NodeMarks = field(default_factory=NodeMarks)
    worker: str | None = None  # worker address
    generation: int = 0  # bumps invalidate scheduled worker starts
    view: Node | None = None

    def as_model(self) -> Node:
        if self.view is None:
            self.view = Node(
                self.id,
                self.hostname,
                self.availability,
                self.status,
                marks=self.marks,
                labels=self.labels,
                ours=is_ours(self.labels, SIM_CLUSTER),
            )
        return self.view


@dataclass(frozen=True, slots=True)
class Violation:
    time_s: float
    what: str


@dataclass
class World:
    catalogue: Mapping[str, InstanceType]
    jobs: Mapping[str, Job]
    overhead: Mapping[str, Resources]
    knobs: Knobs = field(default_factory=Knobs)
    faults: Faults = field(default_factory=Faults)
    now: float = EPOCH
    events: EventQueue = field(default_factory=EventQueue)
    instances: dict[str, SimInstance] = field(default_factory=dict)
    nodes: dict[str, SimNode] = field(default_factory=dict)
    launch_calls: int = 0
    launches: int = 0
    terminations: int = 0
    instance_seconds: float = 0.0
    cost_usd: float = 0.0
    disk_usd: float = 0.0  # EBS volumes of stopped warm-pool machines (part of cost_usd)
    starts: int = 0  # warm-pool machines started
    start_calls: int = 0
    notices: int = 0  # spot interruption notices given
    reclaims: int = 0  # machines EC2 took at the end of a notice (the daemon had not let them go)
    reclaimed_tasks: int = 0  # tasks running or queued on those machines, run again elsewhere
    violations: list[Violation] = field(default_factory=list)
    on_violation: Callable[[Violation], None] | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(
            self.jobs,
            self.events,
            hold=self.knobs.hold_results,
            packing=self.knobs.dask_packing,
            hash_seed=getattr(self.faults, "seed", 0),
        )
        self.fences = SimFences(self.scheduler, self.events)

    # ------------------------------------------------------------------ time

    def advance(self, until: float) -> None:
        """Process every event due at or before `until`, then set the clock to it."""
        while (t := self.events.next_time()) is not None and t <= until:
            time, kind, payload = self.events.pop()
            self.now = time
            self._handle(kind, payload)
        self.now = until

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "done":
            address, key, end = payload
            self.scheduler.finish(address, key, end)
        elif kind == "submit":
            self.scheduler.submit(payload, self.now)
        elif kind == "join":
            self._join(payload)
        elif kind == "running":
            self._set_state(payload, InstanceState.RUNNING)
        elif kind == "prepared":
            self._stop(payload)
        elif kind == "worker":
            node_id, generation = payload
            self._start_worker(node_id, generation)
        elif kind == "gone":
            self.instances.pop(payload, None)
        elif kind == "balance":
            self.scheduler.balance(self.now)
        elif kind == "mover":
            self.scheduler.move_waiting(self.now)
        elif kind == "fence-expired":
            self.fences.expire(payload, self.now)
        elif kind in ("notice", "reclaim"):
            (self._notice if kind == "notice" else self._reclaim)(payload)

    def _notice(self, iid: str) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.ended_at is not None:
            return
        inst.interrupted_at = self.now
        inst.view = None
        self.notices += 1
        self.events.push(self.now + self.knobs.notice_s, "reclaim", iid)

    def _reclaim(self, iid: str) -> None:
        """EC2 takes the machine: what its worker still held runs again elsewhere (not the daemon's
        disruption, so no violation)."""
        inst = self.instances.get(iid)
        if inst is None or inst.ended_at is not None:
            return
        self.reclaims += 1
        node = self.nodes.get(inst.node_id or "")
        worker = self.scheduler.workers.get(node.worker) if node is not None and node.worker else None
        if worker is not None:
            self.reclaimed_tasks += len(worker.running) + len(worker.waiting)
        self.terminate([iid])  # interrupted: `_stop_worker` counts no disruption

    # ------------------------------------------------------------------ EC2

    def alive(self) -> list[SimInstance]:
        return [
            i for i in self.instances.values() if i.state in (InstanceState.PENDING, InstanceState.RUNNING)
        ]

    def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], subnet_id: str = "", pool: bool = False
    ) -> LaunchResult:
        """One RunInstances call in one subnet: all `count` instances, or a capacity refusal."""
        if type_name not in self.catalogue:
            raise ConfigurationError(f"unknown instance type {type_name!r}")
        self.launch_calls += 1
        if self.faults.refuse(self.launch_calls, type_name, subnet_id):
            return LaunchResult(refused=(Unavailable(type_name, self.now, subnet_id),))
        launched = tuple(self._launch_one(type_name, labels, subnet_id, pool) for _ in range(count))
        return LaunchResult(instances=launched)

    def _launch_one(self, type_name: str, labels: Mapping[str, str], subnet_id: str, pool: bool) -> Instance:
        no = next(self._ids)
        inst = SimInstance(
            f"i-{no:08x}",
            no,
            type_name,
            self.now,
            f"ip-10-{no // 65536}-{no // 256 % 256}-{no % 256}",
            dict(labels),
            subnet_id=subnet_id or DEFAULT_SUBNET,  # an instance always lives in a subnet
            pool=PoolPhase.PREPARE if pool else None,
            billed_from=self.now,
            spot=self.knobs.spot_price_factor > 0 and not pool,  # a pool machine is on-demand
        )
        self.instances[inst.id] = inst
        self.launches += 1
        after = self.faults.interruption_after(no) if inst.spot else None
        if after is not None:
            self.events.push(self.now + after, "notice", inst.id)
        if pool:  # boots, runs its boot script and stops itself, never joining
            self.events.push(self.now + self.faults.join_delay(no, self.knobs), "prepared", inst.id)
        elif self.faults.never_joins(no):
            self.events.push(self.now + self.knobs.running_after_s, "running", inst.id)
        else:
            self.events.push(self.now + self.faults.join_delay(no, self.knobs), "join", inst.id)
        return inst.as_model()

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            inst = self.instances.get(iid)
            if inst is None or inst.ended_at is not None:
                continue
            self._bill(inst, self.now)
            inst.ended_at = self.now
            self.terminations += 1
            self._set_state(iid, InstanceState.SHUTTING_DOWN)
            self.events.push(self.now + self.knobs.shutdown_s, "gone", iid)
            node = self.nodes.get(inst.node_id or "")
            if node is not None:
                self._stop_worker(node, f"terminated instance {iid}")
                node.status = NodeStatus.DOWN
                node.view = None

    def _bill(self, inst: SimInstance, until: float) -> None:
        """Bill the stretch since `billed_from`: the type's price while running, the volume while stopped."""
        seconds = max(0.0, until - inst.billed_from)
        inst.billed_from = max(inst.billed_from, until)
        if inst.state is InstanceState.STOPPED:
            disk = seconds * self.knobs.volume_gib * self.knobs.gib_month_usd / (730 * 3600.0)
            self.disk_usd += disk
            self.cost_usd += disk
            return
        self.instance_seconds += seconds
        price = self.catalogue[inst.type_name].price_per_hour or 0.0
        if inst.spot:
            price *= self.knobs.spot_price_factor
        self.cost_usd += seconds * price / 3600.0

    def stop(self, instance_ids: Sequence[str]) -> None:
        """StopInstances: a live machine stops at once (its worker dies with it; its node goes down)."""
        for iid in instance_ids:
            self._stop(iid)

    def _stop(self, iid: str) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.ended_at is not None or inst.state is InstanceState.STOPPED:
            return
        self._bill(inst, self.now)
        self._set_state(iid, InstanceState.STOPPED)
        node = self.nodes.get(inst.node_id or "")
        if node is not None:
            self._stop_worker(node, f"stopped instance {iid}")
            node.status = NodeStatus.DOWN
            node.view = None

    def start(self, instance_ids: Sequence[str]) -> tuple[list[Instance], list[str]]:
        """StartInstances, one call per instance: (started, refused types). A started machine joins
        `pool_start_s` later; its start time becomes its `launched_at`, as on EC2."""
        started: list[Instance] = []
        refused: list[str] = []
        for iid in instance_ids:
            inst = self.instances.get(iid)
            if inst is None or inst.ended_at is not None or inst.state is not InstanceState.STOPPED:
                continue
            self.start_calls += 1
            if self.faults.refuse_start(self.start_calls, inst.type_name):
                refused.append(inst.type_name)
                continue
            self._bill(inst, self.now)
            inst.pool, inst.launched_at = PoolPhase.START, self.now
            self._set_state(iid, InstanceState.PENDING)
            self.starts += 1
            self.events.push(self.now + self.knobs.pool_start_s, "join", iid)
            started.append(inst.as_model())
        return started, refused

    def bill_open(self, until: float) -> None:
        """Bill every instance still alive up to `until` (the end of the run)."""
        for inst in self.instances.values():
            if inst.ended_at is None:
                self._bill(inst, until)
                inst.ended_at = until

    def _set_state(self, iid: str, state: InstanceState) -> None:
        inst = self.instances.get(iid)
        if inst is None or (inst.ended_at is not None and state is not InstanceState.SHUTTING_DOWN):
            return
        inst.state = state
        inst.view = None

    # ------------------------------------------------------------------ swarm

    def _join(self, iid: str) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.ended_at is not None:
            return
        if inst.state is InstanceState.STOPPED:
            return  # stopped before it joined
        self._set_state(iid, InstanceState.RUNNING)
        suffix = f"-{inst.joins}" if inst.joins else ""  # a started pool machine joins as a new node
        inst.joins += 1
        node = SimNode(f"n{inst.no:06d}{suffix}", inst.hostname, iid, inst.type_name, dict(inst.tags))
        self.nodes[node.id] = node
        inst.node_id = node.id
        self._schedule_worker(node)

    def _schedule_worker(self, node: SimNode) -> None:
        node.generation += 1
        self.events.push(self.now + self.knobs.worker_start_s, "worker", (node.id, node.generation))

    def _start_worker(self, node_id: str, generation: int) -> None:
        node = self.nodes.get(node_id)
        if node is None or node.generation != generation or node.worker is not None:
            return
        if node.availability is not Availability.ACTIVE or node.status is not NodeStatus.READY:
            return
        capacity = self.catalogue[node.type_name].resources.saturating_sub(self.overhead_of(node.type_name))
        address = f"tcp://{node.hostname}:8786/{generation}"
        worker = SimWorker(
            address, f"dask-worker-{node.hostname}", node.hostname, node.type_name, capacity, capacity
        )
        worker.cordoned = self.fences.admitted(address, node.hostname, self.now)  # before any task
        node.worker = address
        self.scheduler.add_worker(worker, self.now)

    def overhead_of(self, type_name: str) -> Resources:
        return self.overhead.get(type_name, Resources())

    def _stop_worker(self, node: SimNode, why: str) -> None:
        node.generation += 1
        if node.worker is None:
            return
        worker = self.scheduler.workers.get(node.worker)
        inst = self.instances.get(node.instance_id)
        if inst is not None and inst.interrupted_at is not None:
            worker = None  # EC2 takes (or gave notice it takes) the machine: not a busy disruption
        if worker is not None and worker.busy:
            held = len(worker.running) + len(worker.waiting)
            self._violate(f"{why}: node {node.hostname} held {held} task(s)")
        if worker is not None and worker.held:
            self._violate(f"{why}: node {node.hostname} held the only copy of {len(worker.held)} result(s)")
        self.scheduler.remove_worker(node.worker, self.now)
        node.worker = None

    def _violate(self, what: str) -> None:
        violation = Violation(self.now - EPOCH, what)
        self.violations.append(violation)
        if self.on_violation is not None:
            self.on_violation(violation)

    def set_availability(self, node_id: str, availability: Availability) -> None:
        node = self._node(node_id)
        if node.availability is availability:
            return
        node.availability = availability
        node.view = None
        if availability is Availability.ACTIVE:
            self._schedule_worker(node)
        else:
            self._stop_worker(node, f"{availability} set")

    def mark(self, node_id: str, marks: NodeMarks) -> None:
        node = self._node(node_id)
        node.marks = marks
        node.view = None

    def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        node = self._node(node_id)
        node.labels = {**node.labels, **labels}
        node.view = None

    def remove_node(self, node_id: str) -> None:
        node = self.nodes.pop(node_id, None)
        if node is None:
            return
        self._stop_worker(node, "node removed")
        inst = self.instances.get(node.instance_id)
        if inst is not None and inst.node_id == node_id:
            inst.node_id = None

    def _node(self, node_id: str) -> SimNode:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFoundError(f"node {node_id} is not in the swarm")
        return node

    # ------------------------------------------------------------------ dask

    def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """dask's `retire_workers`: results move first; a worker whose results cannot is kept."""
        retired = []
        by_address = {n.worker: n for n in self.nodes.values() if n.worker is not None}
        kept = self.scheduler.move_results([a for a in addresses if a in by_address])
        for address in addresses:
            node = by_address.get(address)
            if node is None or address in kept:
                continue
            self._stop_worker(node, "worker retired")
            retired.append(address)
            if node.availability is Availability.ACTIVE:
                self._schedule_worker(node)  # swarm restarts the exited container
        return tuple(retired)

    def cordon(self, addresses: Sequence[str], on: bool) -> tuple[str, ...]:
        return tuple(a for a in addresses if self.scheduler.cordon(a, on, self.now))


class SimCloud:
    """The daemon's EC2 adapter onto the world. Like the EC2 adapter, it tries the subnets still open
    for the type in order, moving on after a refusal, and backs a refused (type, subnet) off (doubling
    from `backoff_initial_s` up to `backoff_max_s`); that back-off is daemon memory."""

    def __init__(self, world: World, subnets: Sequence[str] = ()) -> None:
        self.world = world
        self.subnets = launch_subnets(subnets)
        knobs = world.knobs
        self._backoff = CapacityBackoff(knobs.backoff_initial_s, knobs.backoff_max_s)

    def now(self) -> float:
        return self.world.now

    async def list_instances(self) -> tuple[Instance, ...]:
        return tuple(i.as_model() for i in self.world.instances.values())

    async def instance_types(self, names: Sequence[str]) -> tuple[InstanceType, ...]:
        unknown = [n for n in names if n not in self.world.catalogue]
        if unknown:
            raise ConfigurationError(f"unknown instance types: {', '.join(unknown)}")
        return tuple(self.world.catalogue[n] for n in names)

    async def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
    ) -> LaunchResult:
        now = self.world.now
        launched: list[Instance] = []
        refused: list[Unavailable] = []
        for subnet in self._backoff.open_subnets(type_name, self.subnets, now):
            if len(launched) >= count:
                break
            result = self.world.launch(type_name, count - len(launched), labels, subnet, pool)
            if result.refused:
                refused.append(self._backoff.refused(type_name, subnet, now))
                continue
            self._backoff.succeeded(type_name, subnet)
            launched.extend(result.instances)
        if not launched and not refused:
            refused = [u for u in self.unavailable(now) if u.type_name == type_name]
        return LaunchResult(tuple(launched), tuple(refused))

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        self.world.terminate(instance_ids)

    async def start_instances(self, instance_ids: Sequence[str]) -> LaunchResult:
        """As the EC2 adapter: a refused start backs its (type, subnet) off like a refused launch."""
        started, refused_types = self.world.start(instance_ids)
        now = self.world.now
        subnets = {i.id: i.subnet_id for i in self.world.instances.values()}
        refused = []
        for type_name in dict.fromkeys(refused_types):
            subnet = next((subnets[i] for i in instance_ids if i in subnets), "")
            refused.append(self._backoff.refused(type_name, subnet, now))
        return LaunchResult(tuple(started), tuple(refused))

    async def stop_instances(self, instance_ids: Sequence[str]) -> None:
        self.world.stop(instance_ids)

    def unavailable(self, now: float) -> tuple[Unavailable, ...]:
        return self._backoff.unavailable(now)


class SimOrchestrator:
    """The daemon's swarm adapter onto the world."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def list_nodes(self) -> tuple[Node, ...]:
        return tuple(n.as_model() for n in self.world.nodes.values())

    async def set_availability(self, node_id: str, availability: Availability) -> None:
        self.world.set_availability(node_id, availability)

    async def mark(
        self,
        node_id: str,
        marks: NodeMarks,
        labels: Mapping[str, str] | None = None,
        availability: Availability | None = None,
    ) -> None:
        # (one step of the world: nothing runs in between, as in one swarm node update)
        self.world.mark(node_id, marks)
        if labels:
            self.world.add_labels(node_id, labels)
        if availability is not None:
            self.world.set_availability(node_id, availability)

    async def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        self.world.add_labels(node_id, labels)

    async def remove(self, node_id: str) -> None:
        self.world.remove_node(node_id)

    async def join_command(self) -> tuple[str, str]:
        return "SWMTKN-simulated", "10.0.0.1:2377"

    async def manager_addresses(self) -> tuple[str, ...]:
        return ("10.0.0.1:2377",)


class SimWorkload:
    """The daemon's dask adapter onto the world's scheduler."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def observe(self) -> WorkloadView:
        return self.world.scheduler.view(self.world.now)

    async def list_workers(self) -> tuple[Worker, ...]:
        return self.world.scheduler.view(self.world.now).workers

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return self.world.retire(addresses)

    async def cordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return self.world.cordon(addresses, True)

    async def uncordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return self.world.cordon(addresses, False)

    async def fence(self, hostnames: Sequence[str]) -> Fence:
        return self.world.fences.fence(hostnames, self.world.now)

    async def unfence(self, hostnames: Sequence[str]) -> None:
        self.world.fences.unfence(hostnames, self.world.now)

    async def wait_for_change(self, timeout: float) -> bool:
        return False  # the engine ticks on the virtual clock
