"""A dask-like scheduler on the virtual clock: where tasks go, when they start and finish.

It follows distributed's rules closely enough for the planner to face the same situations:

- A task goes to a *valid* worker: one whose total resources fit the task's needs (dask resource
  restrictions) and, for a pinned task, one running on the pinned instance type. Among valid workers
  not cordoned it picks the least occupied (`worker_objective`: occupancy / nthreads), where a worker's
  occupancy is the sum of its processing tasks' prefix durations (`_get_prefix_duration`: the average
  when known, else twice the longest run seen so far, else `unknown-task-duration`, 0.5 s). Tasks with
  resource restrictions are never root-ish, so the scheduler's own queue (`queued`) is not involved.
- A task with no valid worker is *unrunnable* (dask's `no-worker` state). When a worker joins, every
  unrunnable task it can run goes to processing on it at once
  (`bulk_schedule_unrunnable_after_adding_worker`): the first worker to join takes a whole burst.
- A worker runs its tasks in submission order (priority) while a thread is free and their resources fit
  in what it has free (the worker's `constrained` queue: the head blocks the rest). The scheduler lists
  running *and* waiting tasks as `processing`; it cannot tell them apart. It lists them in the order
  of its set of them (`WorkerState.processing` is a set of tasks hashed by key, and string hashes are
  salted per process), neither running first nor in priority order: an 8-CPU task waiting behind
  running 1-CPU ones may come first. The view does the same, each key at a fixed pseudo-random rank
  per run (`set_order`, salted by the run's seed); tests/adapters/dask pins the real order.
- Work stealing (`sim.stealing`, after distributed's `WorkStealing.balance`, every 1 s): idle workers
  steal waiting tasks from the most occupied ones, *with or without* a duration estimate (an unknown
  prefix costs its default duration, so the occupancies still compare task counts), until they are no
  longer idle (fewer than half the cluster's average occupancy per thread). So a worker that joins a
  burst takes about half the average share within a second. A trace names no functions, so the jobs
  with the same requests and pin form one task prefix (`Job.kind`); its estimate is unknown until a
  task of it finishes, then `0.5 x last + 0.5 x previous` (`TaskPrefix.add_duration`), and unknown
  again once a running task of it has run for more than twice the estimate (`add_exec_time`) until the
  next one finishes. The view reports each task's estimate (`Task.expected`) and each running task's
  start, as the daemon's dask adapter does. Measured on distributed 2026.8 (tests/sim pin the figures).
- A worker that leaves (drain, termination, retirement) releases its tasks: they are decided again from
  scratch, losing the progress of the running ones.
- With `hold` (`Knobs.hold_results`), the client keeps every result until the last job has finished
  (it gathers them at the end): a finished task's result stays on its worker, which then holds data no
  other worker has (`Worker.has_unique_data`). Retiring workers moves their results first, to the
  running worker holding the fewest (dask's `RetireWorker` policy takes its recipients among running
  workers not being retired); a worker whose results have nowhere to go is kept (`retire` does not
  return it). Without `hold` (the default), results are released as they arrive.
- With `packing` (`Knobs.dask_packing`), the scheduler runs the optional preload
  `swarm_autoscaler.adapters.dask_packing`: `_decide` ranks the same valid, uncordoned workers by that
  module's own `packing_rank` (the worker's resources as the project's workers advertise them, `CPU`,
  `RAM` and `GPU`; the needs of every task processing there, running or waiting, as `used_resources`)
  and then by dask's objective. Stealing is unchanged, as it is in dask. The preload's mover
  (`QueuedMover`) runs too, every `INTERVAL` (0.5 s, a "mover" event scheduled after any change): a task
  waiting on a worker (the one waiting longest first) goes to the uncordoned valid worker that can start it now (a free thread, its needs
  in what is free, nothing waiting there), the best by `packing_rank`, and starts there. Live
  (`python -m bench queued`) a GPU job queued behind a busy one-GPU worker started on a second GPU worker
  0.3-0.5 s after it joined; dask alone never moved it (its stealing takes only from a worker with more
  tasks than threads, as `sim.stealing` models). The simulator knows which tasks wait, so the real
  mover's wrong guesses (a refused move costs it a round) are not modelled.
- A cordoned worker (dask's `closing_gracefully` status) gets no new task, steals none and starts none
  of those waiting on it; its running tasks finish. Uncordoned, it is like a worker that joined.

Why one file of this size: the rules above are one state machine over the same task and worker tables;
work stealing, the one part that stands apart, is in `sim.stealing`.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm_autoscaler.adapters.dask_packing import CANNOT_START_NOW, INTERVAL, Rank, packing_rank
from swarm_autoscaler.core.model import Resources, Task, Worker
from swarm_autoscaler.core.ports import WorkloadView
from swarm_autoscaler_lab.sim.trace import Job, Kind

UNKNOWN_TASK_DURATION = 0.5  # distributed.scheduler.unknown-task-duration
BALANCE_INTERVAL = 1.0  # distributed.scheduler.work-stealing-interval


class EventQueue:
    """The simulation's future: (time, kind, payload) entries popped in time order (FIFO on ties)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()

    def push(self, time: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (time, next(self._seq), kind, payload))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, str, Any]:
        time, _, kind, payload = heapq.heappop(self._heap)
        return time, kind, payload


@dataclass(slots=True)
class SimWorker:
    address: str
    name: str
    hostname: str
    type_name: str
    capacity: Resources
    free: Resources
    running: dict[str, float] = field(default_factory=dict)  # key -> end time
    waiting: list[str] = field(default_factory=list)
    cordoned: bool = False
    held: set[str] = field(default_factory=set)  # results a client keeps, only here
    counts: dict[Kind, int] = field(default_factory=dict)  # processing tasks per prefix
    view: Worker | None = None  # cached model value, dropped on every change
    nthreads: int = field(init=False, default=1)  # one per CPU, as the emulator and deployment start it

    def __post_init__(self) -> None:
        self.nthreads = max(1, math.ceil(self.capacity.cpus - 1e-9))

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def nprocessing(self) -> int:
        return len(self.running) + len(self.waiting)

    def occupancy(self, durations: Mapping[Kind, float]) -> float:
        """distributed's `WorkerState.occupancy`: the expected seconds of its processing tasks."""
        return sum(n * durations[kind] for kind, n in self.counts.items())


class Scheduler:
    """Tasks and workers. `events` receives ("done", (address, key, end)) completions."""

    def __init__(
        self,
        jobs: Mapping[str, Job],
        events: EventQueue,
        hold: bool = False,
        packing: bool = False,
        hash_seed: int = 0,
    ) -> None:
        self.jobs = jobs
        # Where each task is listed among its worker's processing tasks (see the module docstring).
        self._listed: dict[str, int] = {k: set_order(k, hash_seed) for k in jobs}
        self.hold = hold
        self.packing = packing
        self.tasks: dict[str, Task] = {k: j.task() for k, j in jobs.items()}
        self._executing: dict[str, Task] = {}  # the tasks' views while they run
        self._waiting: dict[str, Task] = {}  # the tasks' views while they wait on a worker
        self._view_estimates: dict[Kind, float] = {}  # the estimates the cached views carry
        self.events = events
        self.workers: dict[str, SimWorker] = {}
        self.unrunnable: dict[str, None] = {}  # ordered set
        self.where: dict[str, str] = {}  # key -> worker address while processing
        self.started_at: dict[str, float] = {}
        self.completed_at: dict[str, float] = {}
        self.restarts = 0
        self.estimates: dict[Kind, float] = {}  # each prefix's duration estimate (absent: unknown)
        # Per prefix, a heap of (start, key) of its running tasks (entries of ended runs pruned lazily).
        self._starts: dict[Kind, list[tuple[float, str]]] = {}
        self._needs: dict[Kind, Resources] = {j.kind: j.needs for j in jobs.values()}
        self._max_exec: dict[Kind, float] = {}  # the longest finished run per prefix (`max_exec_time`)
        self._view: WorkloadView | None = None  # cached until anything changes
        self._balance_due: float | None = None  # the next stealing pass, when one is scheduled
        self._mover_due: float | None = None  # the next pass of the preload's mover (with `packing`)
        self.moves = 0  # tasks the preload's mover moved
        self._durations: dict[Kind, float] | None = None  # `durations()` at `_durations_at`
        self._durations_at = 0.0
        self.steals = 0

    # ------------------------------------------------------------------ queries

    def valid(self, key: str, worker: SimWorker) -> bool:
        job = self.jobs[key]
        if job.instance_type is not None and job.instance_type != worker.type_name:
            return False
        return self.tasks[key].needs.fits_in(worker.capacity)

    def running_count(self) -> int:
        return sum(len(w.running) for w in self.workers.values())

    def waiting_count(self) -> int:
        return len(self.unrunnable) + sum(len(w.waiting) for w in self.workers.values())

    def view(self, now: float) -> WorkloadView:
        """What the scheduler reports at `now`; tasks on workers carry the current duration estimate,
        and running ones their start time."""
        for kind in list(self.estimates):
            self._estimate_known(kind, now)  # drops estimates a running task has overrun
        if self.estimates != self._view_estimates:
            self._estimates_changed()
        if self._view is None:
            workers = tuple(self._worker_view(w) for w in self.workers.values())
            self._view = WorkloadView(workers, tuple(self.tasks[k] for k in self.unrunnable))
        return self._view

    def _worker_view(self, w: SimWorker) -> Worker:
        """The worker as dask reports it: its processing tasks (running and waiting) in the order of
        the scheduler's set of them (`set_order`), not running first nor in priority order."""
        if w.view is None:
            running = w.running
            listed = sorted((*running, *w.waiting), key=self._listed.__getitem__)
            w.view = Worker(
                address=w.address,
                name=w.name,
                hostname=w.hostname,
                resources=w.capacity,
                processing=tuple(
                    self._executing_view(k) if k in running else self._waiting_view(k) for k in listed
                ),
                has_unique_data=bool(w.held),
                retiring=w.cordoned,
            )
        return w.view

    def _executing_view(self, key: str) -> Task:
        view = self._executing.get(key)
        if view is None:
            task = self.tasks[key]  # built directly: dataclasses.replace is slow on this hot path
            view = self._executing[key] = Task(
                key, task.needs, task.pinned_type, True, self._expected(key), self.started_at[key]
            )
        return view

    def _waiting_view(self, key: str) -> Task:
        expected = self._expected(key)
        if expected is None:
            return self.tasks[key]
        view = self._waiting.get(key)
        if view is None:
            task = self.tasks[key]
            view = self._waiting[key] = Task(key, task.needs, task.pinned_type, False, expected)
        return view

    def _estimates_changed(self) -> None:
        """Drop the cached views of tasks whose prefix estimate changed, and of their workers."""
        old, new = self._view_estimates, self.estimates
        changed = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
        self._view_estimates = dict(new)
        jobs = self.jobs
        for cache in (self._executing, self._waiting):
            for key in [k for k in cache if jobs[k].kind in changed]:
                del cache[key]
        self._view = None
        for worker in self.workers.values():
            if worker.view is not None and any(
                jobs[k].kind in changed for k in itertools.chain(worker.running, worker.waiting)
            ):
                worker.view = None

    def _expected(self, key: str) -> float | None:
        return self._view_estimates.get(self.jobs[key].kind)

    def estimate(self, key: str) -> float | None:
        """The duration estimate of the prefix of task `key` (None: unknown)."""
        return self.estimates.get(self.jobs[key].kind)

    def duration(self, kind: Kind, now: float) -> float:
        """distributed's `_get_prefix_duration`: the average when known, else twice the longest run
        seen so far (running ones included), else the unknown-task default."""
        if self._estimate_known(kind, now):
            return self.estimates[kind]
        starts = self._starts.get(kind)
        longest = max(self._max_exec.get(kind, 0.0), now - starts[0][0] if starts else 0.0)
        return 2.0 * longest if longest > 0 else UNKNOWN_TASK_DURATION

    def durations(self, now: float) -> dict[Kind, float]:
        """Every prefix's duration at `now` (cached: a task starting at `now` changes none of them)."""
        if self._durations_at != now or self._durations is None:
            self._durations = {kind: self.duration(kind, now) for kind in self._needs}
            self._durations_at = now
        return self._durations

    def _changed(self, worker: SimWorker | None = None) -> None:
        self._view = None
        if worker is not None:
            worker.view = None

    # ------------------------------------------------------------------ stimuli

    def submit(self, key: str, now: float) -> None:
        self._decide(key, now)

    def cordon(self, address: str, on: bool, now: float) -> bool:
        """Cordon (on) or uncordon a worker; False when there is no such worker."""
        worker = self.workers.get(address)
        if worker is None:
            return False
        if worker.cordoned != on:
            worker.cordoned = on
            self._changed(worker)
            if not on:
                self._admit(worker, now)
        return True

    def add_worker(self, worker: SimWorker, now: float) -> None:
        self.workers[worker.address] = worker
        self._admit(worker, now)

    def _admit(self, worker: SimWorker, now: float) -> None:
        """A worker that can take tasks: it starts what waits on it, takes the unrunnable tasks it can
        run, and steals."""
        self._changed(worker)
        self._start_ready(worker, now)
        for key in [k for k in self.unrunnable if self.valid(k, worker)]:
            del self.unrunnable[key]
            self._changed()
            self._decide(key, now)
        self._poke(now)

    def remove_worker(self, address: str, now: float) -> int:
        """Drop a worker; its tasks are decided again. Returns how many tasks it held."""
        worker = self.workers.pop(address, None)
        if worker is None:
            return 0
        self._changed(worker)
        lost = [*worker.running, *worker.waiting]
        self.restarts += len(worker.running)
        self._durations = None  # a lost run may have been a prefix's longest
        for key in lost:
            del self.where[key]
            self.started_at.pop(key, None)
        durations = self.durations(now)
        for key in lost:
            self._decide(key, now, durations)
        self._poke(now)
        return len(lost)

    def finish(self, address: str, key: str, end: float) -> None:
        worker = self.workers.get(address)
        if worker is None or worker.running.get(key) != end:
            return  # stale: the worker left or the task was restarted elsewhere
        self._changed(worker)
        del worker.running[key]
        del self.where[key]
        worker.free = worker.free + self.tasks[key].needs
        self.completed_at[key] = end
        if self.hold:
            worker.held.add(key)
            if len(self.completed_at) == len(self.jobs):  # the client gathers everything, then releases
                for w in self.workers.values():
                    if w.held:
                        w.held.clear()
                        self._changed(w)
        kind, took = self.jobs[key].kind, self.jobs[key].duration_s
        worker.counts[kind] -= 1
        average = self.estimates.get(kind)
        self.estimates[kind] = took if average is None else 0.5 * took + 0.5 * average
        self._max_exec[kind] = max(self._max_exec.get(kind, 0.0), took)
        self._durations = None
        self._start_ready(worker, end)
        self._poke(end)

    def move_results(self, addresses: Sequence[str]) -> set[str]:
        """Before retiring `addresses`: move each one's results to the running (uncordoned) worker not
        being retired that holds the fewest (first by address on ties). Returns the addresses whose
        results had nowhere to go: dask keeps those workers."""
        leaving = set(addresses)
        recipients = sorted(
            (w for a, w in self.workers.items() if a not in leaving and not w.cordoned),
            key=lambda w: w.address,
        )
        kept = set()
        for address in addresses:
            worker = self.workers.get(address)
            if worker is None or not worker.held:
                continue
            if not recipients:
                kept.add(address)
                continue
            target = min(recipients, key=lambda w: len(w.held))
            target.held |= worker.held
            worker.held.clear()
            self._changed(worker)
            self._changed(target)
        return kept

    def balance(self, now: float) -> int:
        """The periodic stealing pass (a "balance" event); returns how many tasks moved."""
        from swarm_autoscaler_lab.sim.stealing import balance

        self._balance_due = None
        moved = balance(self, now)
        self.steals += moved
        return moved

    def move_waiting(self, now: float) -> int:
        """The preload's mover (a "mover" event, with `packing`): every task waiting on a worker that
        another uncordoned valid worker can start now moves there; returns how many moved."""
        self._mover_due = None
        idle = [t for t in self.workers.values() if not t.cordoned and not t.waiting]
        moved = 0
        waiting = sorted(
            (
                (self.jobs[key].index, key, victim)
                for victim in self.workers.values()
                for key in victim.waiting
            )
            if idle
            else ()
        )
        for _, key, victim in waiting:  # the one waiting longest first, as the preload does
            needs = self.tasks[key].needs
            thieves = [
                t
                for t in idle
                if t is not victim
                and len(t.running) < t.nthreads
                and needs.fits_in(t.free)
                and self.valid(key, t)
            ]
            if thieves:
                wanted = advertised(needs)
                thief = min(thieves, key=lambda t: (self._rank(wanted, t), t.address))
                self.move(key, victim, thief, now)
                moved += 1
        self.moves += moved
        return moved

    def move(self, key: str, victim: SimWorker, thief: SimWorker, now: float) -> None:
        """A confirmed steal: `key`, waiting on `victim`, now waits on (or starts on) `thief`."""
        self._changed(victim)
        victim.waiting.remove(key)
        victim.counts[self.jobs[key].kind] -= 1
        self._enqueue(thief, key)
        self._start_ready(thief, now)

    def _poke(self, now: float) -> None:
        """Something changed: make sure a stealing pass runs at the next tick of its period."""
        if self._balance_due is None and self.workers:
            self._balance_due = (math.floor(now / BALANCE_INTERVAL) + 1) * BALANCE_INTERVAL
            self.events.push(self._balance_due, "balance", None)
        if self.packing and self._mover_due is None and self.workers:
            self._mover_due = (math.floor(now / INTERVAL) + 1) * INTERVAL
            self.events.push(self._mover_due, "mover", None)

    # ------------------------------------------------------------------ internals

    def _decide(self, key: str, now: float, durations: Mapping[Kind, float] | None = None) -> None:
        """Send `key` to the valid, uncordoned worker of least occupancy per thread (the first on
        ties), or mark it unrunnable; with `packing`, `packing_rank` comes before the occupancy."""
        best: SimWorker | None = None
        best_score: tuple[Rank, float] = (CANNOT_START_NOW, 0.0)
        if durations is None:
            durations = self.durations(now) if self.workers else {}
        needs = advertised(self.tasks[key].needs) if self.packing else {}
        for worker in self.workers.values():
            if worker.cordoned or not self.valid(key, worker):
                continue
            rank = self._rank(needs, worker) if self.packing else CANNOT_START_NOW
            score = (rank, worker.occupancy(durations) / worker.nthreads)
            if best is None or score < best_score:
                best, best_score = worker, score
        if best is None:
            self.unrunnable[key] = None
            self._changed()
            return
        self._enqueue(best, key)
        self._start_ready(best, now)
        self._poke(now)

    def _rank(self, needs: Mapping[str, float], worker: SimWorker) -> Rank:
        """The plugin's `packing_rank` on this worker, as the real scheduler would compute it."""
        if worker.nprocessing >= worker.nthreads:
            return CANNOT_START_NOW  # what packing_rank says first; spares building the dicts
        used = worker.capacity - worker.free  # the running tasks' needs ...
        for waiting in worker.waiting:  # ... and the waiting ones': dask's `used_resources`
            used = used + self.tasks[waiting].needs
        return packing_rank(
            needs, advertised(worker.capacity), advertised(used), worker.nprocessing, worker.nthreads
        )

    def _enqueue(self, worker: SimWorker, key: str) -> None:
        """Queue `key` on `worker` in priority (submission) order."""
        self._changed(worker)
        index = self.jobs[key].index
        jobs, waiting = self.jobs, worker.waiting
        at = len(waiting)
        while at > 0 and jobs[waiting[at - 1]].index > index:
            at -= 1
        waiting.insert(at, key)
        kind = jobs[key].kind
        worker.counts[kind] = worker.counts.get(kind, 0) + 1
        self.where[key] = worker.address

    def _start_ready(self, worker: SimWorker, now: float) -> None:
        while worker.waiting and not worker.cordoned and len(worker.running) < worker.nthreads:
            key = worker.waiting[0]
            needs = self.tasks[key].needs
            if not needs.fits_in(worker.free):
                return
            self._changed(worker)
            worker.waiting.pop(0)
            worker.free = worker.free - needs
            end = now + self.jobs[key].duration_s
            worker.running[key] = end
            self.started_at[key] = now
            self._executing.pop(key, None)  # a restarted task: its view carries the new start
            heapq.heappush(self._starts.setdefault(self.jobs[key].kind, []), (now, key))
            self.events.push(end, "done", (worker.address, key, end))

    def _estimate_known(self, kind: Kind, now: float) -> bool:
        """Whether the prefix has a duration estimate; a task of it running past twice it makes it
        unknown."""
        average = self.estimates.get(kind)
        if average is None:
            return False
        starts = self._starts.get(kind, [])  # the oldest running task decides; ended runs are dropped
        while starts and (
            starts[0][1] not in self.where or self.started_at.get(starts[0][1]) != starts[0][0]
        ):
            heapq.heappop(starts)
        if starts and now - starts[0][0] > 2.0 * average:
            del self.estimates[kind]
            return False
        return True


def set_order(key: str, hash_seed: int) -> int:
    """Where `key` falls in the iteration order of a set of task keys, as a scheduler process whose
    string hashes are salted by `hash_seed` would list it: a pseudo-random, fixed rank per key."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, salt=(hash_seed % 2**64).to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little")


def advertised(resources: Resources) -> dict[str, float]:
    """`resources` as dask resources named by the project's convention (`CPU`, `RAM`, `GPU`, generic),
    as a worker advertises them (`config.worker.worker_resources`, here with no overhead)."""
    out = {"CPU": resources.cpus, "RAM": float(resources.ram)}
    if resources.gpus:
        out["GPU"] = float(resources.gpus)
    out.update(resources.generic)
    return out
