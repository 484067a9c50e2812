"""The daemon's own figures, measured on the local cloud (moto EC2 over HTTP, a real dask scheduler,
emulated machines, the in-memory swarm) and, for memory, over in-memory fakes in a subprocess:

- latency: a task submitted to the scheduler (unrunnable: no worker can run it) until the daemon's
  `Ec2Cloud.launch` is entered (the RunInstances request follows at once) and until RunInstances
  answered; the real loop with the default 5 s poll interval, woken by scheduler events;
- EC2 API calls per idle tick (our adapter's count and the moto server's count) for 1, 10, 50 instances;
- launch attempts per joined instance with 30% capacity refusals of the preferred type;
- peak resident memory (VmHWM) of a daemon ticking over 1,000 instances and 30,000 tasks.

Run: `python -m bench daemon` (or `make bench`). `--quick` runs fewer trials. Writes
`bench/daemon_results.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("daemon_results.json")
ROOT = Path(__file__).resolve().parents[1]
TYPES = {"m5.large": {}, "m5.xlarge": {}}
NO_JOIN = {"AUTOSCALER_MAX_START_TIME": "3600s"}


def _quiet() -> None:
    import logging

    import distributed  # noqa: F401 - configures its loggers on import; quiet them afterwards

    from swarm_autoscaler.runtime.logs import configure_logging

    configure_logging("ERROR", "console")
    for name in ("distributed", "werkzeug", "tornado", "swarm_autoscaler"):
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.asynccontextmanager
async def _cloud(name: str, extra: Mapping[str, str], **opts: Any) -> AsyncIterator[tuple[Any, Any]]:
    from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions

    options = LocalCloudOptions(cluster_name=name, allowed_types=dict(TYPES), max_instances=60, **opts)
    async with LocalCloud(options) as lc, lc.daemon(dict(extra)) as daemon:
        yield lc, daemon


def _timed_launches(daemon: Any) -> list[tuple[float, float]]:
    """Wrap the daemon's Ec2Cloud.launch; returns the list it appends (entered, answered) times to."""
    ec2 = daemon.ports.cloud.inner
    inner = ec2.launch
    seen: list[tuple[float, float]] = []

    async def launch(type_name: str, count: int, labels: Mapping[str, str]) -> Any:
        entered = time.time()
        try:
            return await inner(type_name, count, labels)
        finally:
            seen.append((entered, time.time()))

    ec2.launch = launch
    return seen


async def _until(predicate: Callable[[], bool], seconds: float, step: float) -> None:
    """Poll `predicate` every `step` seconds for at most `seconds` (the caller checks the outcome)."""
    for _ in range(int(seconds / step)):
        if predicate():
            return
        await asyncio.sleep(step)


async def _until_room(daemon: Any, count: int, seconds: float) -> None:
    """Wait until the workers together have room for `count` of the benchmark's 2-CPU tasks."""
    for _ in range(int(seconds / 0.2)):
        view = await daemon.ports.workload.observe()
        if sum(int(w.resources.cpus // 2) for w in view.workers) >= count:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no room for task {count} after {seconds:g}s")


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


async def bench_latency(trials: int) -> dict[str, Any]:
    """Each trial submits one task needing a whole m5.large; machines never join, so every trial needs
    a new launch (the earlier ones stay in flight and hold the earlier tasks)."""
    from distributed import Client

    from swarm_autoscaler.core.model import GIB

    extra = {"AUTOSCALER_POLL_INTERVAL": "5s", **NO_JOIN}
    async with _cloud("bench-latency", extra, never_join_rate=1.0) as (lc, daemon):
        seen = _timed_launches(daemon)
        stop = asyncio.Event()
        runner = asyncio.create_task(daemon.run(stop))
        to_call: list[float] = []
        to_answer: list[float] = []
        async with Client(lc.scheduler_address, asynchronous=True) as client:  # type: ignore[no-untyped-call]
            await asyncio.sleep(6.0)  # past the first tick: the loop is in its 5 s wait
            held = []  # a released future's task is forgotten by the scheduler
            for i in range(trials):
                before = len(seen)
                submitted = time.time()
                held.append(
                    client.submit(
                        _sleep, 1.0, key=f"trial-{i}", resources={"CPU": 2.0, "RAM": 6.0 * GIB}, pure=False
                    )
                )
                await _until(lambda: len(seen) > before, 15.0, 0.005)  # noqa: B023 - awaited at once
                if len(seen) == before:
                    raise RuntimeError(f"trial {i}: no launch within 15 s")
                entered, answered = seen[before]
                to_call.append(entered - submitted)
                to_answer.append(answered - submitted)
                await asyncio.sleep(1.0 + (i % 5) * 0.37)  # vary the phase against the poll interval
        stop.set()
        await runner
    return {
        "trials": trials,
        "poll_interval_s": 5.0,
        "to_launch_call_s": _stats(to_call),
        "to_run_instances_answered_s": _stats(to_answer),
    }


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "median": round(statistics.median(ordered), 3),
        "p95": round(p95, 3),
        "max": round(ordered[-1], 3),
    }


async def bench_idle_calls(sizes: tuple[int, ...], ticks: int) -> list[dict[str, Any]]:
    """The fleet grows to each size through the daemon (min_instances); machines never join, so no
    dask worker per instance is needed. Once a plan has no action, count the calls of `ticks` ticks."""
    out = []
    for size in sizes:
        extra = {"AUTOSCALER_EC2_MIN_INSTANCES": str(size), **NO_JOIN}
        async with _cloud(f"bench-idle-{size}", extra, never_join_rate=1.0, min_instances=size) as (
            lc,
            daemon,
        ):
            for _ in range(10):
                result = await daemon.tick_once()
                if result is not None and not result.plan.actions and len(result.snapshot.instances) == size:
                    break
            else:
                raise RuntimeError(f"fleet of {size} never settled")
            ec2 = daemon.ports.cloud.inner
            ours, server = ec2.stats.total_api_calls, sum(lc.moto.faults.calls().values())
            for _ in range(ticks):
                result = await daemon.tick_once()
                assert result is not None and not result.plan.actions
            out.append(
                {
                    "instances": size,
                    "ticks": ticks,
                    "api_calls_per_tick": (ec2.stats.total_api_calls - ours) / ticks,
                    "server_calls_per_tick": (sum(lc.moto.faults.calls().values()) - server) / ticks,
                    "by_operation": dict(ec2.stats.api_calls),
                }
            )
    return out


async def bench_refusals(waves: int) -> dict[str, Any]:
    """30% of RunInstances of the preferred type (m5.large) are refused. Each wave submits a task that
    needs one whole m5.large and holds it, and starts when the previous one runs: a wave needs a new
    machine, except when a fallback m5.xlarge still has room for a second task."""
    from distributed import Client

    from swarm_autoscaler.core.model import GIB

    extra = {"AUTOSCALER_POLL_INTERVAL": "2s"}
    async with _cloud("bench-refusals", extra, fast=True) as (lc, daemon):
        lc.moto.faults.refuse("m5.large", probability=0.3)
        seen = _timed_launches(daemon)
        stop = asyncio.Event()
        runner = asyncio.create_task(daemon.run(stop))
        async with Client(lc.scheduler_address, asynchronous=True) as client:  # type: ignore[no-untyped-call]
            futures = []
            for i in range(waves):
                futures.append(
                    client.submit(
                        _sleep, 600.0, key=f"hold-{i}", resources={"CPU": 2.0, "RAM": 6.0 * GIB}, pure=False
                    )
                )
                # the next wave starts once the workers have room for every task so far (dask may keep
                # a task queued behind a busy worker even then: it does not move it to a new one)
                await _until_room(daemon, i + 1, 60.0)
            joined = len(lc.orchestrator.nodes)  # type: ignore[union-attr]
            for f in futures:
                await f.cancel()
        stop.set()
        await runner
        stats = daemon.ports.cloud.inner.stats
    return {
        "waves": waves,
        "joined_instances": joined,
        "run_instances_calls": stats.launch_calls,
        "capacity_refusals": stats.capacity_refusals,
        "instances_launched": stats.instances_launched,
        "launch_actions": len(seen),
        "run_instances_per_joined": round(stats.launch_calls / max(joined, 1), 3),
        "launch_actions_per_joined": round(len(seen) / max(joined, 1), 3),
        "instances_launched_per_joined": round(stats.instances_launched / max(joined, 1), 3),
    }


def bench_memory() -> dict[str, Any]:
    """Runs `_memory_child` in a fresh interpreter and reads the figures it prints."""
    done = subprocess.run(
        [sys.executable, "-c", "import bench.daemon_bench as b; b._memory_child()"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _memory_child(instances: int = 1_000, tasks: int = 30_000, ticks: int = 5) -> None:
    from tests.fakes import FakeCloud, FakeLock, FakeWorkload, SteppedClock

    from swarm_autoscaler.core.catalogue import CATALOGUE
    from swarm_autoscaler.core.model import (
        GIB,
        OWNERSHIP_LABEL,
        Instance,
        InstanceState,
        Policy,
        Resources,
        Task,
        TypePolicy,
        Worker,
    )
    from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
    from swarm_autoscaler.daemon.tick import Ports
    from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

    _quiet()
    baseline = _vm("VmRSS")
    clock = SteppedClock()
    catalogue = {n: CATALOGUE[n] for n in ("m5.large", "m5.xlarge", "r5.large")}
    cloud = FakeCloud(clock, catalogue)
    swarm = MemorySwarm(cluster_name="bench")
    workers = []
    per_worker = tasks // (2 * instances)
    for i in range(instances):
        host = f"ip-10-{i // 250}-{i % 250}-1"
        itype = ("m5.large", "m5.xlarge")[i % 2]
        cloud.instances[f"i-{i:08x}"] = Instance(
            f"i-{i:08x}",
            itype,
            InstanceState.RUNNING,
            clock.now - 3600,
            host,
            tags={"swarm-autoscaler/type": itype},
        )
        swarm.join(host, swarm.join_token, {"type": itype, OWNERSHIP_LABEL: "bench"})
        busy = tuple(Task(f"run-{i}-{j}", Resources(1, GIB)) for j in range(per_worker))
        workers.append(Worker(f"tcp://10.0.{i}:1", f"worker-{host}", host, catalogue[itype].resources, busy))
    unrunnable = [Task(f"wait-{k}", Resources(1 + k % 3, (1 + k % 5) * GIB)) for k in range(tasks // 2)]
    workload = FakeWorkload(workers=workers, unrunnable=unrunnable)
    policy = Policy(
        allowed_types=tuple(TypePolicy(n) for n in catalogue),
        min_instances=0,
        max_instances=instances + 50,
        max_start_time=300,
        drain_delay=30,
        termination_delay=60,
    )
    daemon = Daemon(
        "bench",
        Ports(InFlightCloud(cloud, clock), swarm, workload),
        FakeLock("a"),
        policy,
        catalogue,
        5.0,
    )
    started = time.perf_counter()
    last: list[Any] = []

    async def ticks_() -> None:
        for _ in range(ticks):
            result = await daemon.tick_once()
            assert result is not None
            last[:] = [result]
            clock.step(5)

    asyncio.run(ticks_())
    print(
        json.dumps(
            {
                "instances": instances,
                "tasks": tasks,
                "ticks": ticks,
                "observed": [
                    len(last[0].snapshot.instances),
                    len(last[0].snapshot.workers),
                    len(last[0].snapshot.unrunnable),
                ],
                "pending": last[0].plan.pending,
                "seconds_per_tick": round((time.perf_counter() - started) / ticks, 3),
                "baseline_rss_mb": round(baseline / 1024, 1),
                "peak_rss_mb": round(_vm("VmHWM") / 1024, 1),
            }
        )
    )


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _table(results: dict[str, Any]) -> str:
    lat = results["latency"]
    rows = [
        (
            "unrunnable -> launch call, median / p95",
            f"{lat['to_launch_call_s']['median']} s / {lat['to_launch_call_s']['p95']} s",
            "< 1 s / < 2 s",
        ),
        (
            "unrunnable -> RunInstances answered, median / p95",
            f"{lat['to_run_instances_answered_s']['median']} s / {lat['to_run_instances_answered_s']['p95']} s",
            "",
        ),
    ]
    for idle in results["idle_calls"]:
        rows.append(
            (
                f"EC2 calls per idle tick, {idle['instances']} instances",
                f"{idle['api_calls_per_tick']:g} (server {idle['server_calls_per_tick']:g})",
                "<= 3",
            )
        )
    ref = results["refusals"]
    rows.append(
        (
            "RunInstances calls per joined instance (30% refused)",
            f"{ref['run_instances_per_joined']} ({ref['run_instances_calls']}/{ref['joined_instances']})",
            "<= 1.1",
        )
    )
    rows.append(
        (
            "launch actions per joined instance (30% refused)",
            f"{ref['launch_actions_per_joined']} ({ref['launch_actions']}/{ref['joined_instances']})",
            "<= 1.1",
        )
    )
    mem = results["memory"]
    rows.append(
        (
            f"peak RSS, {mem['instances']} instances + {mem['tasks']} tasks",
            f"{mem['peak_rss_mb']} MB ({mem['seconds_per_tick']} s/tick)",
            "< 200 MB",
        )
    )
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value:<28}  {target}" for name, value, target in rows)


def main(flags: list[str]) -> None:
    quick = "--quick" in flags
    _quiet()

    async def measure() -> dict[str, Any]:
        return {
            "latency": await bench_latency(8 if quick else 20),
            "idle_calls": await bench_idle_calls((1, 10, 50), 3 if quick else 5),
            "refusals": await bench_refusals(10 if quick else 30),
        }

    results = asyncio.run(measure())
    results["memory"] = bench_memory()
    print(_table(results))
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
