"""Glue: build a strategy by name and run a trace through the engine (sync entry points)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from swarm_autoscaler_lab.sim.baselines import AdaptiveLike, QueueRule, Static, static_fleet, usable_types
from swarm_autoscaler_lab.sim.config import SimSettings
from swarm_autoscaler_lab.sim.engine import Options, Ours, Run, Strategy, TickHook, simulate
from swarm_autoscaler_lab.sim.report import summarize
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import Faults, Knobs

POLICIES = ("ours", "queue-rule", "adaptive", "static")


def make_strategy(name: str, jobs: Sequence[Job], settings: SimSettings) -> Strategy:
    """The strategy called `name` (one of `POLICIES`), sized from the trace where it needs to be."""
    if name == "ours":
        return Ours()
    if name == "queue-rule":
        return QueueRule()
    if name == "adaptive":
        return AdaptiveLike()  # prices tasks with dask's own estimates, as the real Adaptive does
    if name == "static":
        types = usable_types(settings.catalogue.values(), settings.policy)
        return Static(static_fleet(jobs, settings.policy, types))
    raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")


def default_options(settings: SimSettings, **knobs: Any) -> Options:
    """Options with the settings' tick interval and capacity back-off, and `knobs` overriding
    `Knobs` fields."""
    base = Knobs(backoff_initial_s=settings.backoff_initial, backoff_max_s=settings.backoff_max)
    return Options(tick_s=settings.poll_interval, knobs=dataclasses.replace(base, **knobs))


def run_trace(
    jobs: Sequence[Job],
    settings: SimSettings,
    policy_name: str = "ours",
    options: Options | None = None,
    faults: Faults | None = None,
    on_tick: TickHook | None = None,
) -> tuple[Run, dict[str, Any]]:
    """Simulate `jobs` under one policy; return the run and its summary."""
    options = options or default_options(settings)
    strategy = make_strategy(policy_name, jobs, settings)
    run = asyncio.run(simulate(jobs, settings.policy, settings.catalogue, strategy, options, faults, on_tick))
    return run, summarize(run, settings.catalogue)
