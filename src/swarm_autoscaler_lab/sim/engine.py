"""The discrete-event simulation: a trace, a policy and faults in; a record of the run out.

Time is virtual (`World.now`). Ticks fall every `tick_s` seconds; before each one every event due by then
(job submissions, machines joining, workers starting, tasks finishing) is processed in time order. Each
tick is the daemon's: `tick.run_tick` observes the world through the simulated ports, calls the
strategy's planner (`plan.plan` for "ours"; a baseline replaces only that function) and acts through
the same ports. A daemon restart builds new ports and a new planner, so nothing the daemon held in
memory survives; only the instance tags and node marks kept by the world do.

The run ends at the first tick where every job has completed and the fleet has settled (no more live
instances than the policy's floor, `settled_fleet`), or, for strategies that never scale in, when the
last job completes; and in any case at `deadline_s` after the trace's lower-bound makespan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from swarm_autoscaler.core.actions import Plan
from swarm_autoscaler.core.model import InstanceState, InstanceType, Policy, PoolPhase, Snapshot
from swarm_autoscaler.daemon.loop import InFlightCloud
from swarm_autoscaler.daemon.tick import ActConfig, Ports, TickResult, run_tick
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import (
    EPOCH,
    SIM_CLUSTER,
    Faults,
    Knobs,
    SimCloud,
    SimOrchestrator,
    SimWorkload,
    Violation,
    World,
)

Planner = Callable[[Snapshot, Policy], Plan]
# The simulated daemon's act: launches carry the sim cluster's ownership label; no deadline (virtual time).
SIM_ACT = ActConfig(cluster_name=SIM_CLUSTER)


class Strategy(Protocol):
    """What is simulated: a planner per daemon start (baselines keep memory in it, lost on restart)."""

    name: str
    #: True when the strategy never scales in: the run (and billing) ends when the last job completes.
    stops_when_done: bool

    def new_planner(self) -> Planner: ...


@dataclass(frozen=True, slots=True)
class Options:
    tick_s: float = 5.0
    knobs: Knobs = field(default_factory=Knobs)
    restart_every: int = 0  # restart the daemon every N ticks (0 = never)
    deadline_s: float = 6 * 3600.0  # after the lower-bound makespan, give up
    linger_s: float = 0.0  # keep ticking this long after the run is finished (to check for leaks)
    first_tick_s: float = 0.0  # when the first tick falls: an autoscaler's reaction to work at t=0


@dataclass(frozen=True, slots=True)
class Sample:
    """The world after one tick: for the timeline plot."""

    t: float
    pending: int  # unrunnable plus waiting on a worker
    running: int
    booting: int  # launched, node not (yet) joined
    active: int  # nodes with availability active
    drained: int
    stopping: int  # shutting down


@dataclass
class Run:
    """The record of one simulated run."""

    strategy: str
    jobs: Sequence[Job]
    policy: Policy
    world: World
    end: float = EPOCH
    ticks: int = 0
    restarts: int = 0
    peak_instances: int = 0
    max_exceeded: int = 0
    failed_actions: int = 0
    samples: list[Sample] = field(default_factory=list)
    excess: list[Violation] = field(default_factory=list)
    finished: bool = False  # False when the deadline stopped the run
    warnings: list[str] = field(default_factory=list)  # about the setup: see `start_time_warnings`

    @property
    def busy_terminations(self) -> int:
        return len(self.world.violations)


TickHook = Callable[[Run, TickResult], None]


class Ours:
    """The real planner, `swarm_autoscaler.core.plan.plan`, unchanged, with the daemon's memory of the
    work seen (`core.arrivals.Learner`, as `daemon.loop.Daemon` runs it; a restart starts a new one)."""

    name = "ours"
    stops_when_done = False

    def new_planner(self) -> Planner:
        from swarm_autoscaler.core.arrivals import Learner
        from swarm_autoscaler.core.plan import plan

        return Learner(plan)


def start_time_warnings(knobs: Knobs, policy: Policy) -> list[str]:
    """Why machines would be taken for broken: a worker comes up at most `join_s + join_jitter_s +
    worker_start_s` after its launch, and the planner treats an instance whose worker is not up after
    `max_start_time` as broken (it terminates and replaces it). Empty when every machine is in time."""
    latest = knobs.join_s + knobs.join_jitter_s + knobs.worker_start_s
    if latest <= policy.max_start_time:
        return []
    return [
        f"join {knobs.join_s:g} s + jitter {knobs.join_jitter_s:g} s + worker start {knobs.worker_start_s:g} s"
        f" = {latest:g} s exceeds the maximum start time of {policy.max_start_time:g} s: machines that"
        " start late are terminated as broken and relaunched; raise MAX_START_TIME or lower the knobs"
    ]


def settled_fleet(policy: Policy) -> int:
    """How many live instances the planner keeps with no work: the minimum (at least the per-type
    bases) plus the warm reserve. Stopped warm-pool machines are not live."""
    base = max(policy.min_instances, sum(tp.minimum for tp in policy.allowed_types))
    return base + sum(tp.reserve for tp in policy.allowed_types)


def daemon_ports(world: World, subnets: Sequence[str] = ()) -> Ports:
    """Fresh daemon-side adapters: what a restarted daemon would build (launching in `subnets`)."""
    cloud = InFlightCloud(SimCloud(world, subnets))
    return Ports(cloud, SimOrchestrator(world), SimWorkload(world))


async def simulate(
    jobs: Sequence[Job],
    policy: Policy,
    catalogue: Mapping[str, InstanceType],
    strategy: Strategy,
    options: Options = Options(),
    faults: Faults | None = None,
    on_tick: TickHook | None = None,
) -> Run:
    """Run `jobs` against `strategy` until done, settled or past the deadline."""
    overhead = {tp.name: tp.overhead for tp in policy.allowed_types}
    world = World(catalogue, {j.key: j for j in jobs}, overhead, options.knobs, faults or Faults())
    for job in jobs:
        world.events.push(EPOCH + job.submit_s, "submit", job.key)
    run = Run(strategy.name, jobs, policy, world)
    run.warnings.extend(start_time_warnings(options.knobs, policy))
    deadline = EPOCH + max((j.submit_s + j.duration_s for j in jobs), default=0.0) + options.deadline_s
    ports, planner = daemon_ports(world, policy.subnets), strategy.new_planner()
    tick_no, finished_at = 0, None
    while True:
        now = EPOCH + options.first_tick_s + tick_no * options.tick_s
        world.advance(now)
        if tick_no and _restart_due(options, world.faults, tick_no):
            ports, planner = daemon_ports(world, policy.subnets), strategy.new_planner()
            run.restarts += 1
        result = await run_tick(ports, policy, catalogue, now, planner=planner, config=SIM_ACT)
        _record(run, result, now)
        if on_tick is not None:
            on_tick(run, result)
        if finished_at is None and _finished(run, strategy, now):
            finished_at = now
        if (finished_at is not None and now >= finished_at + options.linger_s) or now >= deadline:
            break
        tick_no += 1
    run.end, run.ticks, run.finished = now, tick_no + 1, finished_at is not None
    world.bill_open(now)
    return run


def _restart_due(options: Options, faults: Faults, tick_no: int) -> bool:
    periodic = options.restart_every > 0 and tick_no % options.restart_every == 0
    return periodic or faults.restart(tick_no)


def _record(run: Run, result: TickResult, now: float) -> None:
    world = run.world
    alive = world.alive()
    run.peak_instances = max(run.peak_instances, len(alive))
    run.failed_actions += sum(1 for o in result.outcomes if not o.ok)
    if len(alive) > run.policy.max_instances:
        run.max_exceeded += 1
        run.excess.append(
            Violation(now - EPOCH, f"{len(alive)} live instances > max {run.policy.max_instances}")
        )
    sched = world.scheduler
    joined = {n.instance_id for n in world.nodes.values()}
    active = sum(1 for n in world.nodes.values() if n.availability == "active" and n.status == "ready")
    drained = sum(1 for n in world.nodes.values() if n.availability == "drain" and n.status == "ready")
    run.samples.append(
        Sample(
            t=now - EPOCH,
            pending=sched.waiting_count(),
            running=sched.running_count(),
            booting=sum(1 for i in alive if i.id not in joined),
            active=active,
            drained=drained,
            stopping=sum(1 for i in world.instances.values() if i.state is InstanceState.SHUTTING_DOWN),
        )
    )


def all_done(run: Run) -> bool:
    return len(run.world.scheduler.completed_at) == len(run.jobs)


def _finished(run: Run, strategy: Strategy, now: float) -> bool:
    if not all_done(run):
        return False
    if strategy.stops_when_done:
        return True
    world = run.world
    booting = any(i.state is InstanceState.PENDING for i in world.instances.values())
    return not booting and len(world.alive()) <= settled_fleet(run.policy) and _pools_settled(run)


def _pools_settled(run: Run) -> bool:
    """No machine prepares for a warm pool, and every pool is full while the maximum leaves room to
    prepare one beside the settled fleet: pools refill one machine at a time when the bases and
    reserves leave a single free place, and a run that ended between two refills ended with one still
    preparing (a live machine without a node, read as a leak)."""
    policy, world = run.policy, run.world
    if any(i.pool is PoolPhase.PREPARE for i in world.alive()):
        return False
    if policy.max_instances <= settled_fleet(policy):
        return True
    stopped = Counter(i.type_name for i in world.instances.values() if i.state is InstanceState.STOPPED)
    return all(stopped[tp.name] >= tp.warm_pool for tp in policy.allowed_types)
