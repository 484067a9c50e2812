"""Simulator benchmark: a 10,000-job day with up to 200 instances must simulate in under 60 s.

`run()` simulates it with the real planner, prints the figures and the top of a profile (to see
whether the engine or `plan()` dominates), and returns one dict per measurement.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Any

LIMIT_S = 60.0


def _settings() -> Any:
    from swarm_autoscaler.settings import TimingSettings
    from swarm_autoscaler.sim.config import SimEc2Settings, build_sim_settings

    types = {"m5.large": {}, "m5.xlarge": {}, "r5.xlarge": {}}
    ec2 = SimEc2Settings(allowed_types=types, min_instances=0, max_instances=200)  # type: ignore[arg-type]
    return build_sim_settings(TimingSettings(), ec2)


def run(profile: bool = True) -> list[dict[str, Any]]:
    from swarm_autoscaler.sim.runner import run_trace
    from swarm_autoscaler.sim.workloads import day_cycle

    jobs = day_cycle(seed=2026, n=10_000, spikes=4)
    settings = _settings()
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    sim_run, summary = run_trace(jobs, settings, "ours")
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - start
    plan_s = 0.0
    if profiler is not None:
        stats = pstats.Stats(profiler)
        plan_s = next((v[3] for k, v in stats.stats.items() if k[2] == "plan" and k[0].endswith("plan.py")), 0.0)  # type: ignore[attr-defined]
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())
    row = {
        "name": "sim_day_10k_jobs_200_instances",
        "seconds": round(seconds, 2),
        "limit_s": LIMIT_S,
        "ok": seconds < LIMIT_S,
        "ticks": sim_run.ticks,
        "jobs": len(jobs),
        "completed_jobs": summary["completed_jobs"],
        "peak_instances": summary["peak_instances"],
        "plan_share": round(plan_s / seconds, 3) if seconds else None,
    }
    print(
        f"simulated {row['jobs']} jobs, {row['ticks']} ticks, peak {row['peak_instances']} instances "
        f"in {row['seconds']} s (limit {LIMIT_S} s, profiled: {profile}); plan() took {row['plan_share']} of it"
    )
    return [row]


if __name__ == "__main__":
    run()
