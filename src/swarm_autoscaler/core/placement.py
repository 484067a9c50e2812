"""Fitting and virtual assignment of pending tasks to capacity. Pure; used by `plan()`.

Speed matters (tens of thousands of tasks, a thousand nodes, dozens of types every tick), so:

- resources are plain float vectors (vectors.py) and pending tasks come as counted groups (demand.py);
- bins (capacity of one worker or machine) with the same type and free vector form one class that is
  filled at once (how many of a group fit in one bin is a division, not a loop);
- new instances are packed first-fit decreasing, and a fill pattern that repeats is applied k times in
  one step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Unplaceable
from swarm_autoscaler.core.backoff import refused_types
from swarm_autoscaler.core.demand import Group
from swarm_autoscaler.core.model import Policy, Snapshot
from swarm_autoscaler.core.vectors import EPS, Space, Vec, fit_count_nz, fits, minus

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
    resources, then the order of `allowed_types`). `available` is False while EC2 refuses the type in
    every subnet of `policy.subnets` (backoff.refused_types): one open subnet is enough to launch."""
    catalogue = {t.name: t for t in snapshot.instance_types}
    refused = refused_types(snapshot.unavailable, policy.subnets, snapshot.now)
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
        if group.pinned.startswith("node."):  # a swarm constraint (core/services.py), no type's name
            return f"constrained to {group.pinned}, which no machine the daemon launches carries"
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
    how many of which group (by index into the unplaced groups)."""

    type_name: str
    count: int
    tasks_each: int
    pattern: tuple[tuple[int, int], ...] = ()


class Unplaced:
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
                self._take_out(i)
        return tuple(sorted(out, key=lambda u: u.task_key))

    def hold_soon(self) -> int:
        """Take the `soon` tasks still unplaced out of it (they wait for their own worker);
        returns how many."""
        return sum(self._take_out(i) for i, group in enumerate(self.groups) if group.soon)

    def hold_for_types(self, options: Sequence[TypeOption], types: Iterable[str]) -> int:
        """Take out the tasks still unplaced whose cheapest fitting type (`choose_type`) is one of `types`
        (their type's queue threshold holds them for its workers); returns how many."""
        held = set(types)
        return sum(
            self._take_out(i)
            for i, group in enumerate(self.groups)
            if self.remaining[i]
            and (option := choose_type(group, options)) is not None
            and option.name in held
        )

    def _take_out(self, i: int) -> int:
        """Remove what is left of group `i` from the unplaced tasks; returns how many tasks that was."""
        n, self.remaining[i] = self.remaining[i], 0
        self.left -= n
        return n

    def fill(
        self, bins: Iterable[tuple[str, str, Vec]], barred: Mapping[str, frozenset[int]] | None = None
    ) -> dict[str, int]:
        """Place pending tasks into existing bins (key, type name, free capacity), first-fit decreasing
        per bin; returns how many tasks each bin key received (only keys that received some).
        `barred`: type name -> groups (by index) its bins may not take."""
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
                bar = barred.get(type_name, frozenset()) if barred else frozenset()
                eligible[type_name] = [i for i in self._eligible(type_name) if i not in bar]
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

        When the budget cannot hold what every type needs, it is shared fairly (max-min, `fair_shares`):
        each type gets an equal share, a type needing less gives its surplus to the others, and the
        remainder goes one machine each to the types first in order. Taken in order instead, the type
        with the largest tasks took every machine and the others' work (GPU jobs, say) waited behind its
        whole backlog (5/5/5 machines needed with room for 8 gave 5/3/0, now 3/3/2).
        """
        if budget <= 0:
            return []
        by_type: dict[str, list[int]] = {}
        for gi, group in enumerate(self.groups):
            if self.remaining[gi]:
                option = choose_type(group, options)
                if option is not None:
                    by_type.setdefault(option.name, []).append(gi)
        capacity = {o.name: o.capacity for o in options}
        saved = (list(self.remaining), self.left)
        out = self._pack(by_type, capacity, None, None)
        need: dict[str, int] = {}
        for b in out:
            need[b.type_name] = need.get(b.type_name, 0) + b.count
        if sum(need.values()) <= budget:  # the common case: one pass, the budget never binds
            return out
        self.remaining, self.left = saved
        out = self._pack(by_type, capacity, fair_shares(need, budget), budget)
        spare = budget - sum(b.count for b in out)
        if spare > 0 and self.left:  # a type packed fewer than its share (others' bins took its tasks)
            out += self._pack(by_type, capacity, None, spare)
        return out

    def _pack(
        self,
        by_type: Mapping[str, Sequence[int]],
        capacity: Mapping[str, Vec],
        caps: Mapping[str, int] | None,
        budget: int | None,
    ) -> list[NewBins]:
        """`pack_new`'s fill, each type within its cap (None: unlimited), all within `budget`."""
        out: list[NewBins] = []
        for type_name, openers in by_type.items():
            chosen = set(openers)
            fillers = [
                gi for gi, g in enumerate(self.groups) if gi not in chosen and g.pinned in (None, type_name)
            ]
            cap = caps.get(type_name, 0) if caps is not None else None
            while (budget is None or budget > 0) and (cap is None or cap > 0):
                pattern = self._pattern(capacity[type_name], openers, fillers)
                if not pattern:
                    break
                limits = [self.remaining[gi] // n for gi, n in pattern]
                k = min(limits + [x for x in (budget, cap) if x is not None])
                for gi, n in pattern:
                    self.remaining[gi] -= n * k
                    self.left -= n * k
                out.append(NewBins(type_name, k, sum(n for _, n in pattern), tuple(pattern)))
                budget = None if budget is None else budget - k
                cap = None if cap is None else cap - k
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


def dearer_special(
    groups: Sequence[Group], options: Sequence[TypeOption], type_names: Iterable[str]
) -> dict[str, frozenset[int]]:
    """Type name -> the groups a machine of that type is too dear for when it is idle: the type offers
    a resource beyond CPU and memory (GPUs, a generic resource) the group does not use, and a strictly
    cheaper type fits the group. Such a drained GPU machine is not brought back for CPU-only work: it
    would bill at the GPU's price for work a cheaper machine takes."""
    by_name = {o.name: o for o in options}
    out: dict[str, frozenset[int]] = {}
    cheapest: dict[int, TypeOption | None] = {}  # per group: it does not depend on the type asked about
    for name in set(type_names):
        option = by_name.get(name)
        if option is None or option.price is None:
            continue
        special = [d for d, amount in enumerate(option.capacity) if d >= 2 and amount > EPS]
        if not special:
            continue
        barred = set()
        for gi, group in enumerate(groups):
            if group.pinned is not None or any(group.vec[d] > 0 for d in special):
                continue
            if gi not in cheapest:
                cheapest[gi] = choose_type(group, options)
            cheaper = cheapest[gi]
            if cheaper is not None and cheaper.price is not None and cheaper.price < option.price:
                barred.add(gi)
        if barred:
            out[name] = frozenset(barred)
    return out


def fair_shares(need: Mapping[str, int], budget: int) -> dict[str, int]:
    """Max-min fair split of `budget` machines over types needing `need` (in order): equal shares, a
    type's surplus over its need shared again among the rest, the remainder one each to the first."""
    share = dict.fromkeys(need, 0)
    open_ = [t for t, n in need.items() if n > 0]
    while budget > 0 and open_:
        each, extra = divmod(budget, len(open_))
        if not each:
            for type_name in open_[:extra]:
                share[type_name] += 1
            break
        for type_name in open_:
            give = min(each, need[type_name] - share[type_name])
            share[type_name] += give
            budget -= give
        open_ = [t for t in open_ if share[t] < need[t]]
    return share


def choose_type(group: Group, options: Sequence[TypeOption]) -> TypeOption | None:
    """The cheapest available allowed type that fits one task of `group` (honouring its pin)."""
    for option in options:
        if option.available and group.pinned in (None, option.name) and fits(group.vec, option.capacity):
            return option
    return None
