"""Safety hunting: many small random runs with faults on, invariants checked after every tick.

Each seed generates a `Case`: a handful of jobs arriving at any moment, a small policy, and scripted
faults (refused launch calls, machines that never join, daemon restarts at given ticks); about half the
cases hold results in the client, half run dask with the packing preload (`Knobs.dask_packing`). The case is
run against the strategy (the real planner by default) and checked:

- after every tick: no busy node drained, retired, removed or terminated (the world records each one
  as it happens); live instances never above `max_instances`;
- at the end: every job completed, the run settled before its deadline, and after a grace period the
  fleet is back to `settled_fleet(policy)` (min + reserve) with nothing leaked (every live instance
  has a ready node, every node a live instance, nothing left shutting down).

"Back to min + reserve" is checked exactly: the planner keeps a reserve out of machines it drained (seed
000: "scale down drained nodes until we reach the reserve") and launches what a type's reserve lacks once
nothing is pending, so a type the workload never used ends with its reserve too.

About a quarter of the seeds `hunt` and the command run (`is_dynamic`) draw a dynamic-mode world instead:
swarm services with reservations and constraints, the same faults, the same invariants and 0 busy
disruptions (`sim.hunt_services`); the command prints how many it ran.

A failing case is shrunk (delta debugging over its list of events: jobs and faults) to the shortest list
that still fails, and printed with its seed:

    .venv/bin/python -m swarm_autoscaler_lab.sim.hunt [N_SEEDS] [FIRST_SEED]
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, Self, TypeVar

from swarm_autoscaler.core.actions import DrainNode, RemoveNode, Retired, RetireWorkers, Stop, Terminate
from swarm_autoscaler.core.model import InstanceState, Policy, Resources, Snapshot, TypePolicy
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.sim import hunt_services
from swarm_autoscaler_lab.sim.config import priced_catalogue
from swarm_autoscaler_lab.sim.engine import Options, Ours, Run, Strategy, settled_fleet, simulate
from swarm_autoscaler_lab.sim.faults import ScriptedFaults
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import EPOCH, Knobs

TICK_S = 10.0
DYNAMIC_SHARE = 0.25  # of the seeds `hunt` and `main` run: dynamic-mode worlds (`is_dynamic`)
KNOBS = Knobs(join_s=60.0, join_jitter_s=40.0, worker_start_s=10.0, shutdown_s=20.0, backoff_initial_s=20.0)
SHAPES = (  # (cpus, ram_gib, gpus, pinned type)
    (1.0, 2.0, 0, None),
    (2.0, 6.0, 0, None),
    (1.0, 1.0, 0, "c5.large"),
    (4.0, 12.0, 0, None),
    (2.0, 8.0, 1, None),
)


@dataclass(frozen=True)
class Case:
    """One generated scenario; `events()` lists what shrinking may drop."""

    seed: int
    policy: Policy
    jobs: tuple[Job, ...]
    faults: ScriptedFaults
    hold: bool = False  # the client keeps every result until the last job finished (`Knobs.hold_results`)
    packing: bool = False  # dask runs the packing preload (`Knobs.dask_packing`)
    spot: bool = False  # machines launched to work are spot (`Knobs.spot_price_factor`)

    def events(self) -> list[tuple[str, object]]:
        f = self.faults
        return [
            *(("job", j) for j in self.jobs),
            *(("refuse-launch-call", n) for n in sorted(f.refused_calls)),
            *(("never-joins-instance", n) for n in sorted(f.never_join)),
            *(("restart-at-tick", n) for n in sorted(f.restarts)),
            *(("refuse-start-call", n) for n in sorted(f.refused_starts)),
            *(("interrupt-instance", n) for n in sorted(f.interrupted)),
        ]

    def with_events(self, events: Sequence[tuple[str, object]]) -> Case:
        def ints(kind: str) -> frozenset[int]:
            return frozenset(v for k, v in events if k == kind and isinstance(v, int))

        jobs = tuple(v for k, v in events if k == "job" and isinstance(v, Job))
        faults = ScriptedFaults(
            self.seed,
            ints("refuse-launch-call"),
            ints("never-joins-instance"),
            ints("restart-at-tick"),
            refused_starts=ints("refuse-start-call"),
            interrupted=ints("interrupt-instance"),
        )
        return replace(self, jobs=jobs, faults=faults)


def generate(seed: int) -> Case:
    rng = random.Random(seed)
    gpu = rng.random() < 0.3
    names = ["m5.large", "m5.xlarge", "c5.large"] + (["g4dn.xlarge"] if gpu else [])
    types = tuple(TypePolicy(n, reserve=rng.choice((0, 0, 1)), overhead=Resources(0.0, 0)) for n in names)
    min_i = rng.choice((0, 0, 1))
    policy = Policy(
        allowed_types=types,
        min_instances=min_i,
        max_instances=min_i + sum(t.reserve for t in types) + rng.randint(1, 4),
        max_start_time=300.0,
        drain_delay=rng.choice((20.0, 60.0)),
        termination_delay=rng.choice((30.0, 120.0)),
        node_down_timeout=120.0,
        max_launch_per_tick=rng.choice((0, 0, 2)),
    )
    shapes = SHAPES if gpu else SHAPES[:-1]
    jobs = []
    for i in range(rng.randint(1, 12)):
        cpus, ram, gpus, pinned = rng.choice(shapes)
        jobs.append(
            Job(i, round(rng.uniform(0, 900), 1), round(rng.uniform(20, 600), 1), cpus, ram, gpus, pinned)
        )
    jobs.sort(key=lambda j: j.submit_s)
    faults = ScriptedFaults(
        seed,
        frozenset(n for n in range(1, 40) if rng.random() < 0.15),
        frozenset(n for n in range(1, 40) if rng.random() < 0.1),
        frozenset(n for n in range(1, 400) if rng.random() < 0.02),
    )
    # Drawn last, so that the other draws (and the seeds' cases) are unchanged. The client releases its
    # results only once every job finished: with room for one working machine beside the reserves, a
    # held result there and a job needing another type wait on each other for ever, so not then.
    hold = rng.random() < 0.5 and policy.max_instances - sum(t.reserve for t in types) >= 2
    return _with_spot(_with_packing(_with_pools(Case(seed, policy, tuple(jobs), faults, hold=hold))))


def _with_spot(case: Case) -> Case:
    """Spot machines and EC2's interruption notices (a notice, then the machine taken 120 s later) on
    about a third of the cases, drawn from a generator of their own so that the other draws of every
    seed stay what they were."""
    rng = random.Random(f"spot:{case.seed}")
    if rng.random() >= 0.35:
        return case
    interrupted = frozenset(n for n in range(1, 40) if rng.random() < 0.25)
    return replace(case, spot=True, faults=replace(case.faults, interrupted=interrupted))


def _with_packing(case: Case) -> Case:
    """dask's packing preload on about half the cases, drawn from a generator of its own so that the
    other draws of every seed stay what they were."""
    return replace(case, packing=random.Random(f"packing:{case.seed}").random() < 0.5)


def _with_pools(case: Case) -> Case:
    """Warm pools, per-type bases and refused starts on about half the cases, drawn from a generator of
    their own so that the cases of the seeds stay what they were before pools existed otherwise."""
    rng = random.Random(f"pool:{case.seed}")
    if rng.random() < 0.5:
        return case
    types = tuple(
        replace(tp, warm_pool=rng.choice((0, 1, 2)), minimum=rng.choice((0, 0, 0, 1)))
        for tp in case.policy.allowed_types
    )
    bases = sum(tp.minimum for tp in types)
    policy = replace(
        case.policy,
        allowed_types=types,
        max_instances=max(case.policy.max_instances, bases + sum(tp.reserve for tp in types) + 1),
    )
    refused = frozenset(n for n in range(1, 30) if rng.random() < 0.3)
    # A client holding every result needs room for two working machines beside the reserves and the
    # bases (see generate); the bases take room of their own.
    hold = case.hold and policy.max_instances - bases - sum(tp.reserve for tp in types) >= 2
    return replace(case, policy=policy, faults=replace(case.faults, refused_starts=refused), hold=hold)


def check(case: Case, strategy: Strategy | None = None, reached: Counter[str] | None = None) -> list[str]:
    """Run the case; return every violated invariant (empty when safe). `reached` counts what the run
    went through, so that a caller can print how often the hunt reaches the cases it protects: queued
    restricted tasks the packing preload moved to another worker (`moved`), EC2's interruption notices
    given (`notices`), and the seeds with any of either (`seeds_moved`, `seeds_noticed`)."""
    policy = case.policy
    knobs = replace(
        KNOBS, hold_results=case.hold, dask_packing=case.packing, spot_price_factor=0.35 if case.spot else 0.0
    )
    options = Options(tick_s=TICK_S, knobs=knobs, deadline_s=3600.0, linger_s=policy.node_down_timeout + 120)
    problems: list[str] = []

    def after_tick(run: Run, result: TickResult) -> None:
        problems.extend(_tick_problems(run, result))

    run = asyncio.run(
        simulate(
            case.jobs, policy, priced_catalogue(policy), strategy or Ours(), options, case.faults, after_tick
        )
    )
    problems += [f"t={v.time_s:.0f}s: {v.what}" for v in run.world.violations]
    if reached is not None:
        moved, notices = run.world.scheduler.moves, run.world.notices
        reached.update(moved=moved, notices=notices, seeds_moved=moved > 0, seeds_noticed=notices > 0)
    return problems + _final_problems(run)


def _tick_problems(run: Run, result: TickResult) -> list[str]:
    """Checked after every tick: the plan touched no busy machine of the snapshot it saw, and the world
    holds no more live instances than the maximum."""
    t = result.snapshot.now - EPOCH
    out = []
    alive = len(run.world.alive())
    if alive > run.policy.max_instances:
        out.append(f"t={t:.0f}s: {alive} live instances > max {run.policy.max_instances}")
    snap = result.snapshot
    # A worker holding only results may be retired (dask moves them first, and keeps a worker whose
    # results cannot move: the world records a lost result), and its node drained in the same plan
    # when the drain expects it retired; a worker with tasks may not.
    working = {w.address for w in snap.workers if w.processing}
    retired = {h for a in result.plan.actions if isinstance(a, RetireWorkers) for h in _hosts(snap, a)}
    # A machine EC2 gave notice for is let go busy or not (core/interrupt.py): EC2 takes it anyway.
    noticed = {i.hostname for i in snap.instances if i.interrupted_at is not None}
    working -= {w.address for w in snap.workers if w.hostname in noticed}
    busy_hosts = {w.hostname for w in snap.workers if w.busy} - noticed
    host_of_node = {n.id: n.hostname for n in snap.nodes}
    host_of_instance = {i.id: i.hostname for i in snap.instances}
    for action in result.plan.actions:
        hosts: list[str] = []
        if isinstance(action, DrainNode | RemoveNode):
            hosts = [action.hostname]
            if (
                isinstance(action, DrainNode)
                and _holding_only(snap, action.hostname)
                and action.hostname in retired
            ):
                hosts = [] if any(isinstance(c, Retired) for c in action.expect) else hosts
        elif isinstance(action, Terminate | Stop):
            hosts = [host_of_instance.get(i, "") for i in action.instance_ids]
            hosts += [host_of_node.get(n, "") for n in action.node_ids]
        elif isinstance(action, RetireWorkers) and working & set(action.addresses):
            out.append(f"t={t:.0f}s: plan retires busy worker(s) {sorted(working & set(action.addresses))}")
        out += [f"t={t:.0f}s: plan {type(action).__name__} on busy {h}" for h in hosts if h in busy_hosts]
    return out


def _hosts(snap: Snapshot, action: RetireWorkers) -> set[str]:
    return {w.hostname for w in snap.workers if w.address in action.addresses}


def _holding_only(snap: Snapshot, host: str) -> bool:
    """Every worker on `host` runs and queues nothing; some hold results."""
    on = [w for w in snap.workers if w.hostname == host]
    return bool(on) and not any(w.processing for w in on)


def _final_problems(run: Run) -> list[str]:
    world, policy = run.world, run.policy
    out = []
    done = len(world.scheduler.completed_at)
    if done != len(run.jobs):
        out.append(f"only {done}/{len(run.jobs)} jobs completed by t={run.end - EPOCH:.0f}s")
    if not run.finished:
        out.append(f"never settled: {len(world.alive())} live instances at the deadline")
    alive = world.alive()
    if len(alive) != settled_fleet(policy):
        out.append(
            f"fleet ended at {len(alive)} live instances, expected min + reserve {settled_fleet(policy)}"
        )
    nodes = {n.instance_id: n for n in world.nodes.values()}
    for inst in alive:
        node = nodes.get(inst.id)
        if node is None or node.status != "ready":
            out.append(f"leaked instance {inst.id} ({inst.type_name}): no ready node")
    alive_ids = {i.id for i in alive}
    out += [
        f"leaked node {n.hostname}: its instance is gone"
        for n in world.nodes.values()
        if n.instance_id not in alive_ids
    ]
    return out + _pool_problems(run)


def _pool_problems(run: Run) -> list[str]:
    """At the end, no type holds more stopped machines than its pool (a stray is terminated), and each
    pool is full when the maximum leaves room for it beside the settled fleet."""
    world, policy = run.world, run.policy
    stopped: dict[str, int] = {}
    for inst in world.instances.values():
        if inst.state is InstanceState.STOPPED:  # (billing closed every instance at the end)
            stopped[inst.type_name] = stopped.get(inst.type_name, 0) + 1
    out = []
    room = policy.max_instances - settled_fleet(policy) >= sum(tp.warm_pool for tp in policy.allowed_types)
    for tp in policy.allowed_types:
        have = stopped.pop(tp.name, 0)
        if have > tp.warm_pool or (room and have < tp.warm_pool):
            out.append(f"the warm pool of {tp.name} ended with {have} stopped machines, not {tp.warm_pool}")
    out += [f"{n} stopped {name} outside any warm pool at the end" for name, n in stopped.items()]
    return out


class Shrinkable(Protocol):
    """A case as `shrink` sees it: a list of events, and the case made of some of them."""

    def events(self) -> list[tuple[str, object]]: ...
    def with_events(self, events: Sequence[tuple[str, object]]) -> Self: ...


C = TypeVar("C", bound=Shrinkable)


def shrink(case: C, fails: Callable[[C], bool]) -> C:
    """The smallest case (by events) found by delta debugging that still `fails`."""
    events = case.events()
    chunk = max(1, len(events) // 2)
    while True:
        i, changed = 0, False
        while i < len(events):
            trial = events[:i] + events[i + chunk :]
            if trial != events and fails(case.with_events(trial)):
                events, changed = trial, True
            else:
                i += chunk
        if chunk == 1 and not changed:
            return case.with_events(events)
        chunk = max(1, chunk // 2)


def describe(case: Case, problems: Sequence[str]) -> str:
    lines = [
        f"seed {case.seed}: {len(problems)} violation(s), e.g. {problems[0]}",
        f"  policy: {case.policy}",
        f"  client holds results: {case.hold}; dask packing preload: {case.packing}; spot: {case.spot}",
    ]
    for kind, value in case.events():
        if isinstance(value, Job):
            pin = f" pinned {value.instance_type}" if value.instance_type else ""
            lines.append(
                f"  job at {value.submit_s}s for {value.duration_s}s: cpus={value.cpus:g} "
                f"ram={value.ram_gib:g}GiB gpus={value.gpus}{pin}"
            )
        else:
            lines.append(f"  {kind} {value}")
    return "\n".join(lines)


def is_dynamic(seed: int) -> bool:
    """Whether the seed draws a dynamic-mode world (`sim.hunt_services`): about a quarter do, drawn from
    a generator of its own so that the dask cases of the other seeds stay what they were."""
    return random.Random(f"mode:{seed}").random() < DYNAMIC_SHARE


def hunt(
    seeds: Sequence[int], strategy: Strategy | None = None, reached: Counter[str] | None = None
) -> list[str]:
    """Check every seed; for each failure return the description of its shrunk case. With the real
    planner (no `strategy`), the seeds of `is_dynamic` run dynamic-mode worlds instead. `reached`: see
    `check`."""
    reports = []
    for seed in seeds:
        if strategy is None and is_dynamic(seed):
            reports += hunt_services.hunt_one(seed)
            continue
        case = generate(seed)
        if check(case, strategy, reached):
            small = shrink(case, lambda c: bool(check(c, strategy)))
            reports.append(describe(small, check(small, strategy)))
    return reports


def main(argv: Sequence[str]) -> int:
    count = int(argv[0]) if argv else 200
    first = int(argv[1]) if len(argv) > 1 else 0
    seeds = range(first, first + count)
    reached: Counter[str] = Counter()
    reports = hunt(seeds, reached=reached)
    for report in reports:
        print(report)
    dynamic = sum(is_dynamic(s) for s in seeds)
    print(f"{count} seeds ({dynamic} of them dynamic-mode worlds), {len(reports)} failing")
    print(
        f"reached: {reached['moved']} queued restricted tasks moved by the packing preload (in "
        f"{reached['seeds_moved']} seeds), {reached['notices']} spot interruption notices (in "
        f"{reached['seeds_noticed']} seeds)"
    )
    return 1 if reports else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
