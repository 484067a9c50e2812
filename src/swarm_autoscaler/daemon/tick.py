"""One tick: observe through the ports -> plan() -> act through the ports.

The daemon, the demo and the simulator all call `run_tick`; none has its own path to the planner.
Observe is all-or-nothing: if any source fails, the tick acts on nothing. Act (`daemon.act`) turns
every error into data (an `Outcome`), so one failing action never stops the others, and re-checks every
disruptive action against a fresh read right before it runs.

A launch that EC2 refuses for capacity or a quota backs its type off (`Cloud.unavailable`); the tick then
falls through at once, not a tick later: the launches of a plan made again on a fresh listing of the
instances (the in-flight view: what was just launched counts) and the new back-offs are carried out in the
same tick, once. Only launches: every other action waits for the next tick's plan.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Launch, Plan
from swarm_autoscaler.core.cluster import Fleet, classify
from swarm_autoscaler.core.model import InstanceType, Policy, Snapshot
from swarm_autoscaler.core.plan import plan as make_plan
from swarm_autoscaler.daemon.act import (
    DEFAULT_ACT,
    ActConfig,
    ActionRefused,
    Outcome,
    Ports,
    StillLeader,
    act,
)
from swarm_autoscaler.daemon.jobs import Age
from swarm_autoscaler.errors import AutoscalerError

__all__ = [
    "ActConfig",
    "ActionRefused",
    "ObserveError",
    "Outcome",
    "Ports",
    "TickResult",
    "act",
    "observe",
    "run_tick",
]


@dataclass(frozen=True)
class TickResult:
    """One tick's snapshot, plan and outcomes, and the snapshot's classification (for logs, metrics and
    views; computed on first use, as a simulation never asks for it)."""

    snapshot: Snapshot
    policy: Policy
    plan: Plan
    outcomes: tuple[Outcome, ...]
    acted: bool
    waiting: float = 0.0  # seconds the oldest action still waiting has waited (set by the daemon)
    phases: tuple[tuple[str, float], ...] = ()  # seconds spent observing, planning and acting

    @functools.cached_property
    def cluster(self) -> Fleet:
        return classify(self.snapshot, self.policy)


class ObserveError(AutoscalerError):
    """One or more sources failed during observe; the tick acts on nothing."""


async def observe(ports: Ports, catalogue: Mapping[str, InstanceType], now: float) -> Snapshot:
    """Read every source concurrently and build one frozen Snapshot; any failure fails the whole read."""
    try:
        async with asyncio.TaskGroup() as tg:
            instances = tg.create_task(ports.cloud.list_instances())
            nodes = tg.create_task(ports.orchestrator.list_nodes())
            workload = tg.create_task(ports.workload.observe())
    except* Exception as group:
        reasons = "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions)
        raise ObserveError(f"observe failed, acting on nothing this tick: {reasons}") from None
    view = workload.result()
    return Snapshot(
        now=now,
        instance_types=tuple(catalogue.values()),
        instances=instances.result(),
        nodes=nodes.result(),
        workers=view.workers,
        unrunnable=view.unrunnable,
        unavailable=ports.cloud.unavailable(now),
        queued=view.queued,
        launch_hold=view.launch_hold,
    )


async def run_tick(
    ports: Ports,
    policy: Policy,
    catalogue: Mapping[str, InstanceType],
    now: float,
    *,
    leader: bool = True,
    still_leader: StillLeader = lambda: True,
    planner: Callable[[Snapshot, Policy], Plan] = make_plan,
    config: ActConfig = DEFAULT_ACT,
    deadline: float | None = None,
    age: Age = lambda _: 0,
) -> TickResult:
    """Observe, plan and (when `leader`) act. Raises ObserveError when observe fails.

    `deadline`: seconds the whole tick may take (None: none); act gets what observe and plan left of
    it, but never less than half of it, so that a slow observe cannot leave act no time at all.
    Overrides `config.deadline`. `age(action)`: the ticks it has waited (act starts the oldest first)."""
    started = time.monotonic()
    snapshot = await observe(ports, catalogue, now)
    observed = time.monotonic()
    plan = planner(snapshot, policy)
    planned = time.monotonic()
    phases: tuple[tuple[str, float], ...] = (("observe", observed - started), ("plan", planned - observed))
    if not leader:
        return TickResult(snapshot, policy, plan, (), acted=False, phases=phases)
    if deadline is not None:
        left = max(deadline - (time.monotonic() - started), deadline / 2)
        config = dataclasses.replace(config, deadline=left)
    outcomes = await act(plan, snapshot, ports, still_leader, config, age)
    if deadline is not None:
        config = dataclasses.replace(config, deadline=deadline - (time.monotonic() - started))
    again = await _fall_through(ports, snapshot, policy, planner, outcomes, still_leader, config, age)
    if again is not None:
        plan = dataclasses.replace(plan, actions=plan.actions + again[0].actions)
        outcomes += again[1]
    phases += (("act", time.monotonic() - planned),)
    return TickResult(snapshot, policy, plan, outcomes, acted=True, phases=phases)


async def _fall_through(
    ports: Ports,
    snapshot: Snapshot,
    policy: Policy,
    planner: Callable[[Snapshot, Policy], Plan],
    outcomes: tuple[Outcome, ...],
    still_leader: StillLeader,
    config: ActConfig,
    age: Age,
) -> tuple[Plan, tuple[Outcome, ...]] | None:
    """After a refused launch: the launches of the plan made again on what is true now (see the module
    doc), carried out; None when no launch was refused, there is no time left, or the listing fails (the
    next tick plans again)."""
    refused = any(isinstance(o.action, Launch) and o.kind == "capacity" for o in outcomes)
    if not refused or (config.deadline is not None and config.deadline <= 0) or not still_leader():
        return None
    try:
        instances = await ports.cloud.list_instances()
    except AutoscalerError:
        return None
    fresh = dataclasses.replace(
        snapshot, instances=instances, unavailable=ports.cloud.unavailable(snapshot.now)
    )
    launches = tuple(a for a in planner(fresh, policy).actions if isinstance(a, Launch))
    if not launches:
        return None
    again = Plan(launches)
    return again, await act(again, fresh, ports, still_leader, config, age)
