"""GPU jobs queued behind a busy worker, and a second GPU worker joining: does it take them?

A real dask scheduler (with the packing preload, `swarm_autoscaler.adapters.dask_packing`, or without it)
and real in-process workers as the project's workers advertise a g4dn.xlarge: 4 threads, `CPU=4`,
`RAM=16 GiB`, `GPU=1`. Four jobs of the GPU-style kind (`CPU=4, RAM=14 GiB, GPU=1`, 6 s each, as many
seconds as a 15-minute job is scaled down to) are submitted at once to the one worker: one runs, three wait
for its GPU. 2 s later a second identical worker joins, as the one the autoscaler launches for the queue.

Without the preload dask leaves the three waiting on the first worker (its work stealing takes only from
a worker with more processing tasks than threads), so the second machine idles and the jobs run one after
another. With it, `QueuedMover` moves a waiting job to the newcomer within a round (0.5 s).

Figures per side, medians (min-max) over `--reps` repetitions (default 3, `--quick` 1), alternating which
side goes first: the jobs' wait (start less submission: mean, p95 = the last of four, in seconds), the
makespan (first submission to last end), how many jobs ran on the worker that joined, how long it idled
after joining before its first job started (the whole run's length, 24 s, when it got none), and how many
jobs ran more or less than once (must be 0).

Run: `python -m bench queued` (niced). Writes `bench/queued_results.json`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.live import quiet, reps_from, spread

RESULTS = Path(__file__).with_name("queued_results.json")
ROOT = Path(__file__).resolve().parents[1]
PRELOAD = "swarm_autoscaler.adapters.dask_packing"
GIB = 1 << 30
JOBS = 4
JOB_S = 6.0
JOIN_AFTER_S = 2.0
WORKER = {"CPU": 4, "RAM": 16 * GIB, "GPU": 1}
JOB = {"CPU": 4, "RAM": 14 * GIB, "GPU": 1}
FIGURES = ("wait_mean_s", "wait_p95_s", "makespan_s", "on_new_worker", "new_idle_s", "not_run_once")
SIDES = ("without", "with")

_STARTS: collections.Counter[int] = collections.Counter()
_LOCK = threading.Lock()


def job(i: int, seconds: float) -> tuple[float, float, str]:
    """The job: (started, ended, worker name). Workers run in this process: one clock."""
    from distributed import get_worker

    with _LOCK:
        _STARTS[i] += 1
    started = time.time()
    time.sleep(seconds)
    return started, time.time(), str(get_worker().name)


async def one_run(preload: bool) -> dict[str, float]:
    from distributed import Client, Scheduler, Worker

    _STARTS.clear()
    workers: list[Worker] = []
    async with Scheduler(
        host="127.0.0.1",
        port=0,
        dashboard=False,
        dashboard_address="127.0.0.1:0",
        preload=[PRELOAD] if preload else [],
    ) as sched:
        try:
            workers.append(await _worker(sched.address, "busy"))
            async with Client(sched.address, asynchronous=True, set_as_default=False) as client:
                submitted = time.time()
                futures = [
                    client.submit(job, i, JOB_S, key=f"gpu-job-{i}", resources=JOB) for i in range(JOBS)
                ]
                await asyncio.sleep(JOIN_AFTER_S)
                workers.append(await _worker(sched.address, "new"))
                joined = time.time()
                done = await client.gather(futures)
        finally:
            for w in workers:
                await w.close()
    waits = sorted(started - submitted for started, _, _ in done)
    return {
        "wait_mean_s": round(statistics.mean(waits), 2),
        "wait_p95_s": round(waits[-1], 2),  # the 95th percentile of four is the last
        "makespan_s": round(max(end for _, end, _ in done) - submitted, 2),
        "on_new_worker": float(sum(1 for _, _, name in done if name == "new")),
        "new_idle_s": round(
            min([s for s, _, n in done if n == "new"] or [joined + JOB_S * JOBS]) - joined, 2
        ),
        "not_run_once": float(sum(1 for i in range(JOBS) if _STARTS[i] != 1)),
    }


async def _worker(address: str, name: str) -> Any:
    from distributed import Worker

    worker = Worker(address, name=name, nthreads=4, resources=WORKER, dashboard=False)
    await worker
    return worker


def measure(reps: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for rep in range(reps):
        for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
            runs[side].append(asyncio.run(one_run(side == "with")))
            print(f"  #{rep} {side} the preload: {runs[side][-1]}", flush=True)
    return {side: {"live": spread(runs[side], FIGURES), "runs": runs[side]} for side in SIDES}


def markdown(results: Mapping[str, Any]) -> str:
    lines = ["| figure | without the preload | with it |", "|---|---|---|"]
    for k in FIGURES:
        lines.append(f"| {k} | " + " | ".join(_cell(results[side]["live"][k]) for side in SIDES) + " |")
    return "\n".join(lines)


def _cell(f: Mapping[str, float]) -> str:
    if f["min"] == f["max"]:
        return f"{f['median']:g}"
    return f"{f['median']:g} ({f['min']:g}-{f['max']:g})"


def main(flags: list[str]) -> None:
    with contextlib.suppress(OSError):
        os.nice(10)
    reps = reps_from(flags, 3)
    quiet()
    results = measure(reps)
    print(markdown(results))
    stamp = {"reps": reps, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.write_text(json.dumps(results | stamp, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
