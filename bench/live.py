"""Live runs shared by `python -m bench fidelity` and `python -m bench peer`: one workload of sleeping dask
tasks run by the real daemon on the local cloud (`live_ours`), or by dask's real
`distributed.deploy.Adaptive` on a `SpecCluster` whose workers sleep through the same boot before they
start (`live_adaptive`), metered the same way.

Both sides: machines are m5.large (2 CPUs, 2 threads, `resources={"CPU": 2}`), each booting in
`boot_s + U(0, jitter_s)` seconds from its launch; tasks are submitted at their offsets with
`resources={"CPU": n}`, one dask task prefix per shape. Figures (`figures`): makespan (first submission to
last result), p50 and p95 wait (submission to start), instance-seconds (launch to termination, the
scale-in tail included: for ours, the instance's first to last sight as pending or running in the local
EC2, polled every 0.25 s; for Adaptive, the worker's creation to its close), and `tail_s`, how long after
the last result the machines left on average (negative: before it), and how many were still running
`SCALE_IN_WAIT_S` after the last result (`left_running`: they are billed up to then).

Results are either released as they arrive (`hold=False`), or kept by the client until the last one
arrives and released together, as a user gathering every result does (`hold=True`).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TYPE = "m5.large"
# How long after the last result the scale-in is waited for (wall clock); machines still running then are
# billed up to then and counted as `left_running`.
SCALE_IN_WAIT_S = 300.0
CPU_WORDS = {1: "one", 2: "two", 4: "four", 8: "eight"}  # task keys name their shape (dask's prefix)


@dataclass(frozen=True)
class Workload:
    name: str
    jobs: tuple[tuple[float, float, int], ...]  # (submit_s, duration_s, cpus)
    max_instances: int
    boot_s: float = 3.0
    jitter_s: float = 2.0  # EC2's joins spread by about as much as the boot itself
    types: tuple[str, ...] = (TYPE,)  # the allowed instance types (ours; Adaptive runs m5.large only)


@dataclass
class Outcome:
    """What the client saw: when it started submitting, each job's wait, when the last result came."""

    t0: float
    waits: list[float]
    last_result: float


def quiet() -> None:
    import logging

    import distributed  # noqa: F401 - configures its loggers on import; quiet them afterwards

    from swarm_autoscaler.runtime.logs import configure_logging

    configure_logging("ERROR", "console")
    for name in ("distributed", "werkzeug", "tornado", "swarm_autoscaler"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _task(seconds: float) -> float:
    """The job: returns when it started (workers run in this process: one clock)."""
    started = time.time()
    time.sleep(seconds)
    return started


async def _collect(fut: Any, hold: bool) -> float:
    """A job's start time; its result is released as soon as it arrives unless `hold` (the caller then
    releases it with the others)."""
    started = float(await fut)
    if not hold:
        fut.release()
    return started


async def submit_all(client: Any, w: Workload, hold: bool = False) -> Outcome:
    """Submit each job of `w` at its offset and wait for every result."""
    t0 = time.time()
    pending, futures = [], []
    for i, (at, seconds, cpus) in enumerate(w.jobs):
        delay = t0 + at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        submitted = time.time()
        # dask's task prefix is the key's name part: one per shape, as the simulator takes a trace's jobs
        # of one shape for one prefix (a trace names no functions)
        key = f"{w.name}-{CPU_WORDS.get(cpus, str(cpus))}-cpu-{i}"
        fut = client.submit(_task, seconds, key=key, resources={"CPU": cpus}, pure=False)
        futures.append(fut)
        pending.append((submitted, seconds, asyncio.ensure_future(_collect(fut, hold))))
    waits, last = [], t0
    for submitted, seconds, started in pending:
        start = await started
        waits.append(start - submitted)
        last = max(last, start + seconds)
    for fut in futures:
        fut.release()  # held results go now (a no-op for those already released)
    return Outcome(t0, waits, last)


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
        self.types: dict[str, str] = {}  # instance -> its type
        self.live = 0
        self.worker_up: dict[str, float] = {}  # instance -> when its worker came up (wall clock)
        self.drawn: dict[str, float] = {}  # instance -> the boot time the emulator drew for it
        self.emulator: Any = None

    def poll(self) -> None:
        now = time.time()
        found = [
            (i["InstanceId"], i["InstanceType"])
            for r in self._ec2.describe_instances(Filters=self._filters)["Reservations"]
            for i in r["Instances"]
        ]
        for iid, type_name in found:
            self.seen.setdefault(iid, [now, now])[1] = now
            self.types[iid] = type_name
        ids = [iid for iid, _ in found]
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

    def cost_usd(self) -> float:
        """What the machines seen cost, per second at each type's on-demand price, no minimum."""
        from swarm_autoscaler.core.catalogue import CATALOGUE

        dollars = 0.0
        for iid, (first, last) in self.seen.items():
            dollars += (last - first) * (CATALOGUE[self.types[iid]].price_per_hour or 0.0) / 3600.0
        return round(dollars, 5)

    def lag(self) -> float:
        """Launch (first sight, 0.25 s resolution) to worker up, less the boot time drawn: the local
        cloud's own delay, which the simulator's join time includes (`fidelity_bench.EMULATOR_LAG_S`)."""
        return median([up - self.seen[i][0] - self.drawn[i] for i, up in self.worker_up.items()])


async def live_ours(
    w: Workload, seed: int, settings: Mapping[str, str], hold: bool = False, preload: Sequence[str] = ()
) -> dict[str, float]:
    """`w` run by the real daemon (with `settings` on top of the local cloud's) on the local cloud, its
    scheduler started with the `preload` modules."""
    from distributed import Client

    from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions

    options = LocalCloudOptions(
        fast=True, cluster_name=f"live-{w.name}-{seed}", allowed_types={t: {} for t in w.types},
        max_instances=w.max_instances, seed=seed, scheduler_preload=tuple(preload),
    )  # fmt: skip
    extra = {**settings, "AUTOSCALER_EC2_MAX_INSTANCES": str(w.max_instances)}
    async with LocalCloud(options) as lc, lc.daemon(extra) as daemon:
        assert lc.emulator is not None and lc.network is not None
        lc.emulator.boot_delay, lc.emulator.boot_jitter = w.boot_s, w.jitter_s
        meter = Ec2Meter(lc.moto.endpoint, lc.network.region, lc.owner_tags())
        meter.emulator = lc.emulator
        stop, metering = asyncio.Event(), asyncio.Event()
        runner = asyncio.create_task(daemon.run(stop))
        meter_task = asyncio.create_task(meter.run(metering))
        try:
            async with Client(lc.scheduler_address, asynchronous=True) as client:  # type: ignore[no-untyped-call]
                outcome = await submit_all(client, w, hold)
            await _until(lambda: bool(meter.seen) and meter.live == 0)  # the scale-in tail, billed too
        finally:
            metering.set()
            stop.set()
            await meter_task
            await runner
    return _metered_figures(outcome, meter)


async def live_ours_apart(
    w: Workload, seed: int, settings: Mapping[str, str], hold: bool = False
) -> dict[str, float]:
    """`w` run by a real `swarm-autoscaler run` process against a world whose EC2 is moto in a process of
    its own: the fair bed. This process holds what the peer's process holds (a dask scheduler and the
    workers, here behind the machine emulator and an in-memory swarm served over the Docker Engine API
    imitation); the daemon and moto each get a process, so neither the emulator's load nor moto's
    serialisation sits in the daemon's event loop, and the daemon's planning sits in neither.

    The world is the chaos world (`cloudhost.CloudHost`) with every fault off: no slowed EC2 read, no docker
    latency or conflict, no result kept back at a retirement, and joins after exactly `w.boot_s`
    (plus `w.jitter_s`)."""
    import shutil
    import tempfile
    from pathlib import Path

    from distributed import Client

    from swarm_autoscaler.adapters.ec2 import owner_tags
    from swarm_autoscaler_lab.localcloud.chaos_procs import DaemonProcess, free_port
    from swarm_autoscaler_lab.localcloud.cloud import daemon_timing, quote_env
    from swarm_autoscaler_lab.localcloud.cloudhost import CloudHost, WorldOptions

    name = f"apart-{w.name}-{seed}"
    options = WorldOptions(
        seed=seed, cluster_name=name, allowed_types={t: {} for t in w.types}, max_instances=w.max_instances,
        boot_delay=w.boot_s, boot_jitter=w.jitter_s, emulator_interval=0.3, keep_rate=0.0, hold_s=0.0,
        docker_latency=(0.0, 0.0), conflict_rate=0.0, slow_ec2_rate=0.0, slow_ec2_max=0.0, moto_process=True,
    )  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="bench-apart-"))
    try:
        async with CloudHost(options) as world:
            assert world.emulator is not None and world.network is not None and world.scheduler is not None
            env = world.daemon_env() | {f"AUTOSCALER_{k}": v for k, v in daemon_timing(True).items()}
            env |= {**settings, "AUTOSCALER_EC2_MAX_INSTANCES": str(w.max_instances)}
            port = free_port()
            env |= {"AUTOSCALER_HTTP_PORT": str(port), "AUTOSCALER_HTTP_HOST": "127.0.0.1"}
            env |= {"AUTOSCALER_LOG_FORMAT": "json", "AUTOSCALER_LOG_LEVEL": "WARNING"}
            env_file = workdir / "daemon.env"
            env_file.write_text("".join(f"{k}={quote_env(v)}\n" for k, v in env.items()))
            daemon = DaemonProcess(env_file, workdir / "daemon.log")
            meter = Ec2Meter(world.ec2_endpoint, world.network.region, owner_tags(name))
            meter.emulator = world.emulator
            metering = asyncio.Event()
            meter_task = asyncio.create_task(meter.run(metering))
            daemon.start()
            try:
                # the peer's cluster is up before its first submission: so is ours (its first tick done)
                await _until(lambda: _healthy(port), what="the daemon's first tick")
                address = str(world.scheduler.address)
                async with Client(address, asynchronous=True, set_as_default=False) as client:  # type: ignore[no-untyped-call]
                    outcome = await submit_all(client, w, hold)
                await _until(lambda: bool(meter.seen) and meter.live == 0)  # the scale-in tail, billed too
            finally:
                metering.set()
                await meter_task
                await asyncio.to_thread(daemon.stop)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _metered_figures(outcome, meter)


def _metered_figures(outcome: Outcome, meter: Ec2Meter) -> dict[str, float]:
    """Ours' figures: what the client saw, each instance's span as the meter saw it in EC2, the local
    cloud's own lag, the first launch, what was left running and what it cost."""
    spans = [(first, last) for first, last in meter.seen.values()]
    first = min(first for first, _ in spans) - outcome.t0
    extra = {
        "lag_s": meter.lag(),
        "first_launch_s": round(first, 2),
        "left_running": meter.live,
        "cost_usd": meter.cost_usd(),
    }
    return figures(outcome, spans) | extra


async def live_adaptive(w: Workload, seed: int, hold: bool = False) -> dict[str, float]:
    """`w` run by dask's real Adaptive (`cluster.adapt(minimum=0, maximum=w.max_instances,
    interval="1s")`) on a SpecCluster of booting workers."""
    from distributed import Client, Scheduler, SpecCluster, Worker

    rng = random.Random(seed)
    spans: dict[str, list[float]] = {}

    class BootingWorker(Worker):
        """A worker on a machine that takes `boot_s + U(0, jitter_s)` to boot; billed from creation to
        close, like an instance."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._boot = w.boot_s + (rng.uniform(0.0, w.jitter_s) if w.jitter_s else 0.0)
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
            outcome = await submit_all(client, w, hold)
        await _until(lambda: bool(spans) and all(end for _, end in spans.values()))
        end = time.time()
    closed = [(s, e or end) for s, e in spans.values()]
    first = min(s for s, _ in closed) - outcome.t0
    left = sum(1 for _, e in spans.values() if not e)
    return figures(outcome, closed) | {"first_launch_s": round(first, 2), "left_running": left}


async def _until(done: Callable[[], bool], what: str = "") -> None:
    """Check `done` every 0.25 s, for at most `SCALE_IN_WAIT_S` (wall clock, however loaded the machine);
    with `what`, not done by then is an error."""
    deadline = time.time() + SCALE_IN_WAIT_S
    for _ in itertools.count():
        if done():
            return
        if time.time() >= deadline:
            if what:
                raise TimeoutError(f"not within {SCALE_IN_WAIT_S:g}s: {what}")
            return
        await asyncio.sleep(0.25)


def _healthy(port: int) -> bool:
    """Whether the daemon on `port` answers /healthz with 200 (it has ticked)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as reply:
            return int(reply.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def figures(outcome: Outcome, spans: Sequence[tuple[float, float]]) -> dict[str, float]:
    """The module docstring's figures from what the client saw and each machine's (launch, end)."""
    from swarm_autoscaler_lab.sim.report import percentile

    waits = sorted(outcome.waits)
    return {
        "makespan_s": round(outcome.last_result - outcome.t0, 2),
        "wait_p50_s": round(percentile(waits, 50), 2),
        "wait_p95_s": round(percentile(waits, 95), 2),
        "instance_seconds": round(sum(end - start for start, end in spans), 1),
        "machines": len(spans),
        "tail_s": round(statistics.mean(end - outcome.last_result for _, end in spans), 2) if spans else 0.0,
    }


def reps_from(flags: Sequence[str], default: int) -> int:
    """How many repetitions the flags ask for: `--reps=N`, `--quick` (1), else `default`."""
    reps = 1 if "--quick" in flags else default
    for flag in flags:
        if flag.startswith("--reps="):
            reps = int(flag.split("=", 1)[1])
    return reps


def median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 2) if values else float("nan")


def spread(runs: Sequence[Mapping[str, float]], keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per figure: the median, min and max over the runs."""
    return {
        k: {
            "median": median([r[k] for r in runs]),
            "min": min(r[k] for r in runs),
            "max": max(r[k] for r in runs),
        }
        for k in keys
    }
