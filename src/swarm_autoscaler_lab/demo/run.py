"""`swarm-autoscaler demo`: the real daemon on an embedded local cloud, with a workload and a dashboard.

The daemon is built exactly as `swarm-autoscaler run` builds it (same settings loader, same EC2 adapter
against a moto server, same loop and planner); only the endpoints are local. Without root or dockerd
the swarm is kept in memory behind the Orchestrator port; `--swarm` uses real dockerd nodes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm_autoscaler.core.actions import Terminate
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler.daemon.commands import pool_lines
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.demo.dashboard import Dashboard, View
from swarm_autoscaler_lab.demo.timeline import Sample, Timeline
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions


@dataclass(frozen=True, slots=True)
class DemoOptions:
    tasks: int = 200
    fast: bool = False
    swarm: bool = False
    json: bool = False
    out_dir: Path = Path("demo-out")
    timeout_s: float = 170.0
    seed: int = 7


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    seconds: float
    resources: dict[str, float]


def workload(n: int, fast: bool, seed: int) -> tuple[list[Job], Job]:
    """About n tasks of a few seconds with mixed needs (some need a bigger type), plus one impossible task."""
    import random

    rng = random.Random(seed)
    scale = 0.4 if fast else 1.0
    jobs: list[Job] = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.70:
            res = {"CPU": 1.0, "RAM": float(1 * GIB)}
        elif kind < 0.90:
            res = {"CPU": 2.0, "RAM": float(6 * GIB)}
        else:
            res = {"CPU": 4.0, "RAM": float(12 * GIB)}  # needs an xlarge
        jobs.append(Job(f"job-{i:04d}", round(rng.uniform(2.0, 5.0) * scale, 2), res))
    impossible = Job("job-impossible", 1.0, {"CPU": 512.0, "RAM": float(4 * GIB)})
    return jobs, impossible


@dataclass
class Recorder:
    """The daemon's tick hook for the demo: counts, timeline and dashboard view."""

    started: float
    min_plus_reserve: int
    timeline: Timeline = field(default_factory=Timeline)
    view: View = field(default_factory=View)
    seen_instances: set[str] = field(default_factory=set)
    terminations: int = 0
    peak: int = 0
    live: int = 0
    instance_seconds: float = 0.0
    unplaceable: set[str] = field(default_factory=set)
    last: TickResult | None = None
    _last_t: float | None = None

    def __call__(self, result: TickResult | None, seconds: float, error: BaseException | None) -> None:
        if result is None:
            return
        t = time.monotonic() - self.started
        snap = result.snapshot
        live = [i for i in snap.instances if i.alive]
        if self._last_t is not None:
            self.instance_seconds += self.live * (t - self._last_t)
        self._last_t, self.live = t, len(live)
        self.peak = max(self.peak, len(live))
        self.seen_instances.update(i.id for i in live)
        self.terminations += sum(
            len(o.action.instance_ids) for o in result.outcomes if o.ok and isinstance(o.action, Terminate)
        )
        self.unplaceable.update(u.task_key for u in result.plan.unplaceable)
        counts = result.cluster.counts()
        running = sum(min(len(w.processing), int(w.resources.cpus)) for w in snap.workers)
        types: dict[str, int] = {}
        for inst in live:
            types[inst.type_name] = types.get(inst.type_name, 0) + 1
        self.view.elapsed, self.view.buckets, self.view.types = t, counts, types
        self.view.pool = pool_lines(result)
        self.view.workers, self.view.pending, self.view.running = (
            len(snap.workers),
            result.plan.pending,
            running,
        )
        self.view.unplaceable = len(result.plan.unplaceable)
        self.view.record_actions(result, t)
        self.timeline.add(Sample(t, result.plan.pending, running, counts))
        self.last = result

    def settled(self) -> bool:
        """Back to the minimum plus the reserve, nothing pending, nothing in flight."""
        if self.last is None:
            return False
        plan = self.last.plan
        waiting = plan.pending - len(plan.unplaceable)  # unplaceable tasks never get capacity
        return self.live == self.min_plus_reserve and waiting == 0 and not plan.actions


async def run_demo(opts: DemoOptions) -> dict[str, Any]:
    from distributed import Client

    started = time.monotonic()
    # the scheduler as the README deploys it (docker/scheduler-stack.yml): with the packing preload
    cloud_opts = LocalCloudOptions(
        fast=opts.fast,
        real_swarm=opts.swarm,
        real_boot=opts.swarm,
        scheduler_preload=("swarm_autoscaler.adapters.dask_packing",),
    )
    async with LocalCloud(cloud_opts) as lc, lc.daemon() as daemon:
        recorder = Recorder(started, lc.min_plus_reserve)
        previous_hook = daemon.on_tick

        def hook(result: TickResult | None, seconds: float, error: BaseException | None) -> None:
            if previous_hook is not None:
                previous_hook(result, seconds, error)
            recorder(result, seconds, error)

        daemon.on_tick = hook
        stop = asyncio.Event()
        runner = asyncio.create_task(daemon.run(stop))
        jobs, impossible = workload(opts.tasks, opts.fast, opts.seed)
        async with Client(lc.scheduler_address, asynchronous=True) as client:  # type: ignore[no-untyped-call]
            futures = [
                # time.sleep itself: a worker started from the worker image (`--swarm`) can import it
                client.submit(time.sleep, j.seconds, key=j.key, resources=j.resources, pure=False)
                for j in jobs
            ]
            hopeless = client.submit(
                time.sleep,
                impossible.seconds,
                key=impossible.key,
                resources=impossible.resources,
                pure=False,
            )
            recorder.view.total = len(jobs)
            with Dashboard() as dash:
                completed = await _watch(futures, recorder, dash, started, opts.timeout_s)
            await hopeless.cancel()
            for f in futures:
                await f.cancel()
            submitted = len(jobs) + 1
        stop.set()
        await runner
        wall = time.monotonic() - started
        png = recorder.timeline.draw(
            opts.out_dir / "timeline.png", f"swarm-autoscaler demo ({len(jobs)} tasks)"
        )
        return {
            "completed_tasks": completed,
            "submitted_tasks": submitted,
            "unplaceable_tasks": len(recorder.unplaceable),
            "unplaceable_keys": sorted(recorder.unplaceable),
            "launches": len(recorder.seen_instances),
            "terminations": recorder.terminations,
            "peak_instances": recorder.peak,
            "final_instances": recorder.live,
            "min_plus_reserve": lc.min_plus_reserve,
            "settled": recorder.settled(),
            "wall_s": round(wall, 1),
            "instance_seconds": round(recorder.instance_seconds, 1),
            "timeline_png": str(png),
            "swarm": "dockerd" if opts.swarm else "memory",
        }


async def _watch(
    futures: list[Any], recorder: Recorder, dash: Dashboard, started: float, timeout: float
) -> int:
    """Wait for every placeable task, release the results (a worker holding the only copy of a result is
    never retired), then wait for the scale-down; refresh the dashboard meanwhile."""
    deadline = started + timeout
    completed = 0
    while time.monotonic() < deadline:
        completed = max(completed, sum(1 for f in futures if f.status == "finished"))
        recorder.view.done = completed
        dash.update(recorder.view)
        if futures and completed == len(futures):
            for f in futures:
                f.release()
            futures.clear()
        if not futures and recorder.settled():
            break
        await asyncio.sleep(0.25)
    return completed


def summary_lines(result: dict[str, Any]) -> Iterator[str]:
    yield "demo summary"
    yield f"  tasks completed       {result['completed_tasks']} of {result['submitted_tasks']} submitted"
    yield f"  unplaceable           {result['unplaceable_tasks']} ({', '.join(result['unplaceable_keys'])})"
    yield f"  instances launched    {result['launches']} (peak {result['peak_instances']} at once)"
    yield f"  instances terminated  {result['terminations']}"
    yield f"  final fleet           {result['final_instances']} (minimum + reserve = {result['min_plus_reserve']})"
    yield f"  instance-seconds      {result['instance_seconds']}"
    yield f"  wall time             {result['wall_s']} s"
    yield f"  timeline              {result['timeline_png']}"


def main(opts: DemoOptions) -> int:
    result = asyncio.run(run_demo(opts))
    for line in summary_lines(result):
        print(line)
    if opts.json:
        print(json.dumps(result, sort_keys=True))
    ok = result["settled"] and result["completed_tasks"] == result["submitted_tasks"] - 1
    return 0 if ok else 1
