"""Synthetic workloads with fixed seeds: the bundled scenarios (`scenarios/generate.py` writes them) and
the benchmark's day-long trace. Each generator is a pure function of its seed."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from swarm_autoscaler_lab.sim.trace import Job

DAY = 86400.0


def _sorted(raw: list[tuple[float, float, float, float, int, str | None]]) -> tuple[Job, ...]:
    raw.sort(key=lambda r: r[0])
    return tuple(Job(i, round(s, 1), round(d, 1), c, r, g, t) for i, (s, d, c, r, g, t) in enumerate(raw))


def burst(seed: int = 0, n: int = 500) -> tuple[Job, ...]:
    """A burst as users send it: `n` one-CPU jobs (2 GiB) sent within a minute to a cluster of at most 40
    workers; each runs 3 to 8 minutes (log-normal around 5)."""
    rng = random.Random(seed)
    raw: list[tuple[float, float, float, float, int, str | None]] = [
        (rng.uniform(0, 60), _clamp(rng.lognormvariate(math.log(300), 0.3), 180, 480), 1.0, 2.0, 0, None)
        for _ in range(n)
    ]
    return _sorted(raw)


def gpu_surge(seed: int = 4) -> tuple[Job, ...]:
    """A GPU fleet with an always-on base: GPU jobs (1 GPU, 2 CPUs, 8 GiB, 6 to 15 minutes) arriving about every 8 minutes for
    four hours, which an always-on base of two GPU machines absorbs, plus a surge of 30 jobs within ten
    minutes after the first hour."""
    rng = random.Random(seed)
    raw: list[tuple[float, float, float, float, int, str | None]] = []
    t = 0.0
    while t < 4 * 3600:
        t += rng.expovariate(1 / 480)
        raw.append((t, rng.uniform(360, 900), 2.0, 8.0, 1, None))
    raw += [(3600 + rng.uniform(0, 600), rng.uniform(360, 900), 2.0, 8.0, 1, None) for _ in range(30)]
    return _sorted(raw)


def gpu_pool(seed: int = 4) -> tuple[Job, ...]:
    """The GPU fleet with surges the maximum can meet: GPU jobs (1 GPU, 1 CPU, 8 GiB, 10 to 25 minutes) about
    every 12 minutes for five hours on an always-on base of two GPU machines, plus a surge of 6 jobs
    within two minutes every hour from the first: each surge needs new capacity at once, which a warm
    pool of stopped machines starts in about a minute where launches take two. The settings keep 3 of a
    g4dn.xlarge's 4 CPUs back, so its worker runs one thread: one GPU job at a time, as GPU workers are
    run, and dask's work stealing (which counts threads, not GPUs) moves jobs queued on a busy one."""
    rng = random.Random(seed)
    raw: list[tuple[float, float, float, float, int, str | None]] = []
    t = 0.0
    while t < 5 * 3600:
        t += rng.expovariate(1 / 720)
        raw.append((t, rng.uniform(600, 1500), 1.0, 8.0, 1, None))
    for hour in range(1, 5):
        raw += [
            (hour * 3600 + rng.uniform(0, 120), rng.uniform(600, 1500), 1.0, 8.0, 1, None) for _ in range(6)
        ]
    return _sorted(raw)


def gpu_whole_surge(seed: int = 4) -> tuple[Job, ...]:
    """GPU jobs that each take a whole g4dn.xlarge (1 GPU, 4 CPUs, 14 GiB, 10 to 25 minutes) about every
    12 minutes for five hours on an always-on base of two GPU machines, plus a surge of 4 jobs within two
    minutes every hour from the first: each surge job needs a machine of its own at once, and the maximum
    (40) never binds."""
    rng = random.Random(seed)
    raw: list[tuple[float, float, float, float, int, str | None]] = []
    t = 0.0
    while t < 5 * 3600:
        t += rng.expovariate(1 / 720)
        raw.append((t, rng.uniform(600, 1500), 4.0, 14.0, 1, None))
    for hour in range(1, 5):
        raw += [
            (hour * 3600 + rng.uniform(0, 120), rng.uniform(600, 1500), 4.0, 14.0, 1, None) for _ in range(4)
        ]
    return _sorted(raw)


def _job_mix(rng: random.Random) -> tuple[float, float, float, int, str | None]:
    """(duration, cpus, ram_gib, gpus, pinned type): small, medium and memory-heavy jobs."""
    kind = rng.random()
    if kind < 0.70:
        return rng.uniform(120, 600), 1.0, 2.0, 0, None
    if kind < 0.95:
        return rng.uniform(600, 1800), 4.0, 14.0, 0, None
    return rng.uniform(600, 1800), 2.0, 28.0, 0, None


def day_cycle(seed: int = 7, n: int = 1500, spikes: int = 3) -> tuple[Job, ...]:
    """A day: arrivals follow a daily cycle (quiet at night, peak mid-afternoon; rate proportional to
    1 - 0.85 cos(2 pi t / day)), plus `spikes` bursts of 5% of the jobs within five minutes each."""
    rng = random.Random(seed)
    n_spiky = int(n * 0.05) * spikes
    raw: list[tuple[float, float, float, float, int, str | None]] = []
    while len(raw) < n - n_spiky:  # thinning of a Poisson process with the cyclic rate
        t = rng.uniform(0, DAY)
        if rng.random() < (1 - 0.85 * math.cos(2 * math.pi * t / DAY)) / 1.85:
            raw.append((t, *_job_mix(rng)))
    for _ in range(spikes):
        at = rng.uniform(0.1 * DAY, 0.9 * DAY)
        raw += [(at + rng.uniform(0, 300), *_job_mix(rng)) for _ in range(n_spiky // spikes)]
    return _sorted(raw)


PINNED_TYPES = ("c5.xlarge", "m5.xlarge", "r5.large")


def pinned_mix(seed: int = 11, n: int = 300) -> tuple[Job, ...]:
    """Two hours of jobs, 60% pinned to one of `PINNED_TYPES` (sized to fit it), the rest unpinned."""
    rng = random.Random(seed)
    raw: list[tuple[float, float, float, float, int, str | None]] = []
    for _ in range(n):
        submit = rng.uniform(0, 7200)
        duration = rng.uniform(180, 900)
        if rng.random() < 0.6:
            pinned = rng.choice(PINNED_TYPES)
            cpus, ram = {"c5.xlarge": (2.0, 3.0), "m5.xlarge": (2.0, 7.0), "r5.large": (1.0, 7.0)}[pinned]
            raw.append((submit, duration, cpus, ram, 0, pinned))
        else:
            raw.append((submit, duration, 1.0, 1.5, 0, None))
    return _sorted(raw)


def short_stream(seed: int = 6) -> tuple[Job, ...]:
    """Two hours of short tasks as dask usually sees them (1 CPU, 5 to 20 s, about 0.45 a second: half of
    two always-on m5.xlarge), plus, after the first hour, a burst of 150 jobs of a new kind (2 CPUs,
    1 to 3 minutes) within a minute, while the workers are busy: dask queues them behind the busy workers
    and, having no duration estimate for them yet, moves none until one finishes."""
    rng = random.Random(seed)
    raw: list[tuple[float, float, float, float, int, str | None]] = []
    t = 0.0
    while True:
        t += rng.expovariate(0.45)
        if t >= 7200:
            break
        raw.append((t, rng.uniform(5, 20), 1.0, 1.0, 0, None))
    raw += [(3600 + rng.uniform(0, 60), rng.uniform(60, 180), 2.0, 4.0, 0, None) for _ in range(150)]
    return _sorted(raw)


# (weight, cpus, ram_gib) of the CPU-only shapes of the heavy-tailed mix: mostly small, a few big.
HEAVY_SHAPES = (
    (0.40, 1.0, 2.0),
    (0.20, 2.0, 4.0),
    (0.12, 2.0, 8.0),
    (0.10, 4.0, 8.0),
    (0.08, 4.0, 16.0),
    (0.05, 4.0, 30.0),
    (0.05, 8.0, 30.0),
)
HEAVY_GPU_SHARE = 0.05
HEAVY_TYPES = ("t3.medium", "t3.large", "c5.xlarge", "m5.xlarge", "r5.xlarge", "m5.2xlarge", "g4dn.xlarge")


def heavy_tailed(seed: int = 15, n: int = 2000, hours: float = 4.0) -> tuple[Job, ...]:
    """A heavy-tailed mix: `n` jobs over `hours` with Poisson arrivals (the arrival times of a
    Poisson process given its count are uniform), log-normal durations with a median of one minute and a
    long tail (sigma 1.5: mean about 3 minutes, p99 about half an hour; clamped to 5 s .. 2 h), shapes from
    1 CPU / 2 GiB to 8 CPU / 30 GiB (`HEAVY_SHAPES`), and `HEAVY_GPU_SHARE` of the jobs needing one GPU
    (1 to 4 CPUs, 4 to 14 GiB: what a g4dn.xlarge holds)."""
    rng = random.Random(seed)
    weights = [w for w, _, _ in HEAVY_SHAPES]
    raw: list[tuple[float, float, float, float, int, str | None]] = []
    for _ in range(n):
        submit = rng.uniform(0, hours * 3600)
        duration = _clamp(rng.lognormvariate(math.log(60), 1.5), 5, 7200)
        if rng.random() < HEAVY_GPU_SHARE:
            raw.append(
                (submit, duration, float(rng.choice((1, 2, 4))), float(rng.choice((4, 8, 14))), 1, None)
            )
        else:
            _, cpus, ram = rng.choices(HEAVY_SHAPES, weights)[0]
            raw.append((submit, duration, cpus, ram, 0, None))
    return _sorted(raw)


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


# The scenarios run at the daemon's timing defaults (poll interval, drain and termination delays), so that
# their tables measure what an operator gets without tuning: none of these variables is set here.
ENV_COMMON = (
    "# timing: the daemon's defaults (AUTOSCALER_POLL_INTERVAL, _DRAIN_DELAY, _TERMINATION_DELAY unset)\n"
)

# name -> (generator, settings file body). AMI ids are ignored by the simulator; they are there so the
# same file also validates for the daemon.
SCENARIOS: dict[str, tuple[Callable[[], tuple[Job, ...]], str]] = {
    "burst500": (
        burst,
        ENV_COMMON
        + 'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {"ami_id": "ami-00000000000000000"}}\n'
        + "AUTOSCALER_EC2_MIN_INSTANCES=0\nAUTOSCALER_EC2_MAX_INSTANCES=40\n",
    ),
    "gpu_surge": (
        gpu_surge,
        ENV_COMMON
        + 'AUTOSCALER_EC2_ALLOWED_TYPES={"g4dn.xlarge": {"ami_id": "ami-00000000000000000"}}\n'
        + "AUTOSCALER_EC2_MIN_INSTANCES=2\nAUTOSCALER_EC2_MAX_INSTANCES=7\n",
    ),
    "gpu_whole_surge": (
        gpu_whole_surge,
        ENV_COMMON
        + 'AUTOSCALER_EC2_ALLOWED_TYPES={"g4dn.xlarge": {"ami_id": "ami-00000000000000000", "min": 2}}\n'
        + "AUTOSCALER_EC2_MIN_INSTANCES=0\nAUTOSCALER_EC2_MAX_INSTANCES=40\n",
    ),
    "day_cycle": (
        day_cycle,
        ENV_COMMON
        + "AUTOSCALER_EC2_ALLOWED_TYPES="
        + '{"m5.large": {"ami_id": "ami-00000000000000000"}, "m5.xlarge": {"ami_id": "ami-00000000000000000"}, '
        + '"r5.xlarge": {"ami_id": "ami-00000000000000000"}}\n'
        + "AUTOSCALER_EC2_MIN_INSTANCES=0\nAUTOSCALER_EC2_MAX_INSTANCES=20\n",
    ),
    "short_stream": (
        short_stream,
        ENV_COMMON
        + 'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.xlarge": {"ami_id": "ami-00000000000000000"}}\n'
        + "AUTOSCALER_EC2_MIN_INSTANCES=2\nAUTOSCALER_EC2_MAX_INSTANCES=20\n",
    ),
    "pinned_mix": (
        pinned_mix,
        ENV_COMMON
        + "AUTOSCALER_EC2_ALLOWED_TYPES="
        + '{"t3.medium": {"ami_id": "ami-00000000000000000"}, "c5.xlarge": {"ami_id": "ami-00000000000000000"}, '
        + '"m5.xlarge": {"ami_id": "ami-00000000000000000", "reserve": 1}, '
        + '"r5.large": {"ami_id": "ami-00000000000000000"}}\n'
        + "AUTOSCALER_EC2_MIN_INSTANCES=0\nAUTOSCALER_EC2_MAX_INSTANCES=15\n",
    ),
    "heavy_tailed": (
        heavy_tailed,
        ENV_COMMON
        + "AUTOSCALER_EC2_ALLOWED_TYPES="
        + "{"
        + ", ".join(f'"{t}": {{"ami_id": "ami-00000000000000000"}}' for t in HEAVY_TYPES)
        + "}\n"
        + "AUTOSCALER_EC2_MIN_INSTANCES=0\nAUTOSCALER_EC2_MAX_INSTANCES=40\n",
    ),
}


# The warm-pool scenario (`python -m swarm_autoscaler_lab.sim.pooltable`), kept apart from SCENARIOS: it
# compares one policy with and without a pool, not the policies. A base of two GPU machines always runs
# ("min"), a pool of six stopped ones waits ("warm_pool"); the run without a pool drops "warm_pool".
POOL_SCENARIOS: dict[str, tuple[Callable[[], tuple[Job, ...]], str]] = {
    "gpu_pool": (
        gpu_pool,
        ENV_COMMON
        + "AUTOSCALER_TOLERATED_WAIT=0\n"  # a surge buys capacity at once, whatever dask estimates
        + 'AUTOSCALER_EC2_ALLOWED_TYPES={"g4dn.xlarge": {"ami_id": "ami-00000000000000000", "min": 2, '
        + '"warm_pool": 6, "overhead": {"cpus": 3}}}\n'
        + "AUTOSCALER_EC2_MIN_INSTANCES=0\nAUTOSCALER_EC2_MAX_INSTANCES=10\n",
    ),
}
