"""Ours against dask's real Adaptive, live, in one run.

Three workloads of bursts and waves, all tasks `resources={"CPU": 1}` sleeping, on m5.large machines (2 CPU
slots, 2 threads) that boot in a fixed time on both sides (no jitter: the issue's set-up):

- `burst100`: 100 tasks of 2 s at t=0, boot 5 s, at most 10 machines;
- `burst500`: 500 tasks of 10 s at t=0, boot 10 s, at most 40 machines;
- `waves200`: 200 tasks of 5 s at t=0 and 200 more at t=`WAVE_GAP_S`, boot 10 s, at most 20 machines.

Ours is the real daemon (settings `SETTINGS`). By default on the fair bed (`bench.live.live_ours_apart`):
a `swarm-autoscaler run` process of its own, moto in a process of its own, and this process holding what
the peer's holds, the scheduler and the workers (behind the machine emulator). `--bed=shared` runs the
earlier bed instead (`bench.live.live_ours`): the daemon, moto, the emulator and the workers in one event
loop, where the emulator's load is charged to ours alone. The peer is
`distributed.deploy.Adaptive` (`adapt(minimum=0, maximum=..., interval="1s")`) on a `SpecCluster` whose
workers sleep through the same boot (`bench.live.live_adaptive`). The client keeps every result until
the last one arrives, then releases them all (`--release` releases each as it arrives instead), as a user
gathering the results does. Each repetition runs every workload on both sides, alternating which goes
first, so both see the same machine load; medians over the repetitions (`--reps=N`, default 3; `--quick`
1; `--workload=NAME` for one). Figures: instance-seconds (launch to termination, the scale-in tail
included; per-second billing, no minimum, since the workloads are scaled to seconds), makespan (first
submission to last result), p50/p95 wait, and how long after the last result the machines left on
average (`tail_s`). Ratios are ours / Adaptive; the issue's target is instance-seconds <= 1 and makespan
<= 1.05.

Run: `python -m bench peer` (niced). Writes `bench/peer_results.json` (with `--workload=NAME`, the other
workloads' last results are kept there), each workload with its repetitions and when it was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.live import Workload, live_adaptive, live_ours, live_ours_apart, quiet, reps_from, spread

RESULTS = Path(__file__).with_name("peer_results.json")
ROOT = Path(__file__).resolve().parents[1]
WAVE_GAP_S = 45.0  # the first wave is done by then on 20 machines (10 s boot + 5 rounds of 5 s)
SETTINGS = {
    "AUTOSCALER_POLL_INTERVAL": "1s",
    "AUTOSCALER_DRAIN_DELAY": "3s",
    # Adaptive closes a worker after 3 idle checks 1 s apart and its machine goes with it: the same
    # 3 s idle wait is the drain delay here, and no drained machine is kept in reserve (an earlier run
    # used 3 s here too, which billed every machine about 3 s more than the peer's).
    "AUTOSCALER_TERMINATION_DELAY": "0s",
    "AUTOSCALER_MAX_START_TIME": "60s",
}
FIGURES = ("instance_seconds", "makespan_s", "wait_p50_s", "wait_p95_s", "tail_s", "machines", "left_running")
RATIOS = ("instance_seconds", "makespan_s")
TARGETS = {"instance_seconds": 1.0, "makespan_s": 1.05}
POLICIES = ("ours", "adaptive")
BEDS = ("apart", "shared")


def workloads() -> list[Workload]:
    return [
        Workload("burst100", tuple((0.0, 2.0, 1) for _ in range(100)), 10, boot_s=5.0, jitter_s=0.0),
        Workload("burst500", tuple((0.0, 10.0, 1) for _ in range(500)), 40, boot_s=10.0, jitter_s=0.0),
        Workload(
            "waves200",
            tuple((0.0 if i < 200 else WAVE_GAP_S, 5.0, 1) for i in range(400)),
            20,
            boot_s=10.0,
            jitter_s=0.0,
        ),
    ]


def order(rep: int) -> tuple[str, ...]:
    """Which side runs first in repetition `rep`: they alternate."""
    return POLICIES if rep % 2 == 0 else POLICIES[::-1]


def measure(reps: int, names: Sequence[str], hold: bool, bed: str = "apart") -> dict[str, Any]:
    chosen = [w for w in workloads() if not names or w.name in names]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {w.name: {p: [] for p in POLICIES} for w in chosen}
    for rep in range(reps):
        for w in chosen:
            for policy in order(rep):
                ours = live_ours_apart if bed == "apart" else live_ours
                run = ours(w, rep, SETTINGS, hold) if policy == "ours" else live_adaptive(w, rep, hold)
                runs[w.name][policy].append(asyncio.run(run))
                print(f"  #{rep} {w.name} {policy}: {runs[w.name][policy][-1]}", flush=True)
    return {name: summarize(by_policy) for name, by_policy in runs.items()}


def summarize(by_policy: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, Any]:
    """Medians (min, max) per side and the ratios of the medians, ours / Adaptive."""
    out: dict[str, Any] = {
        p: {"figures": spread(by_policy[p], FIGURES), "runs": list(by_policy[p])} for p in POLICIES
    }
    out["ratios"] = {
        k: round(out["ours"]["figures"][k]["median"] / out["adaptive"]["figures"][k]["median"], 3)
        for k in RATIOS
    }
    out["met"] = {k: out["ratios"][k] <= TARGETS[k] for k in RATIOS}
    return out


def markdown(results: Mapping[str, Any]) -> str:
    """The table of docs/lab/peer.md: per workload and figure, medians (min-max) of both sides and the ratio."""
    lines = [
        "| workload | figure | ours | Adaptive | ours / Adaptive | target |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        for k in (k for k in FIGURES if k in row["ours"]["figures"]):  # results of older runs lack some
            cells = []
            for policy in POLICIES:
                f = row[policy]["figures"][k]
                cells.append(f"{f['median']:g} ({f['min']:g}-{f['max']:g})")
            ratio = f"{row['ratios'][k]:.2f}" if k in RATIOS else ""
            target = f"<= {TARGETS[k]:g}: {'met' if row['met'][k] else 'missed'}" if k in RATIOS else ""
            lines.append(f"| {name} | {k} | {cells[0]} | {cells[1]} | {ratio} | {target} |")
    return "\n".join(lines)


def main(flags: list[str]) -> None:
    with contextlib.suppress(OSError):
        os.nice(10)
    reps = reps_from(flags, 3)
    names = [f.split("=", 1)[1] for f in flags if f.startswith("--workload=")]
    hold = "--release" not in flags
    bed = next((f.split("=", 1)[1] for f in flags if f.startswith("--bed=")), "apart")
    if bed not in BEDS:
        raise SystemExit(f"--bed must be one of {', '.join(BEDS)}, not {bed!r}")
    quiet()
    measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = {
        name: row | {"reps": reps, "hold": hold, "bed": bed, "measured": measured}
        for name, row in measure(reps, names, hold, bed).items()
    }
    print(markdown(results))
    kept = {}
    if names and RESULTS.is_file():  # a run of some workloads keeps the others' last results
        kept = json.loads(RESULTS.read_text()).get("results", {})
    merged = {w.name: (kept | results)[w.name] for w in workloads() if w.name in results or w.name in kept}
    RESULTS.write_text(json.dumps({"results": merged}, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
