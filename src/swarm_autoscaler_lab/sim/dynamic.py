"""Simulating the dynamic mode: a service trace (`sim.servicetrace`) on a `ServiceWorld`, ticked by the
daemon's own `tick.run_tick` with the real planner, the dynamic mode's policy (`core.services.
dynamic_policy`: consolidation off, as the daemon runs it) and `SimServicesWorkload` as the workload.

Ticks fall every `tick_s` on the virtual clock, as in `sim.engine`. The run ends at the first tick after
the trace's last change where no task waits for a node except the ones the plan reports unplaceable, no
machine is booting or has yet to join, and no more machines are live than the ones holding tasks plus the policy's floor
(`settled_fleet`); or `deadline_s` after the last change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm_autoscaler.core.model import InstanceState, InstanceType, NodeStatus, Policy
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.services import dynamic_policy
from swarm_autoscaler.daemon.loop import InFlightCloud
from swarm_autoscaler.daemon.tick import Ports, TickResult, run_tick
from swarm_autoscaler_lab.sim.config import SimSettings
from swarm_autoscaler_lab.sim.engine import SIM_ACT, Options, Planner, settled_fleet
from swarm_autoscaler_lab.sim.servicetrace import Scale
from swarm_autoscaler_lab.sim.swarmsim import ServiceKnobs, ServiceWorld, SimServicesWorkload
from swarm_autoscaler_lab.sim.world import EPOCH, Faults, SimCloud, SimOrchestrator, Violation


@dataclass
class ServiceRun:
    """The record of one simulated dynamic-mode run."""

    changes: Sequence[Scale]
    policy: Policy
    world: ServiceWorld
    end: float = EPOCH
    ticks: int = 0
    restarts: int = 0
    peak_instances: int = 0
    max_exceeded: int = 0
    failed_actions: int = 0
    unplaceable: dict[str, str] = field(default_factory=dict)  # task key -> reason, as planned
    finished: bool = False

    @property
    def busy_disruptions(self) -> list[Violation]:
        return self.world.violations


ServiceTickHook = Callable[[ServiceRun, TickResult], None]


def daemon_ports(world: ServiceWorld, policy: Policy, catalogue: Mapping[str, InstanceType]) -> Ports:
    """What a (re)started daemon in dynamic mode builds onto the world."""
    workload = SimServicesWorkload(world, tuple(catalogue.values()), policy)
    return Ports(InFlightCloud(SimCloud(world, policy.subnets)), SimOrchestrator(world), workload)


async def simulate_services(
    changes: Sequence[Scale],
    policy: Policy,
    catalogue: Mapping[str, InstanceType],
    options: Options | None = None,
    faults: Faults | None = None,
    on_tick: ServiceTickHook | None = None,
    service_knobs: ServiceKnobs | None = None,
    planner: Planner = plan,
) -> ServiceRun:
    """Run the service trace in dynamic mode until settled or past the deadline (`planner`: the real
    one, or a planted bug for the hunt's own test)."""
    options = options or Options()
    policy = dynamic_policy(policy)
    overhead = {tp.name: tp.overhead for tp in policy.allowed_types}
    world = ServiceWorld(
        catalogue,
        {},
        overhead,
        options.knobs,
        faults or Faults(),
        service_knobs=service_knobs or ServiceKnobs(),
    )
    world.schedule(changes)
    run = ServiceRun(changes, policy, world)
    last = EPOCH + max((c.end_s for c in changes), default=0.0)
    ports = daemon_ports(world, policy, catalogue)
    tick_no, finished_at = 0, None
    while True:
        now = EPOCH + options.first_tick_s + tick_no * options.tick_s
        world.advance(now)
        if tick_no and _restart_due(options, world.faults, tick_no):
            ports, run.restarts = daemon_ports(world, policy, catalogue), run.restarts + 1
        result = await run_tick(ports, policy, catalogue, now, planner=planner, config=SIM_ACT)
        _record(run, result)
        if on_tick is not None:
            on_tick(run, result)
        if finished_at is None and now >= last and settled(run, result):
            finished_at = now
        if (
            finished_at is not None and now >= finished_at + options.linger_s
        ) or now >= last + options.deadline_s:
            break
        tick_no += 1
    run.end, run.ticks, run.finished = now, tick_no + 1, finished_at is not None
    world.bill_open(now)
    return run


def _restart_due(options: Options, faults: Faults, tick_no: int) -> bool:
    return (options.restart_every > 0 and tick_no % options.restart_every == 0) or faults.restart(tick_no)


def _record(run: ServiceRun, result: TickResult) -> None:
    alive = run.world.alive()
    run.peak_instances = max(run.peak_instances, len(alive))
    run.failed_actions += sum(1 for o in result.outcomes if not o.ok)
    if len(alive) > run.policy.max_instances:
        run.max_exceeded += 1
    run.unplaceable.update((u.task_key, u.reason) for u in result.plan.unplaceable)


def settled(run: ServiceRun, result: TickResult) -> bool:
    """Nothing waits but unplaceable tasks, nothing boots (every live machine has a ready node), no idle
    machine above the floor."""
    world = run.world
    unplaceable = {u.task_key for u in result.plan.unplaceable}
    if any(t.state == "pending" and t.id not in unplaceable for t in world.tasks.values()):
        return False
    if any(i.state is InstanceState.PENDING for i in world.instances.values()):
        return False
    ready = {n.id for n in world.nodes.values() if n.status is NodeStatus.READY}
    if any(i.node_id not in ready for i in world.alive()):
        return False  # a machine that never joined: the planner has yet to replace it
    held = {t.node_id for t in world.tasks.values() if t.node_id and t.desired == "running"}
    busy = sum(1 for i in world.alive() if i.node_id in held)
    if not busy:  # nothing runs: exactly the floor (below it, the planner is still launching)
        return len(world.alive()) == settled_fleet(run.policy)
    return len(world.alive()) <= busy + settled_fleet(run.policy)


def run_services(
    changes: Sequence[Scale],
    settings: SimSettings,
    options: Options,
    faults: Faults | None = None,
    on_tick: ServiceTickHook | None = None,
) -> tuple[ServiceRun, dict[str, Any]]:
    """Simulate a service trace (sync entry point); return the run and its summary."""
    run = asyncio.run(
        simulate_services(changes, settings.policy, settings.catalogue, options, faults, on_tick)
    )
    return run, summarize_services(run)


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize_services(run: ServiceRun) -> dict[str, Any]:
    """The figures `simulate` prints for a service trace."""
    world = run.world
    reasons = sorted(set(run.unplaceable.values()))
    return {
        "mode": "dynamic",
        "policy": "ours",
        "services": len({c.spec.name for c in run.changes}),
        "tasks_started": len(world.waits),
        "tasks_unplaceable": len(run.unplaceable),
        "unplaceable_reasons": reasons,
        "wait_p50_s": round(_quantile(world.waits, 0.5), 1),
        "wait_p95_s": round(_quantile(world.waits, 0.95), 1),
        "wait_max_s": round(max(world.waits, default=0.0), 1),
        "cost_usd": round(world.cost_usd, 4),
        "instance_hours": round(world.instance_seconds / 3600.0, 3),
        "launches": world.launches,
        "terminations": world.terminations,
        "peak_instances": run.peak_instances,
        "busy_disruptions": len(world.violations),
        "max_exceeded": run.max_exceeded,
        "failed_actions": run.failed_actions,
        "end_s": round(run.end - EPOCH, 1),
        "finished": run.finished,
    }


def render_services(summary: Mapping[str, Any], title: str) -> Any:
    """A rich table of one summary: one row per figure."""
    from rich.table import Table

    table = Table(title=f"{title} (dynamic mode)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        text = "; ".join(value) if isinstance(value, list) else str(value)
        table.add_row(key, text or "-")
    return table
