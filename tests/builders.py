"""Builders for the core's plain data, with sane defaults, so planner tests stay short.

Machines are numbered: machine `n` is instance `i-000n` with hostname `ip-10-0-0-n`, whose node is
`node-n` and whose worker listens on `tcp://10.0.0.n:8786`. Times are relative to `NOW`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from swarm_autoscaler.core.model import (
    GIB,
    Availability,
    Instance,
    InstanceState,
    InstanceType,
    Node,
    NodeMarks,
    NodeStatus,
    Policy,
    Resources,
    Snapshot,
    Task,
    TypePolicy,
    Unavailable,
    Worker,
)

NOW = 1_000_000.0
Machine = tuple[Instance, Node, Worker | None]  # what `machine()` builds and `assemble()` takes


def make_instance_type(
    name: str = "m5.large",
    cpus: float = 2,
    ram_gib: float = 8,
    gpus: int = 0,
    price: float | None = 0.096,
    **generic: float,
) -> InstanceType:
    return InstanceType(name, Resources.of(cpus, int(ram_gib * GIB), gpus, **generic), price)


# A small catalogue: two general-purpose sizes, a compute type and a GPU type.
CATALOGUE: tuple[InstanceType, ...] = (
    make_instance_type("m5.large", 2, 8, price=0.096),
    make_instance_type("m5.xlarge", 4, 16, price=0.192),
    make_instance_type("c5.2xlarge", 8, 16, price=0.34),
    make_instance_type("g4dn.xlarge", 4, 16, gpus=1, price=0.526),
)


def hostname(n: int) -> str:
    return f"ip-10-0-{n // 250}-{n % 250}"


def make_instance(
    n: int = 1,
    type_name: str = "m5.large",
    state: InstanceState = InstanceState.RUNNING,
    age: float = 1000.0,
    host: str | None = None,
) -> Instance:
    return Instance(f"i-{n:04d}", type_name, state, NOW - age, host or hostname(n))


def make_node(
    n: int = 1,
    availability: Availability = Availability.ACTIVE,
    status: NodeStatus = NodeStatus.READY,
    marks: NodeMarks = NodeMarks(ready=True),
    host: str | None = None,
    manager: bool = False,
    labels: Mapping[str, str] | None = None,
    ours: bool = True,
) -> Node:
    return Node(
        f"node-{n}",
        host or hostname(n),
        availability,
        status,
        is_manager=manager,
        marks=marks,
        labels=MappingProxyType(dict(labels or {})),
        ours=ours and not manager,
    )


def make_task(
    key: str = "t",
    cpus: float = 1,
    ram_gib: float = 1,
    gpus: int = 0,
    pinned: str | None = None,
    **generic: float,
) -> Task:
    return Task(key, Resources.of(cpus, int(ram_gib * GIB), gpus, **generic), pinned)


def make_tasks(count: int, prefix: str = "t", **shape: float | str | None) -> tuple[Task, ...]:
    return tuple(make_task(f"{prefix}{i}", **shape) for i in range(count))  # type: ignore[arg-type]


def worker_address(n: int) -> str:
    """The address of machine `n`'s worker (`make_worker`)."""
    return f"tcp://10.0.{n // 250}.{n % 250}:8786"


def make_worker(
    n: int = 1,
    cpus: float = 2,
    ram_gib: float = 8,
    gpus: int = 0,
    processing: Iterable[Task] = (),
    unique: bool = False,
    retiring: bool = False,
    host: str | None = None,
) -> Worker:
    name = host or hostname(n)
    return Worker(
        worker_address(n),
        name,
        name,
        Resources.of(cpus, int(ram_gib * GIB), gpus),
        processing=tuple(processing),
        has_unique_data=unique,
        retiring=retiring,
    )


def make_snapshot(
    instances: Iterable[Instance] = (),
    nodes: Iterable[Node] = (),
    workers: Iterable[Worker] = (),
    unrunnable: Iterable[Task] = (),
    types: Iterable[InstanceType] = CATALOGUE,
    unavailable: Iterable[Unavailable] = (),
    now: float = NOW,
    queued: Iterable[Task] = (),
) -> Snapshot:
    return Snapshot(
        now=now,
        instance_types=tuple(types),
        instances=tuple(instances),
        nodes=tuple(nodes),
        workers=tuple(workers),
        unrunnable=tuple(unrunnable),
        unavailable=tuple(unavailable),
        queued=tuple(queued),
    )


def make_policy(
    types: Iterable[str | TypePolicy] = ("m5.large", "m5.xlarge", "c5.2xlarge", "g4dn.xlarge"),
    min_instances: int = 0,
    max_instances: int = 10,
    max_start_time: float = 600.0,
    drain_delay: float = 60.0,
    termination_delay: float = 120.0,
    node_down_timeout: float = 300.0,
    max_launch_per_tick: int = 0,
    consolidate_below: float = 0.5,
    tolerated_wait: float = 120.0,
) -> Policy:
    allowed = tuple(t if isinstance(t, TypePolicy) else TypePolicy(t) for t in types)
    return Policy(
        allowed_types=allowed,
        min_instances=min_instances,
        max_instances=max_instances,
        max_start_time=max_start_time,
        drain_delay=drain_delay,
        termination_delay=termination_delay,
        node_down_timeout=node_down_timeout,
        max_launch_per_tick=max_launch_per_tick,
        consolidate_below=consolidate_below,
        tolerated_wait=tolerated_wait,
    )


def machine(
    n: int,
    type_name: str = "m5.large",
    *,
    cpus: float | None = None,
    processing: Iterable[Task] = (),
    unique: bool = False,
    retiring: bool = False,
    worker: bool = True,
    availability: Availability = Availability.ACTIVE,
    status: NodeStatus = NodeStatus.READY,
    marks: NodeMarks = NodeMarks(ready=True),
    age: float = 1000.0,
    manager: bool = False,
) -> Machine:
    """An owned machine that joined: its instance, node and (unless `worker=False`) worker. The worker's
    resources are the type's (from CATALOGUE) unless `cpus` is given."""
    itype = next(t for t in CATALOGUE if t.name == type_name)
    w = None
    if worker:
        res = itype.resources
        w = make_worker(
            n,
            cpus if cpus is not None else res.cpus,
            res.ram / GIB,
            res.gpus,
            processing=processing,
            unique=unique,
            retiring=retiring,
        )
    node = make_node(n, availability, status, marks, manager=manager)
    return make_instance(n, type_name, age=age), node, w


def assemble(
    *machines: tuple[Instance | None, Node | None, Worker | None],
    unrunnable: Iterable[Task] = (),
    **kwargs: object,
) -> Snapshot:
    """A snapshot made of `machine()` tuples (any part may be None) plus unrunnable tasks."""
    return make_snapshot(
        instances=[i for i, _, _ in machines if i is not None],
        nodes=[n for _, n, _ in machines if n is not None],
        workers=[w for _, _, w in machines if w is not None],
        unrunnable=unrunnable,
        **kwargs,  # type: ignore[arg-type]
    )


def unlabelled(parts: Machine) -> Machine:
    """A machine whose node does not carry the ownership label (yet)."""
    inst, node, worker = parts
    return inst, replace(node, ours=False), worker


def launch_reason(tasks: int, type_name: str) -> str:
    """The reason of the Launch scale-up plans for `tasks` pending tasks on new `type_name` machines."""
    return f"{tasks} pending task(s) need new capacity; cheapest fitting type: {type_name}"
