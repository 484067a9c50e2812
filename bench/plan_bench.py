"""Latency of `plan()` on large, varied snapshots.

For each size (tasks x nodes x allowed instance types) a snapshot is generated with a fixed seed:
a few dozen task shapes (some pinned to a type, a few needing a GPU), machines in every bucket
(active with busy, over-full and idle workers, drained, reserve, joining, launched, broken, down,
terminating, retiring, managers) and a couple of types EC2 refuses. About a third of the tasks are
processing on workers (some workers hold more than they can run, so the estimated queue is exercised),
the rest are unrunnable. Prints a table and writes `bench/results.json`.

Dynamic mode's row: 10,000 pending swarm service tasks (reservations of the same shapes, some pinned with
`node.labels.instance-type==T`, a few with a constraint no launch meets) and 1,000 nodes (active with
running tasks, idle, drained, paused; global agents on every node), timed as one tick plans it: the pure
translation of the tasks into the workload (`core.services.service_view`) plus `plan()`.

A real region's catalogue: the row `region` plans 10,000 tasks x 1,000 nodes with every type moto offers in
us-east-1 (hundreds), read as the daemon reads them (DescribeInstanceTypes, every page, through the EC2
adapter, from a local moto server) and priced at the bundled catalogue's approximate figure for the types
it has, else at a rate per vCPU, GiB and GPU (the bench needs a price, not the right one).

Run: `python -m bench plan` (or `make bench`). `--quick` runs fewer repetitions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.core.actions import Plan
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.cluster import TYPE_LABEL
from swarm_autoscaler.core.model import (
    GIB,
    OWNERSHIP_LABEL,
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
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.services import ServiceTask, SwarmNode, service_view
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY, MotoServer

SIZES = ((1_000, 100, 10), (10_000, 1_000, 60), (30_000, 1_000, 60))
DYNAMIC_SIZE = (10_000, 1_000, 60)  # pending service tasks x nodes x allowed types
RESULTS = Path(__file__).with_name("results.json")
NOW = 1_700_000_000.0
FAMILIES = (("m5", 4.0, 0.048), ("c5", 2.0, 0.0425), ("r5", 8.0, 0.063), ("m6i", 4.0, 0.048))
SIZES_X = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 72, 96, 128, 192)


def make_types(count: int) -> tuple[InstanceType, ...]:
    """`count` types across a few families and sizes, plus GPU types; some without a known price."""
    out: list[InstanceType] = []
    for size in SIZES_X:
        for family, gib_per_cpu, price in FAMILIES:
            cpus = 2 * size
            known = (size + len(family)) % 7 != 0
            out.append(
                InstanceType(
                    f"{family}.{size}x",
                    Resources(cpus, int(cpus * gib_per_cpu * GIB)),
                    price * cpus if known else None,
                )
            )
    gpus = [InstanceType(f"g5.{n}x", Resources(4 * n, 16 * n * GIB, n), 1.0 * n) for n in (1, 2, 4, 8)]
    return tuple(gpus[: max(1, count // 10)] + out[: count - max(1, count // 10)])


def make_shapes(rng: random.Random, types: tuple[InstanceType, ...]) -> list[tuple[Resources, str | None]]:
    """About three dozen task shapes; a few pinned to a type, a few needing a GPU."""
    shapes: list[tuple[Resources, str | None]] = []
    for cpus in (0.5, 1, 2, 4, 8, 16):
        for gib in (1, 2, 4, 8, 16, 32):
            shapes.append((Resources(cpus, gib * GIB), None))
    for _ in range(6):
        itype = rng.choice(types)
        shapes.append((Resources(1, 2 * GIB, 1 if itype.resources.gpus else 0), itype.name))
    shapes.append((Resources(2, 8 * GIB, 1), None))
    shapes.append((Resources(1024, GIB), None))  # unplaceable: no type has that many cpus
    return shapes


def make_snapshot(
    n_tasks: int, n_nodes: int, n_types: int, seed: int = 7, catalogue: tuple[InstanceType, ...] = ()
) -> tuple[Snapshot, Policy]:
    rng = random.Random(seed)
    types = catalogue or make_types(n_types)
    shapes = make_shapes(rng, types)
    weights = [8 if s[1] is None and s[0].cpus <= 4 else 1 for s in shapes]
    tasks = [Task(f"t{i}", *rng.choices(shapes, weights)[0]) for i in range(n_tasks)]
    processing, unrunnable = tasks[: n_tasks // 3], tasks[n_tasks // 3 :]
    instances, nodes, workers = _machines(rng, n_nodes, types, processing)
    policy = Policy(
        allowed_types=tuple(TypePolicy(t.name, reserve=1, overhead=Resources(0.1, GIB // 2)) for t in types),
        min_instances=2,
        max_instances=n_nodes * 3,
        max_start_time=600,
        drain_delay=60,
        termination_delay=120,
    )
    unavailable = (Unavailable(types[2].name, NOW + 60), Unavailable(types[5].name, NOW - 1))
    return Snapshot(
        NOW, types, tuple(instances), tuple(nodes), tuple(workers), tuple(unrunnable), unavailable
    ), policy


_BUCKETS = (
    ("active", 70),
    ("idle", 6),
    ("drained", 8),
    ("joining", 4),
    ("launched", 4),
    ("broken", 2),
    ("down", 2),
    ("terminating", 2),
    ("retiring", 2),
)


def _machines(
    rng: random.Random, n_nodes: int, types: tuple[InstanceType, ...], processing: list[Task]
) -> tuple[list[Instance], list[Node], list[Worker]]:
    instances: list[Instance] = []
    nodes: list[Node] = []
    workers: list[Worker] = []
    kinds = rng.choices([k for k, _ in _BUCKETS], [w for _, w in _BUCKETS], k=n_nodes)
    busy: list[int] = []  # indexes into `workers` of the workers that get processing tasks
    for i, kind in enumerate(kinds):
        itype = types[i % len(types)]
        host = f"ip-10-{i // 65536}-{i // 256 % 256}-{i % 256}"
        age = 100.0 if kind in ("joining", "launched") else 5000.0
        state = InstanceState.SHUTTING_DOWN if kind == "terminating" else InstanceState.RUNNING
        instances.append(Instance(f"i-{i:08x}", itype.name, state, NOW - age, host))
        if kind in ("launched", "broken"):
            continue
        nodes.append(_node(i, host, kind))
        if kind in ("active", "idle", "retiring"):
            if kind == "active":
                busy.append(len(workers))
            workers.append(
                Worker(f"tcp://{host}:8786", host, host, itype.resources, retiring=kind == "retiring")
            )
    for index, queue in zip(busy, _deal(rng, processing, len(busy)), strict=True):
        w = workers[index]
        workers[index] = Worker(w.address, w.name, w.hostname, w.resources, tuple(queue), rng.random() < 0.05)
    managers = [
        Node(f"mgr{j}", f"manager-{j}", Availability.ACTIVE, NodeStatus.READY, is_manager=True)
        for j in range(3)
    ]
    return instances, nodes + managers, workers


def _node(i: int, host: str, kind: str) -> Node:
    marks = NodeMarks(ready=kind not in ("joining",))
    availability = Availability.ACTIVE
    status = NodeStatus.READY
    if kind == "drained":
        availability = Availability.DRAIN
        marks = NodeMarks(ready=True, drained_since=NOW - 30 * (i % 10))
    elif kind == "idle":
        marks = NodeMarks(ready=True, empty_since=NOW - 20 * (i % 10))
    elif kind == "down":
        status = NodeStatus.DOWN
        marks = NodeMarks(ready=True, down_since=NOW - 100 * (i % 5))
    return Node(f"n{i}", host, availability, status, marks=marks)


def _deal(rng: random.Random, tasks: list[Task], n_queues: int) -> list[list[Task]]:
    """Spread processing tasks over busy workers, unevenly (some get far more than they can run)."""
    queues: list[list[Task]] = [[] for _ in range(n_queues)]
    if not queues:
        return queues
    hot = max(1, n_queues // 10)
    for task in tasks:
        index = rng.randrange(hot) if rng.random() < 0.3 else rng.randrange(n_queues)
        queues[index].append(task)
    return queues


TARGET_MS = 100.0  # the 10,000 x 1,000 x 60 median on this 2-core machine


def _timed(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return round(statistics.median(times), 2), round(p95, 2)


def measure(
    n_tasks: int, n_nodes: int, n_types: int, repeats: int, catalogue: tuple[InstanceType, ...] = ()
) -> dict[str, float | int | str]:
    snapshot, policy = make_snapshot(n_tasks, n_nodes, n_types, catalogue=catalogue)
    first = plan(snapshot, policy)  # warm-up, and a sanity check that the scenario does something
    assert first.actions and first.pending
    median, p95 = _timed(lambda: plan(snapshot, policy), repeats)
    return {
        "workload": "region" if catalogue else "dask",
        "tasks": n_tasks,
        "nodes": n_nodes,
        "instance_types": len(snapshot.instance_types),
        "median_ms": median,
        "p95_ms": p95,
    }


CLUSTER = "bench"


def make_service_world(
    n_pending: int, n_nodes: int, n_types: int, seed: int = 11
) -> tuple[
    tuple[SwarmNode, ...], tuple[ServiceTask, ...], tuple[InstanceType, ...], tuple[Instance, ...], Policy
]:
    """Dynamic mode's world: swarm nodes with their tasks, and `n_pending` tasks waiting for a node."""
    rng = random.Random(seed)
    types = make_types(n_types)
    shapes = make_shapes(rng, types)
    weights = [8 if s[1] is None and s[0].cpus <= 4 else 1 for s in shapes]
    seats: list[SwarmNode] = []
    instances: list[Instance] = []
    tasks: list[ServiceTask] = []
    kinds = rng.choices(["active", "idle", "drained", "paused"], [75, 10, 10, 5], k=n_nodes)
    for i, kind in enumerate(kinds):
        itype = types[i % len(types)]
        host = f"ip-10-{i // 65536}-{i // 256 % 256}-{i % 256}"
        instances.append(Instance(f"i-{i:08x}", itype.name, InstanceState.RUNNING, NOW - 5000.0, host))
        availability = {"drained": Availability.DRAIN, "paused": Availability.PAUSE}.get(
            kind, Availability.ACTIVE
        )
        marks = NodeMarks(
            ready=True,
            drained_since=NOW - 30 * (i % 10) if kind == "drained" else None,
            empty_since=NOW - 20 * (i % 10) if kind == "idle" else None,
        )
        labels = {TYPE_LABEL: itype.name, OWNERSHIP_LABEL: CLUSTER}
        node = Node(f"n{i}", host, availability, NodeStatus.READY, marks=marks, labels=labels, ours=True)
        seats.append(SwarmNode(node, itype.resources))
        tasks.append(ServiceTask(f"agent-{i}", "agent", "running", node_id=node.id, global_service=True))
        if kind == "active":
            for j in range(rng.randint(1, 3)):
                needs = Resources(min(1.0, itype.resources.cpus / 4), GIB // 2)
                tasks.append(ServiceTask(f"run-{i}-{j}", f"svc{j}", "running", node_id=node.id, needs=needs))
    for k in range(n_pending):
        needs, pin = rng.choices(shapes, weights)[0]
        constraints = (f"node.labels.{TYPE_LABEL}=={pin}",) if pin else ()
        if k % 500 == 0:
            constraints = ("node.labels.zone==eu",)  # no launch meets it: unplaceable
        tasks.append(ServiceTask(f"p{k}", f"svc{k % 40}", "pending", needs=needs, constraints=constraints))
    managers = [
        SwarmNode(Node(f"mgr{j}", f"manager-{j}", Availability.ACTIVE, NodeStatus.READY, is_manager=True))
        for j in range(3)
    ]
    policy = Policy(
        allowed_types=tuple(TypePolicy(t.name, overhead=Resources(0.1, GIB // 2)) for t in types),
        min_instances=2,
        max_instances=n_nodes * 3,
        max_start_time=600,
        drain_delay=60,
        termination_delay=120,
    )
    return tuple(seats + managers), tuple(tasks), types, tuple(instances), policy


def measure_dynamic(n_pending: int, n_nodes: int, n_types: int, repeats: int) -> dict[str, float | int | str]:
    seats, tasks, types, instances, policy = make_service_world(n_pending, n_nodes, n_types)

    def tick() -> Plan:
        view = service_view(seats, tasks, types, policy, CLUSTER)
        nodes = tuple(s.node for s in seats)
        return plan(Snapshot(NOW, types, instances, nodes, view.workers, view.unrunnable), policy)

    first = tick()
    assert first.actions and first.pending == n_pending and first.unplaceable
    median, p95 = _timed(tick, repeats)
    # plan() alone, on the translated view (the figure; the row's median adds the translation)
    view = service_view(seats, tasks, types, policy, CLUSTER)
    snapshot = Snapshot(NOW, types, instances, tuple(s.node for s in seats), view.workers, view.unrunnable)
    plan_median, plan_p95 = _timed(lambda: plan(snapshot, policy), repeats)
    return {
        "plan_median_ms": plan_median,
        "plan_p95_ms": plan_p95,
        "workload": "swarm services",
        "tasks": n_pending,
        "nodes": n_nodes,
        "instance_types": n_types,
        "median_ms": median,
        "p95_ms": p95,
    }


def region_types(region: str = "us-east-1") -> tuple[InstanceType, ...]:
    """Every type moto offers in `region`, described through the EC2 adapter from a local moto server,
    priced (see the module doc). The GPU types first, as `make_types` puts them."""
    return asyncio.run(_region_types(region))


async def _region_types(region: str) -> tuple[InstanceType, ...]:
    with MotoServer() as server:
        cloud = Ec2Cloud(
            cluster_name="bench",
            region=region,
            endpoint=server.endpoint,
            access_key_id=LOCAL_ACCESS_KEY,
            secret_access_key=LOCAL_SECRET_KEY,
            allowed_types={},
            subnet_ids=(),
            security_group_ids=(),
            join_command=_no_join,
        )
        async with cloud:
            described = await cloud.offered_types()
            offered = await cloud._pages(
                "describe_instance_type_offerings",
                "InstanceTypeOfferings",
                page_size=1000,
                LocationType="region",
                Filters=[{"Name": "location", "Values": [region]}],
            )
    names = {o["InstanceType"] for o in offered}
    priced = [dataclasses.replace(t, price_per_hour=_approximate(t)) for t in described if t.name in names]
    return tuple(sorted(priced, key=lambda t: (-t.resources.gpus, t.name)))


def _approximate(t: InstanceType) -> float:
    known = CATALOGUE.get(t.name)
    price = known.price_per_hour if known is not None else None
    return price if price is not None else _rate(t.resources)


def _rate(r: Resources) -> float:
    return round(0.024 * r.cpus + 0.003 * r.ram / GIB + 0.5 * r.gpus, 4)


async def _no_join() -> tuple[str, str]:
    return "", ""


def main(flags: list[str]) -> None:
    repeats = 5 if "--quick" in flags else 21
    rows = [measure(t, n, k, repeats) for t, n, k in SIZES]
    rows.append(measure(10_000, 1_000, 0, repeats, catalogue=region_types()))
    rows.append(measure_dynamic(*DYNAMIC_SIZE, repeats))
    print(f"{'workload':>15} {'tasks':>8} {'nodes':>6} {'types':>6} {'median ms':>10} {'p95 ms':>8}")
    for row in rows:
        sizes = f"{row['workload']:>15} {row['tasks']:>8} {row['nodes']:>6} {row['instance_types']:>6}"
        print(f"{sizes} {row['median_ms']:>10} {row['p95_ms']:>8}")
        if "plan_median_ms" in row:
            print(f"{'  of which plan()':>37} {row['plan_median_ms']:>10} {row['plan_p95_ms']:>8}")
    print(
        f"target: {TARGET_MS:g} ms median for 10,000 x 1,000 x 60 and for the region's catalogue (plan() alone)"
    )
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main(sys.argv[1:])
