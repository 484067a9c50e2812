"""How long act takes to carry out 150 node actions, the shape of the tick that once took 135 s (#11: a
cancelled backlog left every machine idle at once; one tick planned 145 marks and cordons).

What runs: the real `daemon.act.act` with the real swarm adapter (aiodocker over HTTP) against the
in-memory swarm served by the local cloud's Docker Engine API imitation (`localcloud.dockerapi`: 150
nodes, where a real dockerd per node would need ~20 GB), and the real dask adapter against a real dask
scheduler for the fresh read and the cordons. The plan: 60 lifecycle marks, 45 cordons (a mark, then a
scheduler call) and 45 drains, every disruptive one re-checked on a fresh read (one node listing, one
worker read) as in the daemon. Each configuration is repeated; the median and the spread are printed.

Configurations: the default concurrency (16) and one action at a time (the old act), each with the engine
answering at once and with 20 ms per request (a busy swarm manager; a node update is an inspect plus an
update, so 40 ms per action one by one).

With `--dockerd` it also measures a real docker swarm (dockerd 20.10 from Debian, one dockerd per node,
started by `localcloud.dockerd` under its machine-wide lock; needs root): a manager and 3 workers, 150
lifecycle marks, 50 per worker node. One node's actions run one after another (act serialises them), so
this shows what a real manager's raft writes cost rather than the spread over 150 machines.

Run: `python -m bench act [--dockerd]` (or `make bench`); `--quick` does fewer repetitions. Writes
`bench/act_results.json`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("act_results.json")
ROOT = Path(__file__).resolve().parents[1]
CLUSTER = "bench-act"
NODES = 150


def _plan(nodes: list[Any], now: float) -> Any:
    from swarm_autoscaler.core.actions import Cordon, DrainNode, NodeOurs, NodeUpdate, NothingWaits, Plan

    actions: list[Any] = []
    for i, node in enumerate(nodes):
        host = node.hostname
        if i < 60:
            actions.append(NodeUpdate(node.id, "empty", dataclasses.replace(node.marks, empty_since=now)))
        elif i < 105:
            address = f"tcp://10.1.{i // 250}.{i % 250}:8786"
            expect = (NodeOurs(node.id), NothingWaits(host))
            marks = dataclasses.replace(node.marks, cordoned_since=now)
            actions.append(Cordon(node.id, host, (address,), "consolidate", expect, marks))
        else:
            actions.append(DrainNode(node.id, host, "empty", expect=(NodeOurs(node.id),)))
    return Plan(actions=tuple(actions))


async def _once(scheduler_address: str, concurrency: int, latency: float) -> tuple[float, int]:
    """One act over a fresh swarm of NODES nodes; returns (seconds, actions that succeeded)."""
    from swarm_autoscaler.adapters.dask import DaskWorkload
    from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
    from swarm_autoscaler.core.model import OWNERSHIP_LABEL, NodeMarks, Snapshot
    from swarm_autoscaler.daemon.act import ActConfig, Ports, act
    from swarm_autoscaler_lab.localcloud.dockerapi import DockerApi
    from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

    swarm = MemorySwarm(cluster_name=CLUSTER)
    for n in range(NODES):
        node = swarm.join(f"ip-10-1-{n // 250}-{n % 250}", swarm.join_token, {OWNERSHIP_LABEL: CLUSTER})
        swarm.nodes[node.id] = dataclasses.replace(node, marks=NodeMarks(ready=True))
    async with (
        DockerApi(swarm, latency=latency) as api,
        SwarmOrchestrator(api.url, cluster_name=CLUSTER) as orchestrator,
        DaskWorkload(scheduler_address) as workload,
    ):
        nodes = [n for n in await orchestrator.list_nodes() if n.ours]  # the API lists its manager too
        now = time.time()
        snapshot = Snapshot(now, (), (), tuple(nodes), (), ())
        ports = Ports(_NoCloud(), orchestrator, workload)
        started = time.perf_counter()
        outcomes = await act(_plan(nodes, now), snapshot, ports, config=ActConfig(CLUSTER, concurrency))
        seconds = time.perf_counter() - started
    return seconds, sum(1 for o in outcomes if o.ok)


class _NoCloud:
    """Node actions never reach EC2; any call here would be a bug in the benchmark."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the node-action benchmark called Cloud.{name}")


async def measure(repetitions: int) -> list[dict[str, Any]]:
    from distributed import Scheduler

    rows = []
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as sched:
        for latency in (0.0, 0.02):
            for concurrency in (16, 1):
                times, done = [], []
                for _ in range(repetitions):
                    seconds, ok = await _once(sched.address, concurrency, latency)
                    times.append(seconds)
                    done.append(ok)
                rows.append(
                    {
                        "actions": NODES,
                        "concurrency": concurrency,
                        "engine_latency_ms": round(latency * 1000),
                        "repetitions": repetitions,
                        "median_s": round(statistics.median(times), 3),
                        "min_s": round(min(times), 3),
                        "max_s": round(max(times), 3),
                        "succeeded": min(done),
                    }
                )
    return rows


async def measure_dockerd(repetitions: int) -> list[dict[str, Any]]:
    """150 marks over the 3 workers of a real local swarm, at concurrency 16 and 1."""
    import tempfile
    from pathlib import Path

    from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
    from swarm_autoscaler.core.actions import NodeUpdate, Plan
    from swarm_autoscaler.core.model import OWNERSHIP_LABEL, NodeMarks, Snapshot
    from swarm_autoscaler.daemon.act import ActConfig, Ports, act
    from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-act-swarm-") as tmp:
        async with LocalSwarm(Path(tmp) / "swarm") as swarm:
            await swarm.start_manager("ip-10-2-0-1")
            hosts = [f"ip-10-2-0-{n}" for n in (2, 3, 4)]
            await swarm.add_workers(hosts)
            await swarm.wait_nodes(hosts)
            async with SwarmOrchestrator(swarm.manager_url, cluster_name=CLUSTER) as orch:
                workers = [n for n in await orch.list_nodes() if not n.is_manager]
                for node in workers:
                    await orch.add_labels(node.id, {OWNERSHIP_LABEL: CLUSTER})
                for concurrency in (16, 1):
                    times = []
                    for rep in range(repetitions):
                        nodes = tuple(await orch.list_nodes())
                        snapshot = Snapshot(time.time(), (), (), nodes, (), ())
                        marks = tuple(
                            NodeUpdate(
                                workers[i % 3].id, "bench", NodeMarks(empty_since=1e9 + rep * 1000 + i)
                            )
                            for i in range(NODES)
                        )
                        started = time.perf_counter()
                        outcomes = await act(
                            Plan(marks),
                            snapshot,
                            Ports(_NoCloud(), orch, _NoCloud()),  # type: ignore[arg-type]
                            config=ActConfig(CLUSTER, concurrency),
                        )
                        times.append(time.perf_counter() - started)
                        assert all(o.ok for o in outcomes), [o.detail for o in outcomes if not o.ok][:3]
                    rows.append(
                        {
                            "actions": NODES,
                            "concurrency": concurrency,
                            "engine": "dockerd 20.10, 3 worker nodes",
                            "repetitions": repetitions,
                            "median_s": round(statistics.median(times), 3),
                            "min_s": round(min(times), 3),
                            "max_s": round(max(times), 3),
                        }
                    )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'actions':>7}  {'concurrency':>11}  {'engine latency':>14}  {'reps':>4}  {'median':>8}  range"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['actions']:>7}  {r['concurrency']:>11}  {r['engine_latency_ms']:>11} ms  {r['repetitions']:>4}"
            f"  {r['median_s']:>6.2f} s  {r['min_s']:.2f}-{r['max_s']:.2f} s  ({r['succeeded']} ok)"
        )
    return "\n".join(lines)


def main(flags: list[str]) -> None:
    from bench.daemon_bench import _quiet

    _quiet()
    repetitions = 3 if "--quick" in flags else 7
    rows = asyncio.run(measure(repetitions))
    print(_table(rows))
    results: dict[str, Any] = {"engine_api_imitation": rows}
    if "--dockerd" in flags:
        real = asyncio.run(measure_dockerd(repetitions))
        for r in real:
            print(
                f"real swarm ({r['engine']}): {r['actions']} marks at concurrency {r['concurrency']}: "
                f"median {r['median_s']:.2f} s ({r['min_s']:.2f}-{r['max_s']:.2f} s, {r['repetitions']} runs)"
            )
        results["dockerd"] = real
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
