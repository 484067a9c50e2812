"""What a run achieved, the trace's lower bounds, and how to show them (JSON or a rich table).

Lower bounds come from the trace alone, whatever the policy:

- `makespan_lb_s = max(submit_s + duration_s)`: no job can finish before it was submitted and ran.
- `cost_lb_usd = max(work, base)` where `work` is the sum over jobs of
  `duration x price of t / 3600 x share of t`, minimised over the allowed types t that can run the
  job (its pinned type, or any type whose capacity less overhead fits it), the share being the largest
  fraction of t's usable capacity (CPUs, RAM or GPUs) the job takes: a machine cannot run more than
  1/share such jobs at once. `base` is the always-on floor, `min_instances x cheapest allowed price x
  makespan_lb`. Both are lower bounds, so is their maximum. Boot time, idle time and packing losses are
  not counted, so no real policy reaches the bound.

Waits are from submission to the start of the run that completed (a task restarted after losing its
worker waits again). A job not completed by the end of the run counts with a wait up to the end, so an
unfinished run cannot look good.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from swarm_autoscaler.core.model import InstanceType, Policy
from swarm_autoscaler_lab.sim.baselines import share, usable_types
from swarm_autoscaler_lab.sim.engine import Run
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import EPOCH

FIELDS = (
    "completed_jobs",
    "makespan_s",
    "wait_p50_s",
    "wait_p95_s",
    "instance_seconds",
    "cost_usd",
    "launches",
    "terminations",
    "peak_instances",
    "busy_terminations",
    "max_exceeded",
    "makespan_lb_s",
    "cost_lb_usd",
    "makespan_ratio",
    "cost_ratio",
)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def makespan_lb(jobs: Sequence[Job]) -> float:
    return max((j.submit_s + j.duration_s for j in jobs), default=0.0)


def cost_lb(jobs: Sequence[Job], policy: Policy, catalogue: Mapping[str, InstanceType]) -> float:
    types = usable_types(catalogue.values(), policy)
    work = 0.0
    for job in jobs:
        task = job.task()
        costs = [
            job.duration_s * price / 3600.0 * share(job.needs, cap)
            for name, (cap, price) in types.items()
            if (task.pinned_type in (None, name)) and job.needs.fits_in(cap)
        ]
        work += min(costs, default=0.0)
    cheapest = min((price for _, price in types.values()), default=0.0)
    base = policy.min_instances * cheapest * makespan_lb(jobs) / 3600.0
    return max(work, base)


def summarize(run: Run, catalogue: Mapping[str, InstanceType]) -> dict[str, Any]:
    sched = run.world.scheduler
    waits = []
    for job in run.jobs:
        start = sched.started_at.get(job.key) if job.key in sched.completed_at else None
        waits.append((start if start is not None else run.end) - EPOCH - job.submit_s)
    makespan = max(sched.completed_at.values(), default=EPOCH) - EPOCH
    lb_m, lb_c = makespan_lb(run.jobs), cost_lb(run.jobs, run.policy, catalogue)
    out: dict[str, Any] = {
        "policy": run.strategy,
        "jobs": len(run.jobs),
        "completed_jobs": len(sched.completed_at),
        "makespan_s": round(makespan, 1),
        "wait_p50_s": round(percentile(waits, 50), 1),
        "wait_p95_s": round(percentile(waits, 95), 1),
        "instance_seconds": round(run.world.instance_seconds, 1),
        "cost_usd": round(run.world.cost_usd, 4),
        "disk_usd": round(run.world.disk_usd, 4),
        "launches": run.world.launches,
        "pool_starts": run.world.starts,
        "terminations": run.world.terminations,
        "peak_instances": run.peak_instances,
        "busy_terminations": run.busy_terminations,
        "max_exceeded": run.max_exceeded,
        "makespan_lb_s": round(lb_m, 1),
        "cost_lb_usd": round(lb_c, 4),
        "makespan_ratio": round(makespan / lb_m, 3) if lb_m else None,
        "cost_ratio": round(run.world.cost_usd / lb_c, 3) if lb_c else None,
        "restarts": run.restarts,
        "ticks": run.ticks,
        "task_restarts": sched.restarts,
        "failed_actions": run.failed_actions,
        "interruptions": run.world.notices,  # spot notices given (Knobs.spot_price_factor)
        "reclaimed": run.world.reclaims,  # machines EC2 took before the daemon let them go
    }
    return out


def render_table(summaries: Sequence[Mapping[str, Any]], title: str = "simulation") -> Any:
    """A rich Table with one column per summary."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    for s in summaries:
        table.add_column(str(s["policy"]), justify="right")
    for name in ("jobs", *FIELDS, "restarts", "task_restarts"):
        table.add_row(name, *(_fmt(s.get(name)) for s in summaries))
    return table


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)
