"""`swarm-autoscaler demo --mode dynamic`: the real daemon in the dynamic mode on the embedded local cloud,
scaling for swarm services instead of dask tasks.

The daemon is built from settings as `swarm-autoscaler run` builds it, with `AUTOSCALER_MODE=dynamic`:
EC2 is a moto server, machines are emulated and join the in-memory swarm, and the swarm's services and
tasks (`localcloud.memservices.MemoryServices`, placed by swarm's rules) are served by the Docker Engine API
imitation, which the daemon's own swarm services adapter reads. Three phases, each waiting for the
fleet to settle, not for a time:

1. **up**: `notebooks` (3 replicas of 1.5 CPUs, 2 GiB), `solver` (2 replicas of 3 CPUs, 8 GiB, pinned
   with `node.labels.instance-type==m5.xlarge`) and `legacy` (constrained to `node.labels.zone==onprem`,
   which no machine the daemon launches carries: reported unplaceable). Machines are launched, the
   tasks are placed on them as they join; the phase ends once every placeable task runs;
2. **down**: `notebooks` scaled to 1: the machines left empty are paused, drained and terminated, never
   one holding a task;
3. **end**: every service scaled to 0: the fleet goes back to its minimum plus reserve.

Each placement is printed as it happens; the summary says what was launched and terminated, and counts
busy disruptions (a task lost because its node was drained, removed or terminated): always 0.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from swarm_autoscaler.core.actions import Launch, Terminate
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import Availability
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions
from swarm_autoscaler_lab.localcloud.dockerapi import DockerApi
from swarm_autoscaler_lab.localcloud.memservices import MemoryServices
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.sim.servicetrace import ServiceSpec

NOTEBOOKS = ServiceSpec("notebooks", 1.5, 2.0, 0)
SOLVER = ServiceSpec("solver", 3.0, 8.0, 0, ("node.labels.instance-type==m5.xlarge",))
LEGACY = ServiceSpec("legacy", 1.0, 1.0, 0, ("node.labels.zone==onprem",))
UP = ((NOTEBOOKS, 3), (SOLVER, 2), (LEGACY, 1))


@dataclass(frozen=True, slots=True)
class DynamicDemoOptions:
    fast: bool = False
    json: bool = False
    timeout_s: float = 240.0
    quiet: bool = False  # no progress lines (the summary and JSON still print)


@dataclass
class Watch:
    """The daemon's tick hook: what it launched and terminated, and a check of every drained node."""

    services: MemoryServices
    swarm: MemorySwarm
    launches: int = 0
    terminations: int = 0
    peak: int = 0
    live: int = 0
    unplaceable: dict[str, str] = field(default_factory=dict)
    drained_busy: list[str] = field(default_factory=list)
    last: TickResult | None = None
    ticks: int = 0

    def __call__(self, result: TickResult | None, seconds: float, error: BaseException | None) -> None:
        if result is None:
            return
        self.last, self.ticks = result, self.ticks + 1
        self.live = sum(1 for i in result.snapshot.instances if i.alive)
        self.peak = max(self.peak, self.live)
        for o in result.outcomes:
            if o.ok and isinstance(o.action, Launch):
                self.launches += o.action.count
            elif o.ok and isinstance(o.action, Terminate):
                self.terminations += len(o.action.instance_ids)
        self.unplaceable.update((u.task_key, u.reason) for u in result.plan.unplaceable)
        on_node = self.services.on_node()
        for node in self.swarm.nodes.values():
            if node.availability is Availability.DRAIN and on_node.get(node.id):
                self.drained_busy.append(f"{node.hostname} drained holding {len(on_node[node.id])} task(s)")

    def settled(self, floor: int) -> bool:
        """No action planned, nothing waits but unplaceable tasks, no idle machine above `floor`."""
        if self.last is None or self.last.plan.actions:
            return False
        waiting = [
            t for t in self.services.tasks.values() if t.state == "pending" and t.id not in self.unplaceable
        ]
        busy = len(self.services.on_node())
        return not waiting and self.live <= busy + floor


async def run_dynamic_demo(opts: DynamicDemoOptions) -> dict[str, Any]:
    started = time.monotonic()

    def say(line: str) -> None:
        if not opts.quiet:
            print(f"{time.monotonic() - started:6.1f} s  {line}", flush=True)

    async with LocalCloud(LocalCloudOptions(fast=opts.fast)) as lc:
        swarm = lc.orchestrator
        assert isinstance(swarm, MemorySwarm) and lc.emulator is not None
        machines = lc.emulator.machines
        services = MemoryServices(
            swarm,
            lambda host: next((m.type_name for m in machines.values() if m.hostname == host), None),
            CATALOGUE,
        )
        async with DockerApi(swarm, services=services) as api:
            extra = {"AUTOSCALER_MODE": "dynamic", "AUTOSCALER_DOCKER_URL": api.url}
            async with lc.daemon(extra) as daemon:
                watch = Watch(services, swarm)
                daemon.on_tick = _chain(daemon.on_tick, watch)
                stop = asyncio.Event()
                runner = asyncio.create_task(daemon.run(stop))
                try:
                    phases = await _phases(
                        services, watch, lc.min_plus_reserve, say, started + opts.timeout_s
                    )
                finally:
                    stop.set()
                    await runner
    return {
        "mode": "dynamic",
        "phases_settled": phases,
        "settled": phases == ["up", "down", "end"],
        "placements": len(services.placed),
        "placed_on_types": sorted({p[3] for p in services.placed}),
        "unplaceable_tasks": sorted(watch.unplaceable),
        "unplaceable_reasons": sorted(set(watch.unplaceable.values())),
        "launches": watch.launches,
        "terminations": watch.terminations,
        "peak_instances": watch.peak,
        "final_instances": watch.live,
        "min_plus_reserve": lc.min_plus_reserve,
        "busy_disruptions": len(services.disruptions) + len(watch.drained_busy),
        "disruptions": services.disruptions + watch.drained_busy,
        "wall_s": round(time.monotonic() - started, 1),
        "swarm": "memory",
    }


def _chain(previous: Any, hook: Watch) -> Any:
    def both(result: TickResult | None, seconds: float, error: BaseException | None) -> None:
        if previous is not None:
            previous(result, seconds, error)
        hook(result, seconds, error)

    return both


async def _phases(
    services: MemoryServices, watch: Watch, floor: int, say: Callable[[str], None], deadline: float
) -> list[str]:
    """Run the three phases (module docstring); return the ones that settled before `deadline`."""
    done: list[str] = []
    plan: tuple[tuple[str, tuple[tuple[ServiceSpec, int], ...], Callable[[], bool]], ...] = (
        ("up", UP, lambda: _all_placeable_running(services, watch)),
        ("down", ((NOTEBOOKS, 1),), lambda: watch.settled(floor)),
        ("end", tuple((spec, 0) for spec, _ in UP), lambda: watch.settled(floor) and not services.tasks),
    )
    shown = 0
    for name, changes, finished in plan:
        for spec, replicas in changes:
            services.scale(spec, replicas)
            say(f"{name}: service {spec.name} scaled to {replicas}")
        ticks_at_start = watch.ticks
        while time.monotonic() < deadline:
            services.step()
            for _t, task, host, type_name in services.placed[shown:]:
                say(f"placed {task} on {host} ({type_name})")
            shown = len(services.placed)
            if watch.ticks > ticks_at_start + 1 and finished():
                say(
                    f"{name}: settled with {watch.live} machine(s) (launched {watch.launches}, terminated {watch.terminations})"
                )
                done.append(name)
                break
            await asyncio.sleep(0.1)
        else:
            return done
    return done


def _all_placeable_running(services: MemoryServices, watch: Watch) -> bool:
    tasks = [t for t in services.tasks.values() if t.id not in watch.unplaceable]
    wanted = sum(n for name, n in services.replicas.items() if name != LEGACY.name)
    return len(tasks) == wanted and all(t.state == "running" for t in tasks)


def summary_lines(result: dict[str, Any]) -> Iterator[str]:
    yield "dynamic demo summary"
    yield f"  phases settled        {', '.join(result['phases_settled']) or 'none'}"
    yield f"  tasks placed          {result['placements']} (on {', '.join(result['placed_on_types'])})"
    yield f"  unplaceable           {', '.join(result['unplaceable_reasons']) or 'none'}"
    yield f"  instances launched    {result['launches']} (peak {result['peak_instances']} at once)"
    yield f"  instances terminated  {result['terminations']}"
    yield f"  final fleet           {result['final_instances']} (minimum + reserve = {result['min_plus_reserve']})"
    yield f"  busy disruptions      {result['busy_disruptions']}"
    yield f"  wall time             {result['wall_s']} s"


def main(opts: DynamicDemoOptions) -> int:
    result = asyncio.run(run_dynamic_demo(opts))
    for line in summary_lines(result):
        print(line)
    if opts.json:
        print(json.dumps(result, sort_keys=True))
    ok = (
        result["settled"]
        and result["busy_disruptions"] == 0
        and result["final_instances"] == result["min_plus_reserve"]
    )
    return 0 if ok else 1
