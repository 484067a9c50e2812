"""What waits for capacity: unrunnable and queued tasks plus each worker's estimated queue, grouped by
shape. Pure; used by `plan()`.

Tasks with the same needs and pinned type form one `Group` that is *counted*, never iterated. A task
queued behind a busy worker that dask's estimates say starts there within `Policy.tolerated_wait` is
grouped apart (`Group.soon`, see starts.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.model import Policy, Resources, Snapshot, Task, Worker
from swarm_autoscaler.core.starts import starting_soon
from swarm_autoscaler.core.vectors import EPS, Space, Vec, fits, minus


@dataclass(frozen=True, slots=True)
class Group:
    """Pending tasks with identical needs and pinned type. `nz` lists the (dimension, amount) pairs of
    `vec` that are not zero: the only ones that limit how many fit. `soon` tasks wait on a busy worker
    that is expected to start them within `Policy.tolerated_wait` (see starts.py): they may take free
    room on active and cordoned workers, but activate and launch nothing."""

    needs: Resources
    pinned: str | None
    vec: Vec
    keys: tuple[str, ...]
    nz: tuple[tuple[int, float], ...]
    soon: bool = False

    @staticmethod
    def of(
        needs: Resources, pinned: str | None, vec: Vec, keys: tuple[str, ...], soon: bool = False
    ) -> Group:
        return Group(needs, pinned, vec, keys, tuple((d, a) for d, a in enumerate(vec) if a > 0.0), soon)


@dataclass(frozen=True, slots=True)
class Demand:
    """What waits for capacity. `groups` are sorted largest first (the order tasks are placed in);
    `free` is each worker's capacity left after the tasks it runs; `queued` how many of its
    processing tasks do not fit at once and so count as pending."""

    groups: tuple[Group, ...]
    pending: int
    free: Mapping[str, Vec]
    queued: Mapping[str, int]


def estimate_demand(snapshot: Snapshot, policy: Policy) -> tuple[Space, Demand]:
    """Unrunnable and scheduler-queued tasks plus the estimated queue of every worker, grouped by shape.

    A worker's queue: its processing tasks fitted into its resources, those it reports executing first,
    then the others in the order listed; the ones that do not fit are waiting on it, so they count as
    pending. Executing tasks come first because dask lists a worker's processing tasks in the order of a
    set (by salted hash of their names), not running first: fitted in that order, a waiting 8-CPU task
    listed ahead of four running 1-CPU tasks made those look queued, and the daemon launched machines
    for work already running (measured live, `bench packing`). Such a waiting task can never fit back
    onto its own worker: it did not fit when its turn came and the worker's free capacity only shrank
    after that.
    """
    shapes: dict[ShapeKey, Task] = {}
    keys: dict[ShapeKey, list[str]] = {}
    _collect(snapshot.unrunnable, shapes, keys)
    _collect(snapshot.queued, shapes, keys)
    loads = [_load(w.processing) for w in snapshot.workers]
    space = Space.over(_all_resources(snapshot, policy, shapes.values(), loads))
    free: dict[str, Vec] = {}
    queued: dict[str, int] = {}
    for worker, load in zip(snapshot.workers, loads, strict=True):
        left, waiting = _worker_load(worker, load, space)
        free[worker.address] = left
        if waiting:
            queued[worker.address] = len(waiting)
            soon = starting_soon(worker, waiting, snapshot.now, policy.tolerated_wait)
            _collect(waiting[:soon], shapes, keys, soon=True)
            _collect(waiting[soon:], shapes, keys)
    groups = [
        Group.of(t.needs, t.pinned_type, space.vec(t.needs), tuple(keys[k]), k[5]) for k, t in shapes.items()
    ]
    groups.sort(key=lambda g: (tuple(-x for x in g.vec), g.pinned or "", g.soon))
    total = len(snapshot.unrunnable) + len(snapshot.queued) + sum(queued.values())
    return space, Demand(tuple(groups), total, free, queued)


# Tasks are grouped by the plain values of their needs and pin: hashing a tuple of builtins is much
# cheaper than hashing the Resources dataclass, and this runs once per task.
ShapeKey = tuple[float, int, int, tuple[tuple[str, float], ...], str | None, bool]


def _collect(
    tasks: Iterable[Task], shapes: dict[ShapeKey, Task], keys: dict[ShapeKey, list[str]], soon: bool = False
) -> None:
    for task in tasks:
        n = task.needs
        shape = (n.cpus, n.ram, n.gpus, n.generic, task.pinned_type, soon)
        same = keys.get(shape)
        if same is None:
            shapes[shape] = task
            keys[shape] = [task.key]
        else:
            same.append(task.key)


@dataclass(frozen=True, slots=True)
class _Load:
    """The summed cpus/ram/gpus of a worker's processing tasks, the smallest amount of each any one of
    them needs, and the needs of those tasks that ask for generic resources (None when none do)."""

    cpus: float
    ram: float
    gpus: float
    smallest: tuple[float, float, float]
    generic: tuple[Resources, ...] | None


def _load(tasks: Sequence[Task]) -> _Load:
    cpus = ram = gpus = 0.0
    min_c = min_r = min_g = float("inf")
    generic: list[Resources] | None = None
    for task in tasks:
        n = task.needs
        cpus += n.cpus
        ram += n.ram
        gpus += n.gpus
        if n.cpus < min_c:  # noqa: PLR1730 - min() costs a call per task here
            min_c = n.cpus
        if n.ram < min_r:  # noqa: PLR1730 - min() costs a call per task here
            min_r = n.ram
        if n.gpus < min_g:  # noqa: PLR1730 - min() costs a call per task here
            min_g = n.gpus
        if n.generic:
            generic = [*(generic or ()), n]
    return _Load(cpus, ram, gpus, (min_c, min_r, min_g), tuple(generic) if generic is not None else None)


def _all_resources(
    snapshot: Snapshot, policy: Policy, tasks: Iterable[Task], loads: Sequence[_Load]
) -> Iterable[Resources]:
    yield from (t.needs for t in tasks)
    for load in loads:
        yield from load.generic or ()
    yield from (w.resources for w in snapshot.workers)
    yield from (t.resources for t in snapshot.instance_types)
    yield from (tp.overhead for tp in policy.allowed_types)


def _worker_load(worker: Worker, load: _Load, space: Space) -> tuple[Vec, list[Task]]:
    """(free capacity, processing tasks that do not fit at once), fitting the executing tasks first,
    then the others in the order listed."""
    capacity = space.vec(worker.resources)
    if load.generic is None and len(capacity) == 3:  # the common case, on plain floats
        cpus, ram, gpus = capacity
        if load.cpus <= cpus + EPS and load.ram <= ram + EPS and load.gpus <= gpus + EPS:
            return (max(0.0, cpus - load.cpus), max(0.0, ram - load.ram), max(0.0, gpus - load.gpus)), []
        return _greedy3(executing_first(worker.processing), (cpus, ram, gpus), load.smallest)
    free, waiting = capacity, []
    for task in executing_first(worker.processing):
        need = space.vec(task.needs)
        if fits(need, free):
            free = minus(free, need)
        else:
            waiting.append(task)
    return free, waiting


def executing_first(tasks: Sequence[Task]) -> list[Task]:
    """`tasks` with those reported executing first, each part in its listed order."""
    return sorted(tasks, key=lambda t: not t.executing)


def _greedy3(
    tasks: Sequence[Task], free: tuple[float, float, float], smallest: tuple[float, float, float]
) -> tuple[Vec, list[Task]]:
    """Fit `tasks` in order into `free` (cpus, ram, gpus); the ones that do not fit wait. Once even the
    smallest amount any task needs of some resource no longer fits, nothing later can: stop there."""
    cpus, ram, gpus = free
    min_c, min_r, min_g = smallest
    waiting: list[Task] = []
    for i, task in enumerate(tasks):
        n = task.needs
        c, r, g = n.cpus, n.ram, n.gpus
        if c <= cpus + EPS and r <= ram + EPS and g <= gpus + EPS:
            cpus, ram, gpus = cpus - c, ram - r, gpus - g
            continue
        waiting.append(task)
        if min_c > cpus + EPS or min_r > ram + EPS or min_g > gpus + EPS:
            waiting.extend(tasks[i + 1 :])
            break
    return (max(0.0, cpus), max(0.0, ram), max(0.0, gpus)), waiting
