"""Simulator fidelity: the same workloads live and in the simulator, side by side.

Live: the real daemon on the local cloud (moto EC2 over HTTP, a real dask scheduler, the in-memory
swarm, the machine emulator booting each machine `boot + U(0, jitter)` seconds after it appears), and
dask's real `distributed.deploy.Adaptive` on a `SpecCluster` whose workers take the same boot time
before they start. Simulated: `ours` and `adaptive` in `swarm_autoscaler.sim` with the same settings,
joins of `boot + jitter / 2 ± jitter / 2` (the same uniform range) plus the local cloud's measured lag,
and a first tick at each autoscaler's measured reaction (`REACTION_S`). Results are released as they arrive.

Workloads, scaled to seconds (tasks `resources={"CPU": n}` sleeping; machines m5.large, 2 CPUs, 2
threads): a burst of identical tasks, two waves, and a stream of mixed shapes (1 or 2 CPUs) with
Poisson arrivals and durations of 1, 3 and 8 s. Figures: makespan (first submission to last result),
p50 and p95 wait (submission to start), instance-seconds (launch to termination, the scale-in tail
included). The simulator runs five seeds per figure (median); live runs repeat `--reps` times
(default 2, `--quick` 1) and report medians with their spread.

With `--hold`, the client keeps every result until the last one arrived and then releases them all (as
`client.gather` of a whole batch does), and the simulator models it (`Knobs.hold_results`): a worker
holding the only copy of a result is then retired through dask's `retire_workers`, which moves it first.
It also adds `tail`, a burst whose few long jobs keep the run going while the machines that ran short ones
idle with their results. `--policy=ours` (or `adaptive`) runs one side only.

Run: `python -m bench fidelity` (niced: the machine is shared). Writes `bench/fidelity_results.json`
(`bench/fidelity_hold_results.json` with `--hold`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("fidelity_results.json")
HOLD_RESULTS = Path(__file__).with_name("fidelity_hold_results.json")
MODE = {"hold": False}  # --hold: the client keeps every result until the last one arrived
ROOT = Path(__file__).resolve().parents[1]
TYPE = "m5.large"
BOOT_S = 3.0
JITTER_S = 2.0  # EC2's joins spread by about as much as the boot itself
# The local cloud's own delay from a launch to its worker up, beyond the boot time drawn (the emulator's
# 0.3 s poll, RunInstances, the join and the worker's registration): measured, printed as `lag_s`.
EMULATOR_LAG_S = 0.5
SETTINGS = {
    "AUTOSCALER_POLL_INTERVAL": "1s",
    "AUTOSCALER_DRAIN_DELAY": "3s",
    "AUTOSCALER_TERMINATION_DELAY": "3s",
    "AUTOSCALER_MAX_START_TIME": "60s",
}
SIM_SEEDS = 5
# When each autoscaler first acts on work submitted at t=0, as the simulator's first tick: the daemon's
# loop is woken by the scheduler's events and calls RunInstances about 0.2 s later (bench daemon), plus
# the call itself; Adaptive checks every second from its start. Measured live as `first_launch_s`.
REACTION_S = {"ours": 0.5, "adaptive": 1.0}
FIGURES = ("makespan_s", "wait_p50_s", "wait_p95_s", "instance_seconds")


@dataclass(frozen=True)
class Workload:
    name: str
    jobs: tuple[tuple[float, float, int], ...]  # (submit_s, duration_s, cpus)
    max_instances: int


def workloads() -> list[Workload]:
    rng = random.Random(7)
    mixed, t = [], 0.0
    for _ in range(30):
        t += rng.expovariate(1 / 0.5)
        mixed.append((round(t, 2), rng.choice((1.0, 1.0, 3.0, 3.0, 8.0)), rng.choice((1, 1, 2))))
    # With --hold only: a burst with a long tail (four 24 s jobs among 28 short ones), where machines that
    # ran only short jobs sit idle holding results while the long ones run (issue 15's burst tail).
    tail = tuple((0.0, 24.0 if i % 8 == 0 else 2.0, 1) for i in range(32))
    return [
        *((Workload("tail", tail, 4),) if MODE["hold"] else ()),
        Workload("burst", tuple((0.0, 3.0, 1) for _ in range(32)), 4),
        Workload("waves", tuple((0.0 if i < 16 else 15.0, 3.0, 1) for i in range(32)), 4),
        Workload("mixed", tuple(mixed), 4),
    ]


def _quiet() -> None:
    import logging

    import distributed  # noqa: F401 - configures its loggers on import; quiet them afterwards

    from swarm_autoscaler.daemon.logs import configure_logging

    configure_logging("ERROR", "console")
    for name in ("distributed", "werkzeug", "tornado", "swarm_autoscaler"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _task(seconds: float) -> float:
    """The job: returns when it started (workers run in this process: one clock)."""
    started = time.time()
    time.sleep(seconds)
    return started


async def _collect(fut: Any) -> float:
    """A job's start time; its result is released as soon as it arrives, unless `--hold` (then
    `_submit_all` releases every result once the last one arrived)."""
    started = float(await fut)
    if not MODE["hold"]:
        fut.release()
    return started


async def _submit_all(client: Any, w: Workload) -> tuple[float, list[float], float]:
    """Submit each job at its offset; returns (t0, waits, makespan)."""
    t0 = time.time()
    pending, futures = [], []
    for i, (at, seconds, cpus) in enumerate(w.jobs):
        delay = t0 + at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        submitted = time.time()
        # dask's task prefix is the key's name part: one per shape, as the simulator takes a trace's jobs
        # of one shape for one prefix (a trace names no functions)
        key = f"{w.name}-{('one', 'two')[cpus - 1]}-cpu-{i}"
        fut = client.submit(_task, seconds, key=key, resources={"CPU": cpus}, pure=False)
        pending.append((submitted, seconds, asyncio.ensure_future(_collect(fut))))
        futures.append(fut)
    waits, last = [], t0
    for submitted, seconds, started in pending:
        start = await started
        waits.append(start - submitted)
        last = max(last, start + seconds)
    for fut in futures:  # (already released unless --hold)
        fut.release()
    return t0, waits, last - t0


class Ec2Meter:
    """Polls the local EC2 for the cluster's instances: each one's first and last pending/running sight."""

    def __init__(self, endpoint: str, region: str, tags: Mapping[str, str]) -> None:
        import boto3

        self._ec2 = boto3.client(
            "ec2",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        self._filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
        self._filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
        self.seen: dict[str, list[float]] = {}
        self.live = 0
        self.worker_up: dict[str, float] = {}  # instance -> when its worker came up (wall clock)
        self.drawn: dict[str, float] = {}  # instance -> the boot time the emulator drew for it
        self.emulator: Any = None

    def poll(self) -> None:
        now = time.time()
        ids = [
            i["InstanceId"]
            for r in self._ec2.describe_instances(Filters=self._filters)["Reservations"]
            for i in r["Instances"]
        ]
        for iid in ids:
            self.seen.setdefault(iid, [now, now])[1] = now
        self.live = len(ids)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.poll)
            self.note_workers()
            await asyncio.sleep(0.25)

    def note_workers(self) -> None:
        if self.emulator is not None:
            offset = time.time() - asyncio.get_running_loop().time()
            for m in list(self.emulator.machines.values()):
                if m.worker_up_at is not None:
                    self.worker_up.setdefault(m.instance_id, m.worker_up_at + offset)
                    self.drawn[m.instance_id] = m.boot_at - m.seen_at

    def lag(self) -> float:
        """Launch (first sight, 0.25 s resolution) to worker up, less the boot time drawn: the local
        cloud's own delay, which the simulator's join time includes as `EMULATOR_LAG_S`."""
        return _median([up - self.seen[i][0] - self.drawn[i] for i, up in self.worker_up.items()])

    def instance_seconds(self) -> float:
        return sum(last - first for first, last in self.seen.values())


async def live_ours(w: Workload, seed: int) -> dict[str, float]:
    from distributed import Client

    from swarm_autoscaler.localcloud.cloud import LocalCloud, LocalCloudOptions

    options = LocalCloudOptions(
        fast=True, cluster_name=f"fid-{w.name}-{seed}", allowed_types={TYPE: {}}, max_instances=w.max_instances,
        seed=seed,
    )  # fmt: skip
    extra = {**SETTINGS, "AUTOSCALER_EC2_MAX_INSTANCES": str(w.max_instances)}
    async with LocalCloud(options) as lc, lc.daemon(extra) as daemon:
        assert lc.emulator is not None and lc.network is not None
        lc.emulator.boot_delay, lc.emulator.boot_jitter = BOOT_S, JITTER_S
        meter = Ec2Meter(lc.moto.endpoint, lc.network.region, lc.owner_tags())
        meter.emulator = lc.emulator
        stop, metering = asyncio.Event(), asyncio.Event()
        runner = asyncio.create_task(daemon.run(stop))
        meter_task = asyncio.create_task(meter.run(metering))
        try:
            async with Client(lc.scheduler_address, asynchronous=True) as client:  # type: ignore[no-untyped-call]
                t0, waits, makespan = await _submit_all(client, w)
            for _ in range(240):  # the scale-in tail, billed too
                if meter.seen and meter.live == 0:
                    break
                await asyncio.sleep(0.25)
        finally:
            metering.set()
            stop.set()
            await meter_task
            await runner
    first = min(first for first, _ in meter.seen.values()) - t0
    return _figures(waits, makespan, meter.instance_seconds()) | {
        "lag_s": meter.lag(),
        "first_launch_s": round(first, 2),
    }


async def live_adaptive(w: Workload, seed: int) -> dict[str, float]:
    from distributed import Client, Scheduler, SpecCluster, Worker

    rng = random.Random(seed)
    spans: dict[str, list[float]] = {}

    class BootingWorker(Worker):
        """A worker on a machine that takes `BOOT_S + U(0, JITTER_S)` to boot; billed from creation to
        close, like an instance."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._boot = BOOT_S + rng.uniform(0.0, JITTER_S)
            spans[str(self.name)] = [time.time(), 0.0]

        async def start_unsafe(self) -> Any:
            await asyncio.sleep(self._boot)
            return await super().start_unsafe()

        async def close(self, *args: Any, **kwargs: Any) -> Any:
            span = spans.get(str(self.name))
            if span is not None and not span[1]:
                span[1] = time.time()
            return await super().close(*args, **kwargs)

    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": ":0", "port": 0}}
    worker = {
        "cls": BootingWorker,
        "options": {"nthreads": 2, "resources": {"CPU": 2}, "memory_limit": 0, "host": "127.0.0.1"},
    }
    async with SpecCluster(scheduler=scheduler, worker=worker, asynchronous=True) as cluster:  # type: ignore[no-untyped-call]
        cluster.adapt(minimum=0, maximum=w.max_instances, interval="1s")
        async with Client(cluster, asynchronous=True) as client:  # type: ignore[no-untyped-call]
            t0, waits, makespan = await _submit_all(client, w)
        for _ in range(240):
            if spans and all(end for _, end in spans.values()):
                break
            await asyncio.sleep(0.25)
        end = time.time()
    seconds = sum((e or end) - s for s, e in spans.values())
    first = min(s for s, _ in spans.values()) - t0
    return _figures(waits, makespan, seconds) | {"first_launch_s": round(first, 2)}


def _figures(waits: Sequence[float], makespan: float, instance_seconds: float) -> dict[str, float]:
    from swarm_autoscaler.sim.report import percentile

    return {
        "makespan_s": round(makespan, 2),
        "wait_p50_s": round(percentile(sorted(waits), 50), 2),
        "wait_p95_s": round(percentile(sorted(waits), 95), 2),
        "instance_seconds": round(instance_seconds, 1),
    }


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 2) if values else float("nan")


def simulated(w: Workload, policy: str) -> list[dict[str, float]]:
    """`policy` on `w` in the simulator, one summary per seed."""
    from swarm_autoscaler.sim.config import load_sim_settings
    from swarm_autoscaler.sim.faults import RandomFaults
    from swarm_autoscaler.sim.runner import default_options, run_trace
    from swarm_autoscaler.sim.trace import Job

    env = {
        **SETTINGS,
        "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps({TYPE: {}}),
        "AUTOSCALER_EC2_MAX_INSTANCES": str(w.max_instances),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fidelity.env"
        path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
        settings = load_sim_settings(path)
    jobs = [Job(i, at, seconds, float(cpus), 0.0, 0) for i, (at, seconds, cpus) in enumerate(w.jobs)]
    options = default_options(
        settings,
        join_s=BOOT_S + JITTER_S / 2 + EMULATOR_LAG_S,
        join_jitter_s=JITTER_S / 2,
        worker_start_s=0.0,
        hold_results=MODE["hold"],
    )
    options = dataclasses.replace(options, first_tick_s=REACTION_S[policy])
    out = []
    for seed in range(SIM_SEEDS):
        _, summary = run_trace(jobs, settings, policy, options, RandomFaults(seed, 0.0, {}, 0.0))
        out.append({k: float(summary[k]) for k in FIGURES})
    return out


def _medians(runs: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    return {
        k: {
            "median": _median([r[k] for r in runs]),
            "min": min(r[k] for r in runs),
            "max": max(r[k] for r in runs),
        }
        for k in FIGURES
    }


def measure(reps: int, names: Sequence[str], policies: Sequence[str] = ()) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for w in workloads():
        if names and w.name not in names:
            continue
        row: dict[str, Any] = {}
        for policy, live in (("ours", live_ours), ("adaptive", live_adaptive)):
            if policies and policy not in policies:
                continue
            runs = []
            for rep in range(reps):
                runs.append(asyncio.run(live(w, rep)))
                print(f"  {w.name} {policy} live #{rep}: {runs[-1]}", flush=True)
            row[policy] = {"live": _medians(runs), "sim": _medians(simulated(w, policy)), "live_runs": runs}
        results[w.name] = row
    return results


def table(results: Mapping[str, Any]) -> str:
    lines = [
        f"{'workload':<8} {'figure':<16} {'ours live':>16} {'ours sim':>9} {'sim/live':>8}"
        f" {'adaptive live':>16} {'adapt sim':>9} {'sim/live':>8}"
    ]
    for name, row in results.items():
        for k in FIGURES:
            cells = []
            for policy in ("ours", "adaptive"):
                if policy not in row:
                    cells.append(f"{'-':>16} {'-':>9} {'-':>8}")
                    continue
                live, sim = row[policy]["live"][k], row[policy]["sim"][k]["median"]
                spread = f"{live['median']:g} ({live['min']:g}-{live['max']:g})"
                ratio = sim / live["median"] if live["median"] else float("nan")
                cells.append(f"{spread:>16} {sim:>9g} {ratio:>8.2f}")
            lines.append(f"{name:<8} {k:<16} {cells[0]} {cells[1]}")
    return "\n".join(lines)


def markdown(results: Mapping[str, Any]) -> str:
    """The README's table: live medians (min-max over the repetitions), simulated medians, ratios."""
    lines = [
        "| workload | figure | ours live | ours sim | sim/live | adaptive live | adaptive sim | sim/live |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        for k in FIGURES:
            cells = []
            for policy in ("ours", "adaptive"):
                if policy not in row:
                    cells += ["-", "-", "-"]
                    continue
                live, sim = row[policy]["live"][k], row[policy]["sim"][k]["median"]
                ratio = sim / live["median"] if live["median"] else float("nan")
                cells += [f"{live['median']:g} ({live['min']:g}-{live['max']:g})", f"{sim:g}", f"{ratio:.2f}"]
            lines.append(f"| {name} | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(flags: list[str]) -> None:
    with contextlib.suppress(OSError):
        os.nice(10)
    reps = 1 if "--quick" in flags else 2
    for flag in flags:
        if flag.startswith("--reps="):
            reps = int(flag.split("=", 1)[1])
    names = [f.split("=", 1)[1] for f in flags if f.startswith("--workload=")]
    policies = [f.split("=", 1)[1] for f in flags if f.startswith("--policy=")]
    MODE["hold"] = hold = "--hold" in flags
    _quiet()
    results = measure(reps, names, policies)
    print(table(results))
    print(markdown(results))
    out = HOLD_RESULTS if hold else RESULTS
    out.write_text(
        json.dumps({"reps": reps, "hold": hold, "results": results}, indent=2, sort_keys=True) + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
