"""How long the daemon's act takes to drain a 1,000-node fleet when every Docker Engine API request
takes 50 ms: 1,000 node actions (each node's drain with its `drained_since` mark, one job), carried out
tick after tick as the daemon does, with the daemon's tick deadline (two 1 s poll intervals) and the
default concurrency, until every node is drained. A tick re-plans only the nodes not yet drained.

What runs: the real `daemon.act.act`, the real swarm adapter (aiodocker over HTTP) against the local
cloud's Docker Engine API imitation (`localcloud.dockerapi`) over an in-memory swarm of 1,000 nodes, and
the real dask adapter against a real dask scheduler for the fresh reads. The progress rule
(docs/liveness.md) is what makes the figure finite: a drain running at the deadline finishes, and what
has not started is left to the next tick, never cancelled and re-planned behind the same queue.

Run: `python -m bench drain` (or `make bench`); `--quick` drains 200 nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

CLUSTER = "bench-drain"
LATENCY = 0.05
DEADLINE = 2.0  # the daemon's: TICK_DEADLINE_POLLS (2) x a 1 s poll interval


class _NoCloud:
    """Node actions never reach EC2; any call here would be a bug in the benchmark."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the drain benchmark called Cloud.{name}")


def _plan(nodes: list[Any], now: float) -> Any:
    from swarm_autoscaler.core.actions import DrainNode, NodeOurs, Plan
    from swarm_autoscaler.core.model import Availability

    actions: list[Any] = []
    for node in nodes:
        if node.availability is not Availability.ACTIVE:
            continue
        marks = dataclasses.replace(node.marks, drained_since=now)
        actions.append(DrainNode(node.id, node.hostname, "empty", (NodeOurs(node.id),), marks))
    return Plan(actions=tuple(actions))


async def drain(count: int, scheduler_address: str) -> dict[str, Any]:
    from swarm_autoscaler.adapters.dask import DaskWorkload
    from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
    from swarm_autoscaler.core.model import OWNERSHIP_LABEL, NodeMarks, Snapshot
    from swarm_autoscaler.daemon.act import ActConfig, Ports, act
    from swarm_autoscaler_lab.localcloud.dockerapi import DockerApi
    from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

    swarm = MemorySwarm(cluster_name=CLUSTER)
    for n in range(count):
        node = swarm.join(f"ip-10-3-{n // 250}-{n % 250}", swarm.join_token, {OWNERSHIP_LABEL: CLUSTER})
        swarm.nodes[node.id] = dataclasses.replace(node, marks=NodeMarks(ready=True))
    ticks, deferred, longest = 0, 0, 0.0
    async with (
        DockerApi(swarm, latency=LATENCY) as api,
        SwarmOrchestrator(api.url, cluster_name=CLUSTER) as orchestrator,
        DaskWorkload(scheduler_address) as workload,
    ):
        ports = Ports(_NoCloud(), orchestrator, workload)
        started = time.perf_counter()
        while True:
            tick_started = time.perf_counter()
            nodes = [n for n in await orchestrator.list_nodes() if n.ours]  # observe
            plan = _plan(nodes, time.time())
            if not plan.actions:
                break
            snapshot = Snapshot(time.time(), (), (), tuple(nodes), (), ())
            outcomes = await act(plan, snapshot, ports, config=ActConfig(CLUSTER, deadline=DEADLINE))
            ticks += 1
            deferred += sum(1 for o in outcomes if o.kind == "deadline")
            longest = max(longest, time.perf_counter() - tick_started)
        seconds = time.perf_counter() - started
    return {
        "nodes": count,
        "engine_latency_ms": round(LATENCY * 1000),
        "seconds": round(seconds, 1),
        "ticks": ticks,
        "deferred": deferred,
        "longest_tick_s": round(longest, 2),
    }


async def measure(count: int) -> dict[str, Any]:
    from distributed import Scheduler

    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as sched:
        return await drain(count, sched.address)


def main(flags: list[str]) -> None:
    count = 200 if "--quick" in flags else 1000
    row = asyncio.run(measure(count))
    print(
        f"drained {row['nodes']} nodes (engine {row['engine_latency_ms']} ms a request) in {row['seconds']} s: "
        f"{row['ticks']} ticks, {row['deferred']} actions left to a next tick, longest tick {row['longest_tick_s']} s"
    )
