"""Simulator fidelity: the same workloads live and in the simulator, side by side.

Live: the real daemon on the local cloud (moto EC2 over HTTP, a real dask scheduler, the in-memory
swarm, the machine emulator booting each machine `boot + U(0, jitter)` seconds after it appears), and
dask's real `distributed.deploy.Adaptive` on a `SpecCluster` whose workers take the same boot time
before they start. Simulated: `ours` and `adaptive` in `swarm_autoscaler_lab.sim` with the same settings,
joins of `boot + jitter / 2 ± jitter / 2` (the same uniform range) plus the local cloud's measured lag,
and a first tick at each autoscaler's measured reaction (`REACTION_S`). Results are released as they arrive.

Workloads, scaled to seconds (tasks `resources={"CPU": n}` sleeping; machines m5.large, 2 CPUs, 2
threads): a burst of identical tasks, two waves, and a stream of mixed shapes (1 or 2 CPUs) with
Poisson arrivals and durations of 1, 3 and 8 s. Figures: makespan (first submission to last result),
p50 and p95 wait (submission to start), instance-seconds (launch to termination, the scale-in tail
included). The simulator runs five seeds per figure (median); live runs repeat `--reps` times
(default 2, `--quick` 1) and report medians with their spread.

The live runs are `bench.live`'s, shared with `python -m bench peer`.

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
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.live import Workload, live_adaptive, live_ours, quiet, reps_from, spread

RESULTS = Path(__file__).with_name("fidelity_results.json")
HOLD_RESULTS = Path(__file__).with_name("fidelity_hold_results.json")
MODE = {"hold": False}  # --hold: the client keeps every result until the last one arrived
ROOT = Path(__file__).resolve().parents[1]
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


def workloads() -> list[Workload]:
    rng = random.Random(7)
    mixed, t = [], 0.0
    for _ in range(30):
        t += rng.expovariate(1 / 0.5)
        mixed.append((round(t, 2), rng.choice((1.0, 1.0, 3.0, 3.0, 8.0)), rng.choice((1, 1, 2))))
    # With --hold only: a burst with a long tail (four 24 s jobs among 28 short ones), where machines that
    # ran only short jobs sit idle holding results while the long ones run (the burst's scale-in tail).
    tail = tuple((0.0, 24.0 if i % 8 == 0 else 2.0, 1) for i in range(32))
    return [
        *((Workload("tail", tail, 4, BOOT_S, JITTER_S),) if MODE["hold"] else ()),
        Workload("burst", tuple((0.0, 3.0, 1) for _ in range(32)), 4, BOOT_S, JITTER_S),
        Workload("waves", tuple((0.0 if i < 16 else 15.0, 3.0, 1) for i in range(32)), 4, BOOT_S, JITTER_S),
        Workload("mixed", tuple(mixed), 4, BOOT_S, JITTER_S),
    ]


def simulated(
    w: Workload,
    policy: str,
    settings: Mapping[str, str] = SETTINGS,
    *,
    hold: bool = False,
    packing: bool = False,
    reaction_s: float | None = None,
) -> list[dict[str, Any]]:
    """`policy` on `w` in the simulator with the daemon `settings`, one summary (`sim.report`) per seed:
    `w`'s types allowed, joins as the local cloud's, results held by the client if `hold`, dask steered
    toward packing if `packing`, the first tick at `reaction_s` (default: the policy's `REACTION_S`)."""
    from swarm_autoscaler_lab.sim.config import load_sim_settings
    from swarm_autoscaler_lab.sim.faults import RandomFaults
    from swarm_autoscaler_lab.sim.runner import default_options, run_trace
    from swarm_autoscaler_lab.sim.trace import Job

    env = {
        **settings,
        "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps({t: {} for t in w.types}),
        "AUTOSCALER_EC2_MAX_INSTANCES": str(w.max_instances),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "live.env"
        path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
        sim_settings = load_sim_settings(path)
    jobs = [Job(i, at, seconds, float(cpus), 0.0, 0) for i, (at, seconds, cpus) in enumerate(w.jobs)]
    options = default_options(
        sim_settings,
        join_s=w.boot_s + w.jitter_s / 2 + EMULATOR_LAG_S,
        join_jitter_s=w.jitter_s / 2,
        worker_start_s=0.0,
        hold_results=hold,
        dask_packing=packing,
    )
    first = REACTION_S[policy] if reaction_s is None else reaction_s
    options = dataclasses.replace(options, first_tick_s=first)
    return [
        run_trace(jobs, sim_settings, policy, options, RandomFaults(seed, 0.0, {}, 0.0))[1]
        for seed in range(SIM_SEEDS)
    ]


def _figures(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    return [{k: float(summary[k]) for k in FIGURES} for summary in summaries]


def _medians(runs: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    return spread(runs, FIGURES)


def measure(reps: int, names: Sequence[str], policies: Sequence[str] = ()) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for w in workloads():
        if names and w.name not in names:
            continue
        row: dict[str, Any] = {}
        for policy in ("ours", "adaptive"):
            if policies and policy not in policies:
                continue
            runs = []
            for rep in range(reps):
                run = (
                    live_ours(w, rep, SETTINGS, MODE["hold"])
                    if policy == "ours"
                    else live_adaptive(w, rep, MODE["hold"])
                )
                runs.append(asyncio.run(run))
                print(f"  {w.name} {policy} live #{rep}: {runs[-1]}", flush=True)
            row[policy] = {
                "live": _medians(runs),
                "sim": _medians(_figures(simulated(w, policy, hold=MODE["hold"]))),
                "live_runs": runs,
            }
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
    """The table of docs/lab/fidelity.md: live medians (min-max over the repetitions), simulated medians, ratios."""
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
    reps = reps_from(flags, 2)
    names = [f.split("=", 1)[1] for f in flags if f.startswith("--workload=")]
    policies = [f.split("=", 1)[1] for f in flags if f.startswith("--policy=")]
    MODE["hold"] = hold = "--hold" in flags
    quiet()
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
