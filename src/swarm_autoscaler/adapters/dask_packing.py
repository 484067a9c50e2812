"""Steer dask's scheduler toward packing: an optional scheduler preload module.

Deploy it on the dask scheduler (not on the workers, not in the daemon), by module name when this
package is installed there, or by path when this one file is copied next to the scheduler:

    dask scheduler --preload swarm_autoscaler.adapters.dask_packing
    dask scheduler --preload /opt/dask/dask_packing.py

`dask_setup(scheduler)` replaces `worker_objective` on that scheduler instance (the class is untouched);
`dask_teardown` restores it. The file imports nothing but the standard library at run time (so that the
simulator can share `packing_rank`), and uses only attributes of distributed's `TaskState` and
`WorkerState` (tested against distributed 2026.8).

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

Unchanged: tasks without resource restrictions and actors (dask's objective), root-ish tasks (never
restricted; dask's queue), work stealing (`WorkStealing.stealing_objective` is separate: it may still move
a waiting task to an idle worker), and a task with a single candidate (dask calls no objective).

Resource names follow the project's convention (`swarm_autoscaler.adapters.dask`): workers advertise
`CPU`, `RAM` (bytes) and `GPU`; a machine "has a GPU" when its `GPU` resource is positive. The names are
the module constants `CPU` and `GPU`; edit them in a copied file if your workers use others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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


def install(scheduler: Scheduler) -> None:
    """Replace `worker_objective` on this scheduler instance (idempotent)."""
    if hasattr(scheduler, _ORIGINAL):
        return
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


def dask_setup(scheduler: Scheduler) -> None:
    """distributed's preload hook: runs when the scheduler starts."""
    install(scheduler)


def dask_teardown(scheduler: Scheduler) -> None:
    """distributed's preload hook: runs when the scheduler closes."""
    uninstall(scheduler)
