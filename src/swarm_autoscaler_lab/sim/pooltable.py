"""The warm pool's figures: one scenario run by "ours" with and without its pool, over several seeds.

    .venv/bin/python -m swarm_autoscaler_lab.sim.pooltable [--seeds N] [--volume-gib GIB]

The scenario is `gpu_pool` (`workloads.POOL_SCENARIOS`: GPU surges over an always-on base,
with a pool of six stopped GPU machines). The run without a pool is the same settings with every
`warm_pool` set to 0. Launches take `join_s` (90 s, jittered by the seed) to join, pool starts
`pool_start_s` (30 s); a stopped machine pays its volume (`volume_gib`, 100 GiB) at `gib_month_usd`
($0.08, gp3) per GiB-month, included in the cost. The targets checked (exit status 1 on a miss): the
pool cuts the mean p95 wait by at least 40% for at most 5% more mean cost, every job completes, no busy
termination and never above the maximum, with and without a pool; then the same with 30% of the starts
refused for capacity (they must fall through to launches: every job still completes).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from swarm_autoscaler_lab.sim.config import SimSettings, load_sim_settings
from swarm_autoscaler_lab.sim.faults import RandomFaults
from swarm_autoscaler_lab.sim.runner import default_options, run_trace
from swarm_autoscaler_lab.sim.workloads import POOL_SCENARIOS

SCENARIO = "gpu_pool"
KEYS = ("wait_p50_s", "wait_p95_s", "cost_usd", "disk_usd", "launches", "pool_starts")


def without_pool(settings: SimSettings) -> SimSettings:
    types = tuple(dataclasses.replace(tp, warm_pool=0) for tp in settings.policy.allowed_types)
    return dataclasses.replace(settings, policy=dataclasses.replace(settings.policy, allowed_types=types))


def _run(env: str, pool: bool, seed: int, start_refusals: float, volume_gib: float) -> dict[str, Any]:
    generate, _ = POOL_SCENARIOS[SCENARIO]
    settings = load_sim_settings(env)
    settings = settings if pool else without_pool(settings)
    faults = RandomFaults(seed=seed, start_refusal_rate=start_refusals)
    options = default_options(settings, volume_gib=volume_gib)
    return run_trace(generate(), settings, "ours", options, faults)[1]


def run_seeds(
    env: Path, seeds: int, start_refusals: float = 0.0, volume_gib: float = 100.0, workers: int = 2
) -> dict[str, list[dict[str, Any]]]:
    """variant ("pool" / "no pool") -> one summary per seed."""
    jobs = [
        (str(env), pool, seed, start_refusals, volume_gib) for pool in (True, False) for seed in range(seeds)
    ]
    with ProcessPoolExecutor(max_workers=workers) as executor:
        summaries = list(executor.map(_run, *zip(*jobs, strict=True)))
    out: dict[str, list[dict[str, Any]]] = {"pool": [], "no pool": []}
    for (_, pool, _, _, _), summary in zip(jobs, summaries, strict=True):
        out["pool" if pool else "no pool"].append(summary)
    return out


def _mean(runs: Sequence[dict[str, Any]], key: str) -> float:
    return sum(float(r[key]) for r in runs) / len(runs)


def markdown(results: dict[str, list[dict[str, Any]]], title: str) -> str:
    n = len(results["pool"])
    head = "| " + title + " | " + " | ".join(f"{k} (mean over {n} seeds, min to max)" for k in KEYS) + " |"
    lines = [head, "|" + "---|" * (len(KEYS) + 1)]
    for variant, runs in results.items():
        cells = []
        for key in KEYS:
            values = [float(r[key]) for r in runs]
            fmt = "{:.2f}" if key.endswith("usd") else "{:.0f}"
            cells.append(
                f"{fmt.format(sum(values) / n)} ({fmt.format(min(values))} to {fmt.format(max(values))})"
            )
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def misses(results: dict[str, list[dict[str, Any]]], check_gain: bool = True) -> list[str]:
    out = []
    for variant, runs in results.items():
        for r in runs:
            if r["completed_jobs"] != r["jobs"] or r["busy_terminations"] or r["max_exceeded"]:
                out.append(
                    f"{variant}: {r['completed_jobs']}/{r['jobs']} jobs, {r['busy_terminations']} busy "
                    f"terminations, {r['max_exceeded']} above max"
                )
    if check_gain:
        p95 = _mean(results["pool"], "wait_p95_s"), _mean(results["no pool"], "wait_p95_s")
        cost = _mean(results["pool"], "cost_usd"), _mean(results["no pool"], "cost_usd")
        if p95[0] > 0.6 * p95[1]:
            out.append(f"the pool cuts the p95 wait from {p95[1]:.0f} s to {p95[0]:.0f} s: less than 40%")
        if cost[0] > 1.05 * cost[1]:
            out.append(f"the pool costs ${cost[0]:.2f} against ${cost[1]:.2f}: more than 5% more")
    return out


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    seeds = int(args[args.index("--seeds") + 1]) if "--seeds" in args else 5
    volume = float(args[args.index("--volume-gib") + 1]) if "--volume-gib" in args else 100.0
    with tempfile.TemporaryDirectory() as tmp:
        env = Path(tmp) / f"{SCENARIO}.env"
        env.write_text(POOL_SCENARIOS[SCENARIO][1], encoding="utf-8")
        plain = run_seeds(env, seeds, volume_gib=volume)
        refused = run_seeds(env, seeds, start_refusals=0.3, volume_gib=volume)
    print(markdown(plain, f"{SCENARIO} ({volume:g} GiB volumes)"))
    print()
    print(markdown(refused, f"{SCENARIO}, 30% of starts refused"))
    missed = misses(plain) + misses(refused, check_gain=False)
    for line in missed:
        print(f"target missed: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
