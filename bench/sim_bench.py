"""Simulator benchmark: a 10,000-job day with up to 200 instances must simulate in under 60 s.

`run()` simulates it with the real planner, timing the planner's share of the wall time, and returns one
dict per measurement; `main()` prints them. Run: `python -m bench sim` (or `python bench/sim_bench.py`);
`--profile` also prints the top of a cProfile of the same run (slower), to see where the engine spends its
time.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import sys
import time
from typing import Any

LIMIT_S = 60.0


class _TimedOurs:
    """The real planner, with the time spent inside it accumulated."""

    name = "ours"
    stops_when_done = False

    def __init__(self) -> None:
        self.seconds = 0.0

    def new_planner(self) -> Any:
        from swarm_autoscaler.core.plan import plan

        def timed(snapshot: Any, policy: Any) -> Any:
            start = time.perf_counter()
            try:
                return plan(snapshot, policy)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def run(profile: bool = False) -> list[dict[str, Any]]:
    from swarm_autoscaler.config.settings import TimingSettings
    from swarm_autoscaler_lab.sim.config import SimEc2Settings, build_sim_settings
    from swarm_autoscaler_lab.sim.engine import simulate
    from swarm_autoscaler_lab.sim.report import summarize
    from swarm_autoscaler_lab.sim.runner import default_options
    from swarm_autoscaler_lab.sim.workloads import day_cycle

    types: dict[str, Any] = {"m5.large": {}, "m5.xlarge": {}, "r5.xlarge": {}}
    ec2 = SimEc2Settings.model_validate({"allowed_types": types, "min_instances": 0, "max_instances": 200})
    settings = build_sim_settings(TimingSettings(), ec2)
    jobs = day_cycle(seed=2026, n=10_000, spikes=4)
    strategy = _TimedOurs()
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    sim = simulate(jobs, settings.policy, settings.catalogue, strategy, default_options(settings))
    sim_run = asyncio.run(sim)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - start
    summary = summarize(sim_run, settings.catalogue)
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue())
    row = {
        "name": "sim_day_10k_jobs_200_instances",
        "seconds": round(seconds, 2),
        "limit_s": LIMIT_S,
        "ok": seconds < LIMIT_S,
        "profiled": profile,
        "ticks": sim_run.ticks,
        "jobs": len(jobs),
        "completed_jobs": summary["completed_jobs"],
        "peak_instances": summary["peak_instances"],
        "plan_seconds": round(strategy.seconds, 2),
        "plan_share": round(strategy.seconds / seconds, 3) if seconds else None,
    }
    return [row]


def main(flags: list[str]) -> None:
    for row in run(profile="--profile" in flags):
        print(
            f"simulated {row['jobs']} jobs ({row['completed_jobs']} completed), {row['ticks']} ticks, "
            f"peak {row['peak_instances']} instances in {row['seconds']} s (limit {row['limit_s']:g} s, "
            f"profiled: {row['profiled']}); plan() took {row['plan_seconds']} s = {row['plan_share']:.0%}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
