"""Steer dask's scheduler toward packing: an optional scheduler preload module.

Deploy it on the dask scheduler (not on the workers, not in the daemon), by module name when this
package is installed there, or by path when this one file is copied next to the scheduler:

    dask scheduler --preload swarm_autoscaler.adapters.dask_packing
    dask scheduler --preload /opt/dask/dask_packing.py

`dask_setup(scheduler)` replaces `worker_objective` on that scheduler instance (the class is untouched),
adds the plugin that moves waiting restricted tasks to workers that can start them (`QueuedMover`), and
wraps the steal-response handler so that a stolen task's resources move with it; `dask_teardown` undoes
all three. The file imports nothing but the standard library at module level (so that the simulator can
share `packing_rank`; distributed and tornado are imported inside `dask_setup`, on the scheduler), and
uses only attributes of distributed's `Scheduler`, `TaskState`, `WorkerState` and `WorkStealing` (tested
against distributed 2026.8).

What dask does without it: `decide_worker_non_rootish` sends a task with resource restrictions to the
valid running worker of least `occupancy / nthreads` (plus the cost of moving its dependencies), so
small tasks spread over every machine, big and GPU machines included, and no machine ever empties.

What it does instead, for a task with resource restrictions (and not an actor), among the candidate
workers dask passes to the objective (valid, running, and holding the task's dependencies when any do):

1. Workers that can start it *now* come first: every resource it requests fits in what the worker
   advertises less `used_resources` (which counts every task processing there, running or waiting), and
   the worker has fewer processing tasks than threads (so nothing waits on it).
2. Among those: a worker without a GPU before one with a GPU, unless the task needs a GPU; then the
   smallest worker (its `CPU` resource, else its threads); then the fullest (the largest fraction of
   its CPUs in use). Small tasks thus fill one small machine after another, and big and GPU machines
   are left free to empty, where the autoscaler can retire them.
3. Ties, and a task that no worker can start now, are decided by dask's own objective, unchanged: such a
   task queues on the worker where dask expects it to start soonest.

Once placed, a restricted task that waits (for a thread, or for a resource such as the worker's one GPU)
stays there in dask: its stealing takes only from a worker with more processing tasks than threads, so
three GPU tasks on a four-thread, one-GPU worker never move to a GPU worker that joins. Every `INTERVAL`
seconds `QueuedMover` asks, through dask's stealing protocol, for such a task (the longest waiting first) to move to a running worker
that can start it now (the best by `packing_rank`); the holding worker refuses if it has started it, so
no task runs twice and none is lost. It needs dask's work stealing on (the default).

Unchanged: tasks without resource restrictions and actors (dask's objective, dask's stealing; the mover
never asks for them), root-ish tasks (never restricted; dask's queue), dask's own work stealing, and a
task with a single candidate (dask calls no objective).

Resource names follow the project's convention (`swarm_autoscaler.adapters.dask`): workers advertise
`CPU`, `RAM` (bytes) and `GPU`; a machine "has a GPU" when its `GPU` resource is positive. The names are
the module constants `CPU` and `GPU`; edit them in a copied file if your workers use others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - types only; nothing from distributed is imported at run time
    from distributed import Scheduler
    from distributed.scheduler import TaskState, WorkerState

CPU = "CPU"
GPU = "GPU"
_SLACK = 1e-9  # float sums of fractional requests
_ORIGINAL = "_packing_original_objective"  # where dask_setup keeps the objective it replaced

Rank = tuple[int, int, float, float]
CANNOT_START_NOW: Rank = (1, 0, 0.0, 0.0)

logger = logging.getLogger("distributed.dask_packing")  # shown with distributed's own logs


def packing_rank(
    needs: Mapping[str, float],
    resources: Mapping[str, float],
    used: Mapping[str, float],
    nprocessing: int,
    nthreads: int,
) -> Rank:
    """The packing part of the objective (lower is better) for a task requesting `needs` on a worker
    advertising `resources`, with `used` of them taken by its `nprocessing` processing tasks.

    (0, gpu, size, -fullness) when the task can start there now, else `CANNOT_START_NOW`, which ranks
    after every worker that can and ties with every worker that cannot (dask's objective decides)."""
    if nprocessing >= nthreads:
        return CANNOT_START_NOW
    for name, amount in needs.items():
        if used.get(name, 0.0) + amount > resources.get(name, 0.0) + _SLACK:
            return CANNOT_START_NOW
    gpu = 1 if resources.get(GPU, 0.0) > 0 and needs.get(GPU, 0.0) <= 0 else 0
    cpus = resources.get(CPU, 0.0)
    if cpus > 0:
        return (0, gpu, cpus, -used.get(CPU, 0.0) / cpus)
    return (0, gpu, float(nthreads), -nprocessing / nthreads)


def packing_objective(
    original: Callable[[TaskState, WorkerState], tuple[Any, ...]],
) -> Callable[[TaskState, WorkerState], tuple[Any, ...]]:
    """`worker_objective` with `packing_rank` in front of `original` (dask's own objective) for tasks
    with resource restrictions; `original` alone for the others and for actors. The keys dask compares
    are those of one task over several workers, so they always have the same shape."""

    def worker_objective(ts: TaskState, ws: WorkerState) -> tuple[Any, ...]:
        base = original(ts, ws)
        needs = ts.resource_restrictions
        if ts.actor or not needs:
            return base
        rank = packing_rank(needs, ws.resources, ws.used_resources, len(ws.processing), ws.nthreads)
        return (*rank, *base)

    return worker_objective


def waiting_tail(ws: WorkerState, running: Collection[TaskState] = ()) -> list[TaskState]:
    """The restricted tasks processing on `ws` that cannot be running there, in dask's order (the one
    that would start first comes first).

    The scheduler does not know which of a worker's processing tasks run: `running` are those known to
    (reported executing by the worker, or a move the worker refused because it had started); the others
    are taken in dask's order (priority), each running if a thread and every resource it requests are
    still free. A task so guessed to run that in fact waits is found at the next round, once the worker
    has refused to move the one it runs."""
    threads = ws.nthreads
    free = dict(ws.resources)
    tail: list[TaskState] = []

    def take(ts: TaskState) -> None:
        nonlocal threads
        if ts not in ws.long_running:  # a task that seceded holds no thread
            threads -= 1
        for name, amount in (ts.resource_restrictions or {}).items():
            free[name] = free.get(name, 0.0) - amount

    known = {ts: None for ts in running if ts in ws.processing}  # ordered, without repeats
    for ts in known:
        take(ts)
    rest = sorted((t for t in ws.processing if t not in known), key=_priority)
    for ts in rest:
        needs = ts.resource_restrictions or {}
        if threads > 0 and all(free.get(n, 0.0) + _SLACK >= a for n, a in needs.items()):
            take(ts)
        elif needs and not ts.actor:
            tail.append(ts)
    return tail


def _priority(ts: TaskState) -> tuple[Any, ...]:
    return tuple(ts.priority or ())


class QueuedMover:
    """Moves restricted tasks waiting on a worker (for a thread or a resource) to a running worker that
    can start them now, through dask's work stealing protocol: the scheduler asks the worker holding the
    task to give it up, and the worker refuses if it has started it, so no task runs twice or is lost.

    dask's own stealing does not do this: it steals only from a worker with more processing tasks than
    threads (three GPU tasks on a four-thread, one-GPU worker are not "saturated"), only to an idle
    worker, and only when the occupancy balance pays. `round` is called periodically by the plugin."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.asked: dict[TaskState, WorkerState] = {}  # moves requested, by the victim asked
        self.running: dict[TaskState, WorkerState] = {}  # refused moves: the task runs there
        self.moved = 0  # moves requested so far

    def tick(self) -> None:
        """The periodic callback."""
        self.round()

    def round(self) -> int:
        """One pass: returns how many moves it requested."""
        s = self.scheduler
        stealing = s.extensions.get("stealing")
        if stealing is None:
            return 0
        self._learn(stealing.in_flight)
        thieves = self._thieves(stealing.in_flight)
        if not thieves:
            return 0
        asked = 0
        for victim, ts in self._waiting():
            if ts in stealing.in_flight or ts.processing_on is not victim:
                continue
            thief = self._best(ts, victim, thieves)
            if thief is None:
                continue
            if stealing.move_task_request(ts, victim, thief) in ("in-flight", "comm-closed"):
                continue
            self.asked[ts] = victim
            used, n = thieves[thief]
            for name, amount in (ts.resource_restrictions or {}).items():
                used[name] = used.get(name, 0.0) + amount
            thieves[thief] = (used, n + 1)
            asked += 1
        if asked:
            self.moved += asked
            logger.info("dask_packing: asked for %d waiting restricted task(s) to move", asked)
        return asked

    def _waiting(self) -> list[tuple[WorkerState, TaskState]]:
        """Every worker's `waiting_tail`, all in dask's order: the task waiting longest (the first
        submitted, at equal priority) moves first, so that no job waits behind the ones after it."""
        executing: dict[WorkerState, list[TaskState]] = {}
        for ts, ws in self.running.items():
            executing.setdefault(ws, []).append(ts)
        waiting = []
        for victim in self.scheduler.workers.values():
            if any(ts.resource_restrictions for ts in victim.processing):
                known = [*executing.get(victim, ()), *victim.executing]
                waiting += [(victim, ts) for ts in waiting_tail(victim, known)]
        return sorted(waiting, key=lambda vt: _priority(vt[1]))

    def _learn(self, in_flight: Mapping[TaskState, Any]) -> None:
        for ts, victim in list(self.asked.items()):
            if ts in in_flight:
                continue  # no answer yet
            del self.asked[ts]
            if ts.processing_on is victim:  # still there: the worker refused, it had started it
                self.running[ts] = victim
        for ts, ws in list(self.running.items()):
            if ts.processing_on is not ws:
                del self.running[ts]

    def _thieves(self, in_flight: Mapping[TaskState, Any]) -> dict[WorkerState, tuple[dict[str, float], int]]:
        """Running workers with a free thread: what they have in use, counting moves on their way."""
        coming: dict[WorkerState, list[TaskState]] = {}
        for ts, info in in_flight.items():
            coming.setdefault(info["thief"], []).append(ts)
        thieves = {}
        for ws in self.scheduler.running:
            n = len(ws.processing) - len(ws.long_running) + len(coming.get(ws, ()))
            if n >= ws.nthreads:
                continue
            used = dict(ws.used_resources)
            for ts in coming.get(ws, ()):
                for name, amount in (ts.resource_restrictions or {}).items():
                    used[name] = used.get(name, 0.0) + amount
            thieves[ws] = (used, n)
        return thieves

    def _best(
        self,
        ts: TaskState,
        victim: WorkerState,
        thieves: Mapping[WorkerState, tuple[dict[str, float], int]],
    ) -> WorkerState | None:
        """The worker that can start `ts` now ranked first by `packing_rank`, if any."""
        needs = ts.resource_restrictions or {}
        valid = self.scheduler.valid_workers(ts)
        best: tuple[Rank, str] | None = None
        chosen = None
        for ws, (used, n) in thieves.items():
            if ws is victim or (valid is not None and ws not in valid):
                continue
            rank = packing_rank(needs, ws.resources, used, n, ws.nthreads)
            if rank != CANNOT_START_NOW and (best is None or (rank, ws.address) < best):
                best, chosen = (rank, ws.address), ws
        return chosen


_STEAL_RESPONSE = "steal-response"
_ORIGINAL_CONFIRM = "_packing_original_steal_response"
_CONFIRMED = frozenset({"ready", "constrained", "waiting"})  # the worker's states that give a task up


def _fix_steal_bookkeeping(scheduler: Scheduler) -> None:
    """Make a confirmed steal move the task's resources too: distributed 2026.8's `move_task_confirm`
    moves the task from the victim's `processing` to the thief's but leaves `used_resources` as they
    were, so the victim keeps counting the task after it left (and the thief goes below zero when it
    finishes). dask decides nothing on `used_resources`; the packing objective and `QueuedMover` do."""
    stealing = scheduler.extensions.get("stealing")
    handler = scheduler.stream_handlers.get(_STEAL_RESPONSE)
    if stealing is None or handler is None or hasattr(scheduler, _ORIGINAL_CONFIRM):
        return
    setattr(scheduler, _ORIGINAL_CONFIRM, handler)

    def steal_response(*, key: str, state: str, stimulus_id: str, worker: str | None = None) -> None:
        ts = scheduler.tasks.get(key)
        info = stealing.in_flight.get(ts) if ts is not None else None
        thief: WorkerState | None = info["thief"] if info else None
        confirms = (
            info is not None
            and thief is not None
            and info["stimulus_id"] == stimulus_id
            and state in _CONFIRMED
            and thief is scheduler.workers.get(thief.address)
        )
        victim = ts.processing_on if ts is not None else None
        handler(key=key, state=state, stimulus_id=stimulus_id, worker=worker)
        moved = confirms and ts is not None and victim is not None and ts.processing_on is thief
        if moved and ts is not None and victim is not None and thief is not None:
            scheduler.release_resources(ts, victim)
            scheduler.acquire_resources(ts, thief)

    scheduler.stream_handlers[_STEAL_RESPONSE] = steal_response


_PLUGIN = "dask-packing-queued"
INTERVAL = 0.5  # seconds between rounds of `QueuedMover`


def _add_plugin(scheduler: Scheduler) -> None:
    from distributed.diagnostics.plugin import SchedulerPlugin  # only on the scheduler, at setup
    from tornado.ioloop import PeriodicCallback

    class MoveQueued(SchedulerPlugin):
        """Runs `QueuedMover.round` every `INTERVAL` seconds while the scheduler runs."""

        name = _PLUGIN

        def __init__(self) -> None:
            self.mover = QueuedMover(scheduler)

        async def start(self, scheduler: Scheduler) -> None:
            if _PLUGIN not in scheduler.periodic_callbacks:
                pc = PeriodicCallback(self.mover.tick, INTERVAL * 1000)
                scheduler.periodic_callbacks[_PLUGIN] = pc
                pc.start()
            if scheduler.extensions.get("stealing") is None:
                logger.warning(
                    "dask_packing: work stealing is off, so waiting restricted tasks cannot move to "
                    "new workers (distributed.scheduler.work-stealing)"
                )

    scheduler.add_plugin(MoveQueued(), name=_PLUGIN)


def install(scheduler: Scheduler) -> None:
    """Replace `worker_objective` on this scheduler instance (idempotent), and add the plugin that moves
    waiting restricted tasks to workers that can start them now (`QueuedMover`)."""
    if hasattr(scheduler, _ORIGINAL):
        return
    _add_plugin(scheduler)
    _fix_steal_bookkeeping(scheduler)
    original = scheduler.worker_objective
    setattr(scheduler, _ORIGINAL, original)
    # An instance attribute shadows the method: `partial(self.worker_objective, ts)` finds it.
    scheduler.worker_objective = packing_objective(original)  # type: ignore[method-assign,assignment]
    logger.info("dask_packing: restricted tasks go to the fullest smallest worker that can start them")


def uninstall(scheduler: Scheduler) -> None:
    """Give the scheduler its own objective back."""
    if hasattr(scheduler, _ORIGINAL):
        del scheduler.worker_objective
        delattr(scheduler, _ORIGINAL)
        if _PLUGIN in scheduler.plugins:
            scheduler.remove_plugin(name=_PLUGIN)
        pc = scheduler.periodic_callbacks.pop(_PLUGIN, None)
        if pc is not None:
            pc.stop()
    if hasattr(scheduler, _ORIGINAL_CONFIRM):
        scheduler.stream_handlers[_STEAL_RESPONSE] = getattr(scheduler, _ORIGINAL_CONFIRM)
        delattr(scheduler, _ORIGINAL_CONFIRM)


def dask_setup(scheduler: Scheduler) -> None:
    """distributed's preload hook: runs when the scheduler starts."""
    install(scheduler)


def dask_teardown(scheduler: Scheduler) -> None:
    """distributed's preload hook: runs when the scheduler closes."""
    uninstall(scheduler)
