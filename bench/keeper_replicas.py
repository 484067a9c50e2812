"""The keeper at scale as deployed: 1,000 clusters with usage accounting on, in 1 and in 3 replicas, each
replica its own process (`bench/keeper_replica.py`) sharing one real redis-server for the leases, the
replicas' presence, the usage ledger and the budgets.

A run starts the replicas, waits until each has its presence in redis, then tells them all to go (each
counts the replicas, lists the clusters and starts a task per cluster, as `Keeper.run` does). A **full
pass** is over when every cluster has been checked once by whichever replica holds its lease, and every
replica's first usage pass (a reading of the 3,000 machines recorded in the ledger) is recorded: its time
runs from the first replica's go to the last of those events. Also per replica: the leases it held, the
clusters it checked, its own pass, its first budget read and its peak resident memory (`ru_maxrss`); and
the peak of redis' connected clients during the run. Targets: a full pass within 5 s, at most 300 MB a
replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

CLUSTERS = 1000
ROOT = Path(__file__).resolve().parent.parent
WITHIN_S = 60.0  # a run that has not finished its pass by then is reported as such


@dataclass
class Run:
    """One run of `replicas` replicas."""

    replicas: int
    pass_s: float | None = None  # None: the pass did not finish within WITHIN_S
    finals: list[dict[str, Any]] = field(default_factory=list)
    redis_clients: int = 0  # the peak of redis' connected clients (the bench's own included)

    @property
    def split(self) -> list[int]:
        return [len(f["checked"]) for f in self.finals]

    @property
    def covered(self) -> int:
        return len({c for f in self.finals for c in f["checked"]})

    @property
    def rss_mb(self) -> list[float]:
        return [f["rss_mb"] for f in self.finals]


async def _lines(proc: asyncio.subprocess.Process, state: dict[str, Any]) -> None:
    assert proc.stdout is not None
    async for raw in proc.stdout:
        try:
            message = json.loads(raw)
        except ValueError:
            print(f"    replica said: {raw.decode(errors='replace').rstrip()}", file=sys.stderr)
            continue
        if "final" in message:
            state["final"] = message["final"]
        else:
            state.update(message)


async def _clients_peak(client: aioredis.Redis, run: Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        info = await client.info("clients")
        run.redis_clients = max(run.redis_clients, int(info["connected_clients"]))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.02):
                await stop.wait()


async def one_run(replicas: int, url: str) -> Run:
    name = f"bench-{uuid.uuid4().hex[:8]}"  # a fresh keeper in redis: leases, ledger, budgets
    run = Run(replicas)
    command = (sys.executable, "-m", "bench.keeper_replica", url, name)
    pipe = asyncio.subprocess.PIPE
    procs = [
        await asyncio.create_subprocess_exec(*command, stdin=pipe, stdout=pipe, cwd=ROOT)
        for _ in range(replicas)
    ]
    states: list[dict[str, Any]] = [{} for _ in procs]
    readers = [asyncio.create_task(_lines(p, s)) for p, s in zip(procs, states, strict=True)]
    client = aioredis.Redis.from_url(url)
    watching = asyncio.Event()
    peak = asyncio.create_task(_clients_peak(client, run, watching))
    try:
        await _until(lambda: all(s.get("ready") for s in states), 60.0, "a replica never got ready", readers)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        with contextlib.suppress(TimeoutError):
            await _until(
                lambda: (
                    sum(s.get("checked", 0) for s in states) >= CLUSTERS
                    and all(s.get("usage") for s in states)
                ),
                WITHIN_S,
                "",
                readers,
            )
        watching.set()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"stop\n")
            await proc.stdin.drain()
        await asyncio.wait_for(asyncio.gather(*readers), 60.0)
        for proc in procs:
            await asyncio.wait_for(proc.wait(), 30.0)
    finally:
        watching.set()
        await peak
        await client.aclose()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    run.finals = [s["final"] for s in states]
    run.pass_s = _pass_s(run.finals)
    return run


def _pass_s(finals: list[dict[str, Any]]) -> float | None:
    """From the first go to the last first check or first usage pass; None when any is missing or the
    clusters checked do not cover every cluster."""
    if len({c for f in finals for c in f["checked"]}) < CLUSTERS:
        return None
    ends = [f["last_first_check"] for f in finals if f["checked"]] + [f["usage_pass_at"] for f in finals]
    if None in ends:
        return None
    return float(max(ends) - min(f["went"] for f in finals))


async def _until(predicate: Any, within: float, what: str, readers: list[asyncio.Task[None]]) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        for reader in readers:
            if reader.done() and reader.exception() is not None:
                raise RuntimeError(f"a replica's output could not be read: {reader.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)


def _figure(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def measure(repeats: int) -> dict[int, list[Run]]:
    """`repeats` runs of 1 replica and of 3, interleaved (a slow moment of the host hits both)."""
    runs: dict[int, list[Run]] = {1: [], 3: []}
    with RedisServer() as server:
        for _ in range(repeats):
            for replicas, group in runs.items():
                group.append(asyncio.run(one_run(replicas, server.url)))
    return runs


def report(runs: dict[int, list[Run]]) -> dict[str, Any]:
    """Print the side-by-side table; return its figures (for the results file)."""
    one, three = runs[1], runs[3]
    print(
        f"{CLUSTERS} clusters, usage accounting on ({3 * CLUSTERS} machines) and a default budget, each "
        f"replica a process on one real redis-server, {len(one)} runs each:"
    )
    rows: dict[str, Any] = {}
    for label, group in (("1 replica", one), ("3 replicas", three)):
        passes = [r.pass_s for r in group]
        done = [p for p in passes if p is not None]
        rows[label] = {
            "pass_s": passes,
            "rss_mb": [max(r.rss_mb) for r in group],
            "split": [r.split for r in group],
            "redis_clients": [r.redis_clients for r in group],
        }
        unfinished = len(passes) - len(done)
        print(
            f"  {label:10}  full pass {_figure(done) if done else '-'} s"
            + (f", {unfinished} run(s) unfinished within {WITHIN_S:.0f} s" if unfinished else "")
            + f"; peak RSS per replica {_figure([m for r in group for m in r.rss_mb])} MB"
            + f"; redis clients at peak {max(r.redis_clients for r in group)}"
        )
        for r in group:
            own = [
                f["last_first_check"] - f["went"] if f["checked"] else 0.0
                for f in r.finals  # each replica's own pass over its clusters
            ]
            usage = [f["usage_pass_at"] - f["went"] for f in r.finals if f["usage_pass_at"]]
            budgets = [f["budgets_read_at"] - f["went"] for f in r.finals if f["budgets_read_at"]]
            print(
                f"      split {r.split} (covers {r.covered}), leases {[f['held'] for f in r.finals]}, "
                f"pass {'-' if r.pass_s is None else f'{r.pass_s:.3f}'} s, checks done by "
                f"{_seconds(own)}, usage pass by {_seconds(usage)}, budgets read by {_seconds(budgets)}, "
                f"RSS {[round(m) for m in r.rss_mb]} MB"
            )
    p1 = [r.pass_s for r in one if r.pass_s is not None]
    p3 = [r.pass_s for r in three if r.pass_s is not None]
    if p1 and p3:
        ratio = statistics.median(p3) / statistics.median(p1)
        rss = statistics.median(rows["3 replicas"]["rss_mb"]) / statistics.median(rows["1 replica"]["rss_mb"])
        print(f"  3 replicas / 1 replica: full pass x{ratio:.2f}, peak RSS per replica x{rss:.2f}")
        rows["ratio_pass"], rows["ratio_rss"] = round(ratio, 3), round(rss, 3)
    print("  targets: a full pass within 5 s, at most 300 MB per replica")
    return rows


def _seconds(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "] s"
