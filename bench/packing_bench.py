"""The packing plugin, on and off, live and in the simulator ("steering dask toward
packing ... measured on and off").

One workload, scaled to seconds, where dask puts small tasks decides what the fleet costs: a
steady stream of one-CPU tasks (3 s each, two a second for 80 s: about six CPUs busy) and, at 10 s, 35 s
and 60 s, a task needing eight CPUs (5 s). Allowed types: m5.large (2 CPUs, $0.096/h) and m5.2xlarge (8
CPUs, $0.384/h, four times the price), at most 8 machines, booting in 3 s + U(0, 2 s).

Without the plugin dask sends each small task to the valid worker of least occupancy per thread, so once
an m5.2xlarge has joined for a big task, small tasks flow onto it (8 threads), it never empties, and the
small machines idle instead. With it (`swarm_autoscaler.adapters.dask_packing`, preloaded by the local
cloud's scheduler), a small task goes to the smallest, fullest worker that can start it now.

Live: the real daemon on the local cloud (`bench.live.live_ours`), with and without the preload,
alternating which goes first, `--reps` repetitions (default 3, `--quick` 1), medians (min-max). Simulated:
"ours" with `Knobs.dask_packing` off and on, five seeds, medians. Figures: cost (per-second billing at
each type's price, in US cents), instance-seconds, makespan, p50/p95 wait, machines launched. Settings of ours:
`POLL_INTERVAL=1s`, `DRAIN_DELAY=3s`, `TERMINATION_DELAY=0s` (as `bench peer`).

Run: `python -m bench packing` (niced). Writes `bench/packing_results.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.fidelity_bench import simulated as fidelity_simulated
from bench.live import Workload, live_ours, quiet, reps_from, spread

RESULTS = Path(__file__).with_name("packing_results.json")
ROOT = Path(__file__).resolve().parents[1]
PRELOAD = "swarm_autoscaler.adapters.dask_packing"
SETTINGS = {
    "AUTOSCALER_POLL_INTERVAL": "1s",
    "AUTOSCALER_DRAIN_DELAY": "3s",
    "AUTOSCALER_TERMINATION_DELAY": "0s",
    "AUTOSCALER_MAX_START_TIME": "60s",
}
TYPES = ("m5.large", "m5.2xlarge")
FIGURES = ("cost_cents", "instance_seconds", "makespan_s", "wait_p50_s", "wait_p95_s", "machines")
SIDES = ("off", "on")
SIM_SEEDS = 5


def workload() -> Workload:
    small = [(i * 0.5, 3.0, 1) for i in range(160)]
    big = [(at, 5.0, 8) for at in (10.0, 35.0, 60.0)]
    jobs = tuple(sorted(small + big))
    return Workload("small_and_big", jobs, 8, boot_s=3.0, jitter_s=2.0, types=TYPES)


def simulated(w: Workload, packing: bool) -> list[dict[str, float]]:
    """ "ours" on `w` in the simulator with the packing model off or on, one summary per seed."""
    return [
        {k: float(v) for k, v in s.items() if k in FIGURES}
        for s in (
            summary | {"cost_cents": 100 * summary["cost_usd"], "machines": summary["launches"]}
            for summary in fidelity_simulated(w, "ours", SETTINGS, packing=packing)
        )
    ]


def measure(reps: int) -> dict[str, Any]:
    w = workload()
    live: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for rep in range(reps):
        for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
            preload = (PRELOAD,) if side == "on" else ()
            run = asyncio.run(live_ours(w, rep, SETTINGS, False, preload))
            live[side].append(run | {"cost_cents": round(100 * run["cost_usd"], 3)})
            print(f"  #{rep} packing {side} live: {live[side][-1]}", flush=True)
    out: dict[str, Any] = {}
    for side in SIDES:
        out[side] = {
            "live": spread(live[side], FIGURES),
            "sim": spread(simulated(w, side == "on"), FIGURES),
            "live_runs": live[side],
        }
    return out


def markdown(results: Mapping[str, Any]) -> str:
    """Per figure: live off, live on, their ratio; simulated off, on, their ratio (medians)."""
    lines = [
        "| figure | live, off | live, on | on / off | sim, off | sim, on | on / off |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in FIGURES:
        cells = []
        for where in ("live", "sim"):
            off, on = (results[side][where][k] for side in SIDES)
            ratio = f"{on['median'] / off['median']:.2f}" if off["median"] else ""
            cells += [_cell(off), _cell(on), ratio]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
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
