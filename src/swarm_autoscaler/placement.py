"""Fitting and virtual assignment of pending tasks to capacity. Pure; used by `plan()`.

Speed matters (tens of thousands of tasks, a thousand nodes, dozens of types every tick), so:

- resources become plain float vectors (`Vec`: cpus, ram, gpus, then one slot per generic resource name
  seen in the snapshot), interned once per distinct `Resources` value;
- tasks with the same needs and pinned type form one `Group` that is *counted*, never iterated;
- bins (capacity of one worker or machine) with the same type and free vector form one class that is
  filled at once (how many of a group fit in one bin is a division, not a loop);
- new instances are packed first-fit decreasing, and a fill pattern that repeats is applied k times in
  one step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .model import Policy, Resources, Snapshot, Task, Unplaceable, Worker
from .starts import starting_soon

Vec = tuple[float, ...]
EPS = 1e-9
UNBOUNDED = 1 << 62  # how many zero-need tasks fit in a bin


# ------------------------------------------------------------------------------------------ vectors


class Space:
    """Turns `Resources` into `Vec`s over a fixed set of generic resource names."""

    def __init__(self, generic_names: Iterable[str]) -> None:
        self.names = tuple(sorted(set(generic_names)))
        self._slot = {name: 3 + i for i, name in enumerate(self.names)}
        self.zero: Vec = (0.0,) * (3 + len(self.names))
        self._cache: dict[tuple[float, int, int, tuple[tuple[str, float], ...]], Vec] = {}

    @staticmethod
    def over(resources: Iterable[Resources]) -> Space:
        return Space(name for r in resources for name, _ in r.generic)

    def vec(self, res: Resources) -> Vec:
        key = (res.cpus, res.ram, res.gpus, res.generic)  # cheaper to hash than the dataclass
        v = self._cache.get(key)
        if v is None:
            out = [float(res.cpus), float(res.ram), float(res.gpus), *self.zero[3:]]
            for name, amount in res.generic:
                out[self._slot[name]] = float(amount)
            v = self._cache[key] = tuple(out)
        return v


def fits(need: Vec, free: Vec) -> bool:
    return all(a <= b + EPS for a, b in zip(need, free, strict=True))


def fit_count(need: Vec, free: Vec) -> int:
    """How many copies of `need` fit in `free` at once."""
    best = UNBOUNDED
    for a, b in zip(need, free, strict=True):
        if a > 0.0:
            k = int((b + EPS) / a)
            if k < best:
                if k <= 0:
                    return 0
                best = k
    return best


def fit_count_nz(nz: Sequence[tuple[int, float]], free: Vec) -> int:
    """`fit_count` for a need given as its non-zero (dimension, amount) pairs."""
    best = UNBOUNDED
    for d, a in nz:
        k = int((free[d] + EPS) / a)
        if k < best:
            if k <= 0:
                return 0
            best = k
    return best


def minus(free: Vec, need: Vec, k: int = 1) -> Vec:
    return tuple(max(0.0, b - a * k) for a, b in zip(need, free, strict=True))


def plus(total: Vec, need: Vec, k: int = 1) -> Vec:
    return tuple(b + a * k for a, b in zip(need, total, strict=True))


# ------------------------------------------------------------------------------------------ demand


@dataclass(frozen=True, slots=True)
class Group:
    """Pending tasks with identical needs and pinned type. `nz` lists the (dimension, amount) pairs of
    `vec` that are not zero: the only ones that limit how many fit. `soon` tasks wait on a busy worker
    that is expected to start them within `Policy.tolerated_wait` (see starts.py): they may take free
    room on active workers, but activate and launch nothing."""

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

    A worker's queue: its processing tasks fitted in order into its resources; the ones that do not fit
    are waiting on it (the scheduler cannot tell them apart from running ones), so they count as
    pending. Such a task can never fit back onto its own worker: it did not fit when its turn came and
    the worker's free capacity only shrank after that.
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
            waits = {id(t) for t in waiting}
            running = [t for t in worker.processing if id(t) not in waits]
            soon = starting_soon(worker.resources, running, waiting, snapshot.now, policy.tolerated_wait)
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
    """(free capacity, processing tasks that do not fit at once), fitting tasks in order."""
    capacity = space.vec(worker.resources)
    if load.generic is None and len(capacity) == 3:  # the common case, on plain floats
        cpus, ram, gpus = capacity
        if load.cpus <= cpus + EPS and load.ram <= ram + EPS and load.gpus <= gpus + EPS:
            return (max(0.0, cpus - load.cpus), max(0.0, ram - load.ram), max(0.0, gpus - load.gpus)), []
        return _greedy3(worker.processing, (cpus, ram, gpus), load.smallest)
    free, waiting = capacity, []
    for task in worker.processing:
        need = space.vec(task.needs)
        if fits(need, free):
            free = minus(free, need)
        else:
            waiting.append(task)
    return free, waiting


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


# ------------------------------------------------------------------------------------------ types


@dataclass(frozen=True, slots=True)
class TypeOption:
    """An allowed instance type: capacity for tasks (its resources minus the policy's overhead)."""

    name: str
    capacity: Vec
    price: float | None
    available: bool


def rank_types(snapshot: Snapshot, policy: Policy, space: Space) -> tuple[TypeOption, ...]:
    """Allowed types found in the catalogue, cheapest first (unknown prices last; ties: smallest
    resources, then the order of `allowed_types`). `available` is False while EC2 refuses the type."""
    catalogue = {t.name: t for t in snapshot.instance_types}
    refused = {u.type_name for u in snapshot.unavailable if u.until > snapshot.now}
    ranked = []
    for index, tp in enumerate(policy.allowed_types):
        itype = catalogue.get(tp.name)
        if itype is None:
            continue
        price = tp.price_per_hour if tp.price_per_hour is not None else itype.price_per_hour
        raw = space.vec(itype.resources)
        option = TypeOption(tp.name, minus(raw, space.vec(tp.overhead)), price, tp.name not in refused)
        ranked.append(((price is None, price or 0.0, raw, index), option))
    ranked.sort(key=lambda pair: pair[0])
    return tuple(option for _, option in ranked)


def type_capacity(snapshot: Snapshot, options: Sequence[TypeOption], space: Space) -> dict[str, Vec]:
    """Capacity of a machine of each catalogue type (types no longer allowed: no overhead known)."""
    out = {t.name: space.vec(t.resources) for t in snapshot.instance_types}
    out.update((o.name, o.capacity) for o in options)
    return out


def unplaceable_reason(group: Group, options: Sequence[TypeOption], policy: Policy) -> str | None:
    """Why no allowed type can ever run this group's tasks, or None when one can."""
    if group.pinned is not None:
        if policy.type_policy(group.pinned) is None:
            return f"pinned to {group.pinned}, which is not an allowed instance type"
        option = next((o for o in options if o.name == group.pinned), None)
        if option is None:
            return f"pinned to {group.pinned}, which is not in the instance type catalogue"
        if not fits(group.vec, option.capacity):
            return f"needs {group.needs}, more than {group.pinned} offers after its overhead"
        return None
    if not any(fits(group.vec, o.capacity) for o in options):
        return f"needs {group.needs}, more than any allowed instance type offers after its overhead"
    return None


# ------------------------------------------------------------------------------------------ assignment


@dataclass(frozen=True, slots=True)
class NewBins:
    """`count` new instances of `type_name`, each receiving `tasks_each` pending tasks: `pattern` says
    how many of which group (by index into the pool's groups)."""

    type_name: str
    count: int
    tasks_each: int
    pattern: tuple[tuple[int, int], ...] = ()


class Pool:
    """The pending groups and how many tasks of each are still unplaced."""

    def __init__(self, groups: Sequence[Group], ledger: list[tuple[str, int, int]] | None = None) -> None:
        self.groups = groups
        self.remaining = [len(g.keys) for g in groups]
        self.left = sum(self.remaining)
        # When given, every placement onto an existing bin is recorded as (bin key, group index, count):
        # tests check that each bin's placements fit it.
        self.ledger = ledger

    def drop_unplaceable(self, options: Sequence[TypeOption], policy: Policy) -> tuple[Unplaceable, ...]:
        out: list[Unplaceable] = []
        for i, group in enumerate(self.groups):
            reason = unplaceable_reason(group, options, policy)
            if reason is not None:
                out.extend(Unplaceable(key, reason) for key in group.keys)
                self.left -= self.remaining[i]
                self.remaining[i] = 0
        return tuple(sorted(out, key=lambda u: u.task_key))

    def hold_soon(self) -> int:
        """Take the `soon` tasks still unplaced out of the pool (they wait for their own worker);
        returns how many."""
        held = 0
        for i, group in enumerate(self.groups):
            if group.soon and self.remaining[i]:
                held += self.remaining[i]
                self.left -= self.remaining[i]
                self.remaining[i] = 0
        return held

    def fill(self, bins: Iterable[tuple[str, str, Vec]]) -> dict[str, int]:
        """Place pending tasks into existing bins (key, type name, free capacity), first-fit decreasing
        per bin; returns how many tasks each bin key received (only keys that received some)."""
        classes: dict[tuple[Vec, str], list[str]] = {}
        for key, type_name, free in bins:
            classes.setdefault((free, type_name), []).append(key)
        received: dict[str, int] = {}
        live = [g.vec for g, n in zip(self.groups, self.remaining, strict=True) if n]
        if not live:
            return received
        floor = tuple(map(min, *live)) if len(live) > 1 else live[0]
        eligible: dict[str, list[int]] = {}
        for (free, type_name), keys in sorted(classes.items()):  # fullest bins first: keeps others idle
            if not self.left:
                break
            if not fits(floor, free):  # not even the smallest need of every kind fits
                continue
            if type_name not in eligible:
                eligible[type_name] = self._eligible(type_name)
            self._fill_class(free, keys, eligible[type_name], received)
        return received

    def _eligible(self, type_name: str) -> list[int]:
        return [i for i, g in enumerate(self.groups) if self.remaining[i] and g.pinned in (None, type_name)]

    def _fill_class(self, free: Vec, keys: list[str], eligible: list[int], received: dict[str, int]) -> None:
        """Fill identical bins; when a group runs out part-way, the bins split into sub-classes."""
        groups, remaining = self.groups, self.remaining
        work = [(free, keys, 0)]
        while work and self.left:
            free, keys, start = work.pop()
            cpus, ram = free[0] + EPS, free[1] + EPS
            for pos in range(start, len(eligible)):
                gi = eligible[pos]
                count = remaining[gi]
                if not count:
                    continue
                group = groups[gi]
                if group.vec[0] > cpus or group.vec[1] > ram:  # cheap early miss, the common case
                    continue
                per_bin = fit_count_nz(group.nz, free)
                if not per_bin:
                    continue
                if count >= per_bin * len(keys):
                    self._use(gi, keys, per_bin, received)
                    free = minus(free, group.vec, per_bin)
                    cpus, ram = free[0] + EPS, free[1] + EPS
                    continue
                full, rest = divmod(count, per_bin)
                self._use(gi, keys[:full], per_bin, received)
                if full:
                    work.append((minus(free, group.vec, per_bin), keys[:full], pos + 1))
                if rest:
                    self._use(gi, keys[full : full + 1], rest, received)
                    work.append((minus(free, group.vec, rest), keys[full : full + 1], pos + 1))
                keys = keys[full + (1 if rest else 0) :]
                if not keys:
                    break

    def _use(self, gi: int, keys: Sequence[str], each: int, received: dict[str, int]) -> None:
        used = each * len(keys)
        self.remaining[gi] -= used
        self.left -= used
        for key in keys:
            received[key] = received.get(key, 0) + each
        if self.ledger is not None:
            self.ledger.extend((key, gi, each) for key in keys)

    def pack_new(self, options: Sequence[TypeOption], budget: int) -> list[NewBins]:
        """Pack what is left onto at most `budget` new instances.

        Each group opens bins of the cheapest available type that fits it (honouring its pin); per type,
        in the order of their largest group, bins are filled first-fit decreasing with the groups that
        chose the type, then the room left is filled with smaller tasks of any group the type can run,
        so they do not open bins of their own. Groups whose fitting types are all unavailable stay
        unplaced.
        """
        by_type: dict[str, list[int]] = {}
        for gi, group in enumerate(self.groups):
            if self.remaining[gi]:
                option = choose_type(group, options)
                if option is not None:
                    by_type.setdefault(option.name, []).append(gi)
        capacity = {o.name: o.capacity for o in options}
        out: list[NewBins] = []
        for type_name, openers in by_type.items():
            chosen = set(openers)
            fillers = [
                gi for gi, g in enumerate(self.groups) if gi not in chosen and g.pinned in (None, type_name)
            ]
            while budget > 0:
                pattern = self._pattern(capacity[type_name], openers, fillers)
                if not pattern:
                    break
                k = min(budget, *(self.remaining[gi] // n for gi, n in pattern))
                for gi, n in pattern:
                    self.remaining[gi] -= n * k
                    self.left -= n * k
                out.append(NewBins(type_name, k, sum(n for _, n in pattern), tuple(pattern)))
                budget -= k
        return out

    def _pattern(
        self, capacity: Vec, openers: Sequence[int], fillers: Sequence[int]
    ) -> list[tuple[int, int]]:
        """How many of each group one fresh bin takes: openers first-fit decreasing, then fillers in
        the room left. Empty when no opener is left (fillers never open a bin)."""
        free, pattern = capacity, []
        for gi in openers:
            n = min(self.remaining[gi], fit_count_nz(self.groups[gi].nz, free))
            if n:
                pattern.append((gi, n))
                free = minus(free, self.groups[gi].vec, n)
        if not pattern:
            return pattern
        for gi in fillers:
            n = min(self.remaining[gi], fit_count_nz(self.groups[gi].nz, free)) if self.remaining[gi] else 0
            if n:
                pattern.append((gi, n))
                free = minus(free, self.groups[gi].vec, n)
        return pattern


def choose_type(group: Group, options: Sequence[TypeOption]) -> TypeOption | None:
    """The cheapest available allowed type that fits one task of `group` (honouring its pin)."""
    for option in options:
        if option.available and group.pinned in (None, option.name) and fits(group.vec, option.capacity):
            return option
    return None
