"""Baseline strategies, run in the same simulator: each replaces `plan()` and nothing else.

Every baseline returns a `Plan` from a `Snapshot`, like the real planner, and goes through the same
`run_tick` observe/act path and the same simulated ports. They share housekeeping the real planner also
does (so the comparison is about scaling decisions, not about leaking machines): terminate an instance
whose node has not joined within `policy.max_start_time`, remove swarm nodes whose instance is gone, and
never remove a machine whose worker has tasks (the scale-in protection of a GPU fleet's queue rule). Memory a baseline
keeps (idle counters) lives in its planner object and is lost when the simulated daemon restarts.

The type launched for a task is its pinned type, else the cheapest allowed type whose capacity (less the
type's overhead) fits it; a task no type fits is ignored.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from swarm_autoscaler.core.actions import Action, Launch, Plan, RemoveNode, RetireWorkers, Terminate
from swarm_autoscaler.core.model import (
    Instance,
    InstanceType,
    Node,
    Policy,
    Resources,
    Snapshot,
    Task,
    Worker,
)
from swarm_autoscaler_lab.sim.scheduler import UNKNOWN_TASK_DURATION
from swarm_autoscaler_lab.sim.trace import Job

Planner = Callable[[Snapshot, Policy], Plan]


# --------------------------------------------------------------------------------------------- shared


def usable(snapshot: Snapshot, policy: Policy) -> dict[str, tuple[Resources, float]]:
    return usable_types(snapshot.instance_types, policy)


def usable_types(catalogue: Iterable[InstanceType], policy: Policy) -> dict[str, tuple[Resources, float]]:
    """Allowed type name -> (capacity less overhead, price per hour), in the policy's order."""
    known = {t.name: t for t in catalogue}
    out: dict[str, tuple[Resources, float]] = {}
    for tp in policy.allowed_types:
        it = known.get(tp.name)
        if it is not None:
            price = tp.price_per_hour if tp.price_per_hour is not None else (it.price_per_hour or 0.0)
            out[tp.name] = (it.resources.saturating_sub(tp.overhead), price)
    return out


def launch_type(task: Task, types: Mapping[str, tuple[Resources, float]]) -> str | None:
    """The pinned type if allowed and fitting, else the cheapest fitting allowed type."""
    if task.pinned_type is not None:
        got = types.get(task.pinned_type)
        return task.pinned_type if got is not None and task.needs.fits_in(got[0]) else None
    fitting = [
        (price, i, name) for i, (name, (cap, price)) in enumerate(types.items()) if task.needs.fits_in(cap)
    ]
    return min(fitting)[2] if fitting else None


def waiting_tasks(worker: Worker) -> list[Task]:
    """The worker's processing tasks beyond those that fit at once (FIFO): its estimated queue."""
    free = worker.resources
    out: list[Task] = []
    for i, task in enumerate(worker.processing):
        if task.needs.fits_in(free):
            free = free - task.needs
        else:
            out.extend(worker.processing[i:])
            break
    return out


def queued(snapshot: Snapshot) -> list[Task]:
    """Unrunnable tasks, then the estimated queue of every worker."""
    out = list(snapshot.unrunnable)
    for w in snapshot.workers:
        out.extend(waiting_tasks(w))
    return out


@dataclass(frozen=True, slots=True)
class Fleet:
    """The snapshot joined up: live instances, their nodes and workers, and housekeeping actions."""

    live: tuple[Instance, ...]
    node_of: Mapping[str, Node]  # instance id -> node
    worker_of: Mapping[str, Worker]  # instance id -> worker
    housekeeping: tuple[Action, ...]

    def idle(self, iid: str) -> bool:
        worker = self.worker_of.get(iid)
        return worker is not None and not worker.busy

    def empty(self, iid: str) -> bool:
        """Its worker runs and queues nothing (it may hold results, which retiring it moves first)."""
        worker = self.worker_of.get(iid)
        return worker is not None and not worker.processing

    def count(self, type_name: str | None = None) -> int:
        return sum(1 for i in self.live if type_name is None or i.type_name == type_name)


def fleet(snapshot: Snapshot, policy: Policy) -> Fleet:
    live = tuple(i for i in snapshot.instances if i.alive)
    nodes = {n.hostname: n for n in snapshot.nodes if not n.is_manager}
    workers = {w.hostname: w for w in snapshot.workers}
    node_of = {i.id: nodes[i.hostname] for i in live if i.hostname in nodes}
    worker_of = {i.id: workers[i.hostname] for i in live if i.hostname in workers}
    live_hosts = {i.hostname for i in live}
    actions: list[Action] = [
        RemoveNode(n.id, n.hostname, "instance gone") for h, n in nodes.items() if h not in live_hosts
    ]
    broken = [
        i.id for i in live if i.id not in node_of and snapshot.now - i.launched_at > policy.max_start_time
    ]
    if broken:
        actions.append(Terminate(tuple(broken), "never joined"))
    kept = tuple(i for i in live if i.id not in broken)
    return Fleet(kept, node_of, worker_of, tuple(actions))


def terminate(fl: Fleet, ids: Sequence[str], reason: str) -> list[Action]:
    """Retire the workers, then terminate the instances and remove their nodes."""
    if not ids:
        return []
    addresses = tuple(fl.worker_of[i].address for i in ids if i in fl.worker_of)
    nodes = tuple(fl.node_of[i].id for i in ids if i in fl.node_of)
    out: list[Action] = [RetireWorkers(addresses, reason)] if addresses else []
    out.append(Terminate(tuple(ids), reason, nodes))
    return out


def launches(counts: Mapping[str, int], reason: str) -> list[Action]:
    return [Launch(name, n, reason) for name, n in counts.items() if n > 0]


# --------------------------------------------------------------------------------------------- queue rule


@dataclass
class QueueRule:
    """The queue-length rule of a GPU fleet that surges above an always-on base.

    Its operators state it as::

        if nInstances == 0 and len(queue) > 0 ---> nInstances = 1
        if len(queue) > 5 and nInstances >= 1 ---> nInstances += 1   (evaluated every so often)

    plus "scale in machines that have not pulled a trial for a while", busy machines being protected.
    Here it is evaluated every tick, once per instance type (as one auto-scaling group per type): the
    queue of a type is the unrunnable tasks plus the workers' estimated queues (`waiting_tasks`) whose
    launch type is that type. Scale-in: with an empty queue for its type, a machine whose worker has
    been idle for `policy.drain_delay + policy.termination_delay` (the same total idle time the settings
    allow the daemon's machines before termination) is terminated (its worker retired first), down to
    `policy.min_instances`.
    Limits `min_instances`/`max_instances` are respected.
    """

    threshold: int = 5
    name: str = "queue-rule"
    stops_when_done: bool = False
    idle_since: dict[str, float] = field(default_factory=dict)

    def new_planner(self) -> Planner:
        return QueueRule(self.threshold)

    def __call__(self, snapshot: Snapshot, policy: Policy) -> Plan:
        fl = fleet(snapshot, policy)
        types = usable(snapshot, policy)
        per_type = Counter(t for t in (launch_type(task, types) for task in queued(snapshot)) if t)
        room = policy.max_instances - fl.count()
        grow: dict[str, int] = {}
        for name, length in per_type.items():
            have = fl.count(name)
            if room > 0 and ((have == 0 and length > 0) or length > self.threshold):
                grow[name] = 1
                room -= 1
        floor = policy.min_instances - fl.count() - sum(grow.values())
        if floor > 0:
            first = next(iter(types))
            grow[first] = grow.get(first, 0) + floor
        actions = [*fl.housekeeping, *launches(grow, "queue rule")]
        actions += terminate(fl, self._idle_out(fl, snapshot.now, policy, per_type), "idle")
        return Plan(tuple(actions), pending=sum(per_type.values()))

    def _idle_out(self, fl: Fleet, now: float, policy: Policy, per_type: Counter[str]) -> list[str]:
        for iid in [i for i in self.idle_since if not fl.idle(i)]:
            del self.idle_since[iid]
        out = []
        spare = fl.count() - policy.min_instances
        for inst in fl.live:
            if fl.idle(inst.id):
                since = self.idle_since.setdefault(inst.id, now)
                if (
                    spare > 0
                    and not per_type[inst.type_name]
                    and now - since >= policy.drain_delay + policy.termination_delay
                ):
                    out.append(inst.id)
                    spare -= 1
        return out


# --------------------------------------------------------------------------------------------- adaptive


@dataclass
class AdaptiveLike:
    """dask's `distributed.deploy.adaptive.Adaptive` with `Scheduler.adaptive_target`, per machine.

    Target (distributed 2026.8, `Scheduler.adaptive_target`, default `target_duration` 5 s)::

        cpu = ceil((occupancy of processing tasks + occupancy of unrunnable tasks) / target_duration)
        cpu = min(cpu, number of unrunnable + processing tasks)     # "a few long tasks"
        target = ceil(cpu / total worker threads * number of workers) if workers else cpu
        if unrunnable and no workers: target = max(1, target)

    where a task's occupancy is what dask expects of its prefix (`_get_prefix_duration`): the running
    average when known (`Task.expected`), else twice the longest run of a task of the same shape now
    executing, else `unknown-task-duration` (0.5 s); only the first 100 unrunnable tasks are priced, the
    rest scaled from them. Live, on a burst of unknown tasks this asks for few machines at first, as real
    Adaptive does. With `mean_duration` set, every task costs that instead (an oracle on the trace). A
    worker's threads are its CPUs. Recommendations (`Adaptive.recommendations`): above the current number of machines, launch
    up to the target (within `max_instances`); below it, the idle workers the scheduler would close are
    closed only after being recommended `wait_count` = 3 times in a row, never below `min_instances`.
    New machines take the launch types of queued tasks in turn (the cheapest allowed type otherwise).
    """

    mean_duration: float | None = None
    target_duration: float = 5.0
    wait_count: int = 3
    name: str = "adaptive"
    stops_when_done: bool = False
    close_counts: dict[str, int] = field(default_factory=dict)

    def new_planner(self) -> Planner:
        return AdaptiveLike(self.mean_duration, self.target_duration, self.wait_count)

    def target(self, snapshot: Snapshot) -> int:
        processing = sum(len(w.processing) for w in snapshot.workers)
        tasks = processing + len(snapshot.unrunnable)
        if self.mean_duration is not None:
            cpu = math.ceil(tasks * self.mean_duration / self.target_duration)
        else:
            cpu = math.ceil(self._occupancy(snapshot) / self.target_duration)
        cpu = min(cpu, tasks)
        if snapshot.workers:
            threads = sum(max(1.0, w.resources.cpus) for w in snapshot.workers)
            cpu = math.ceil(cpu / threads * len(snapshot.workers))
        if snapshot.unrunnable and not snapshot.workers:
            cpu = max(1, cpu)
        return cpu

    def _occupancy(self, snapshot: Snapshot) -> float:
        """`total_occupancy` plus the unrunnable tasks' occupancy, priced as dask prices them."""
        longest: dict[tuple[Resources, str | None], float] = {}
        for w in snapshot.workers:
            for t in w.processing:
                if t.executing and t.started is not None:
                    shape = (t.needs, t.pinned_type)
                    longest[shape] = max(longest.get(shape, 0.0), snapshot.now - t.started)

        def duration(t: Task) -> float:
            if t.expected is not None:
                return t.expected
            run = longest.get((t.needs, t.pinned_type), 0.0)
            return 2.0 * run if run > 0 else UNKNOWN_TASK_DURATION

        queued = snapshot.unrunnable
        queued_occupancy = sum(duration(t) for t in queued[:100])
        if len(queued) > 100:
            queued_occupancy *= len(queued) / 100
        return queued_occupancy + sum(duration(t) for w in snapshot.workers for t in w.processing)

    def __call__(self, snapshot: Snapshot, policy: Policy) -> Plan:
        fl = fleet(snapshot, policy)
        target = min(max(self.target(snapshot), policy.min_instances), policy.max_instances)
        actions = list(fl.housekeeping)
        have = fl.count()
        if target > have:
            self.close_counts.clear()
            actions += launches(self._types(snapshot, policy, target - have), "adaptive target")
        elif target < have:
            actions += terminate(fl, self._close(fl, have - target), "adaptive: idle 3 times")
        else:
            self.close_counts.clear()
        return Plan(tuple(actions), pending=len(queued(snapshot)))

    def _close(self, fl: Fleet, n: int) -> list[str]:
        """`workers_to_close`: workers running nothing (holding results or not: `retire_workers` moves
        them first); one holder stays when every worker would go, its results having nowhere to go."""
        candidates = [i.id for i in fl.live if fl.empty(i.id)][:n]
        if len(candidates) == fl.count() and any(not fl.idle(i) for i in candidates):
            candidates.remove(next(i for i in candidates if not fl.idle(i)))
        self.close_counts = {i: self.close_counts.get(i, 0) + 1 for i in candidates}
        return [i for i, c in self.close_counts.items() if c >= self.wait_count]

    def _types(self, snapshot: Snapshot, policy: Policy, n: int) -> Counter[str]:
        types = usable(snapshot, policy)
        wanted = [t for t in (launch_type(task, types) for task in queued(snapshot)) if t]
        if not wanted:
            wanted = [min(types, key=lambda name: types[name][1])]
        return Counter(wanted[i % len(wanted)] for i in range(n))


# --------------------------------------------------------------------------------------------- static


@dataclass
class Static:
    """A static fleet at the maximum size, as an operator would provision for peak without autoscaling.

    `fleet_types` gives how many machines of each type (summing to `max_instances`); `static_fleet`
    derives it from the trace by splitting `max_instances` across the launch types in proportion to
    their work (job duration x share of the machine), each used type getting at least one. Broken
    machines are replaced; nothing is ever scaled in, and the run (and its bill) ends when the last job
    completes, which is the most favourable reading for this baseline.
    """

    fleet_types: Mapping[str, int]
    name: str = "static"
    stops_when_done: bool = True

    def new_planner(self) -> Planner:
        return self

    def __call__(self, snapshot: Snapshot, policy: Policy) -> Plan:
        fl = fleet(snapshot, policy)
        missing = {name: n - fl.count(name) for name, n in self.fleet_types.items()}
        return Plan((*fl.housekeeping, *launches(missing, "static fleet")), pending=len(queued(snapshot)))


def share(needs: Resources, capacity: Resources) -> float:
    """The largest fraction of `capacity` that `needs` takes in any dimension."""
    parts = [needs.cpus / capacity.cpus if capacity.cpus else 0.0]
    parts.append(needs.ram / capacity.ram if capacity.ram else 0.0)
    parts.append(needs.gpus / capacity.gpus if capacity.gpus else 0.0)
    return max(parts)


def static_fleet(
    jobs: Sequence[Job], policy: Policy, types: Mapping[str, tuple[Resources, float]]
) -> dict[str, int]:
    work: dict[str, float] = {}
    for job in jobs:
        name = launch_type(job.task(), types)
        if name is not None:
            work[name] = work.get(name, 0.0) + job.duration_s * share(job.needs, types[name][0])
    if not work:
        return {next(iter(types)): policy.max_instances}
    total = sum(work.values())
    counts: dict[str, int] = {
        name: max(1, math.floor(policy.max_instances * w / total)) for name, w in work.items()
    }
    while sum(counts.values()) > policy.max_instances and max(counts.values()) > 1:
        counts[max(counts, key=lambda n: counts[n])] -= 1
    by_work = sorted(work, key=lambda n: -work[n])
    i = 0
    while sum(counts.values()) < policy.max_instances:
        counts[by_work[i % len(by_work)]] += 1
        i += 1
    return counts
