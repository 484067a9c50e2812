"""What one plan launches, per instance type, and why. Used by plan(); pure.

A plan launches for three reasons, each counted so that the Launch action can say it: pending tasks that
need new capacity, `min_instances` (the minimum counts useful machines, the reserve comes on top), and a
type's warm reserve (launched when nothing is pending; the machines join, idle and are drained into it).
Every launch comes out of one budget: `max_instances` less the live instances, capped by
`max_launch_per_tick`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from swarm_autoscaler.core.actions import Launch
from swarm_autoscaler.core.cluster import Bucket, Fleet
from swarm_autoscaler.core.model import Policy, Snapshot, TypePolicy
from swarm_autoscaler.core.placement import NewBins, TypeOption

# Members that count towards min_instances: alive and expected to be useful.
USEFUL = (
    Bucket.LAUNCHED,
    Bucket.STARTING,
    Bucket.JOINING,
    Bucket.ACTIVE,
    Bucket.RETIRING,
    Bucket.DRAINED,
    Bucket.RESERVE,
    Bucket.DISCONNECTED,
)
# Buckets whose idle members count as a type's spare (warm) machines.
SPARE = (Bucket.RESERVE, Bucket.DRAINED, Bucket.LAUNCHED, Bucket.STARTING, Bucket.JOINING, Bucket.ACTIVE)


def useful(cluster: Fleet) -> int:
    """Alive instances expected to be useful (not broken, not terminating): what min_instances counts."""
    members = (m for b in USEFUL for m in cluster.bucket(b))
    return sum(1 for m in members if m.instance is not None and m.instance.alive)


def useful_of(cluster: Fleet, type_name: str) -> int:
    """`useful` for one instance type: what its base (`TypePolicy.minimum`) counts, with its reserve."""
    members = (m for b in USEFUL for m in cluster.bucket(b) if m.type_name == type_name)
    return sum(1 for m in members if m.instance is not None and m.instance.alive)


# Buckets whose members count as a type in use now (in flight: launched for work or a reserve).
IN_FLIGHT = (Bucket.LAUNCHED, Bucket.STARTING, Bucket.JOINING)


def last_used(cluster: Fleet, type_name: str, now: float) -> float | None:
    """When a machine of `type_name` last worked, as far as the fleet shows: now while one works or is
    in flight, else the latest `empty_since` / `drained_since` mark of its machines (None: no sign)."""
    latest: float | None = None
    for bucket in (*SPARE, Bucket.RETIRING):
        for m in cluster.bucket(bucket):
            if m.type_name != type_name:
                continue
            if m.working or bucket in IN_FLIGHT:
                return now
            marks = m.node.marks if m.node is not None else None
            if marks is None or (marks.empty_since is None and marks.drained_since is None):
                if bucket == Bucket.ACTIVE:
                    return now  # accepted, not yet marked empty
                continue
            stamp = max(t for t in (marks.empty_since, marks.drained_since) if t is not None)
            latest = stamp if latest is None else max(latest, stamp)
    return latest


def reserve_expired(cluster: Fleet, tp: TypePolicy, now: float) -> float | None:
    """How long the type has been unused when that is past its `reserve_idle_limit` (its reserve is
    then let go and not refilled), else None. No sign of use at all counts as expired: the reserve is
    filled once the type works, not ahead of any use."""
    if tp.reserve_idle_limit <= 0:
        return None
    last = last_used(cluster, tp.name, now)
    if last is None:
        return float("inf")
    return now - last if now - last >= tp.reserve_idle_limit else None


def reserve_missing(cluster: Fleet, received: Mapping[str, int], tp: TypePolicy, now: float) -> int:
    """How many machines the type's reserve lacks: its size less its spare (idle) machines, reserve,
    drained, launched or joining without placed work, and active without work; 0 while the reserve is
    expired (`reserve_expired`). Idle machines that make up the type's base (`minimum`, now always
    active: shrink.py) are no spare: the reserve comes on top of the base."""
    if tp.reserve <= 0 or reserve_expired(cluster, tp, now) is not None:
        return 0
    idle = sum(
        1
        for bucket in SPARE
        for m in cluster.bucket(bucket)
        if m.type_name == tp.name and not m.busy and m.key not in received
    )
    working = useful_of(cluster, tp.name) - idle
    return tp.reserve - max(0, idle - max(0, tp.minimum - working))


def plan_launches(
    snapshot: Snapshot,
    policy: Policy,
    cluster: Fleet,
    new_bins: Sequence[NewBins],
    received: Mapping[str, int],
    options: Sequence[TypeOption],
    fill_reserve: bool,
    started: Mapping[str, int] | None = None,
    reserve_started: Mapping[str, int] | None = None,
    replace: Mapping[str, tuple[str, ...]] | None = None,
) -> LaunchBook:
    """Every launch of one plan: the new instances scale-up packed pending work onto, what
    `min_instances` lacks and, when `fill_reserve` (nothing pending), what each type's reserve lacks.
    `received`: member key -> tasks scale-up placed on it (such a member is no spare). `started`: type
    -> machines this plan starts from the warm pool (they take from the same budget and count toward
    the bases); `reserve_started`: those of them started to fill a reserve (they count as its spare);
    `replace`: type -> machines EC2 recommends rebalancing, each replaced by one launch now."""
    started = started or {}
    book = LaunchBook.of(snapshot, policy)
    book.started = sum(started.values())
    book.budget = max(0, book.budget - book.started)
    for bins in new_bins:
        book.add(bins.type_name, bins.count, bins.count * bins.tasks_each)
    for type_name, ids in (replace or {}).items():
        count = min(len(ids), book.left)
        if count > 0:
            book.add(type_name, count, 0)
            book.for_replacement[type_name] = ids[:count]
    book.keep_bases(cluster, options, started)
    book.top_up(cluster, options)
    if fill_reserve:
        book.fill_reserve(cluster, received, options, snapshot.now, reserve_started or {})
    return book


@dataclass
class LaunchBook:
    """The launches of one plan. `budget` is how many instances the plan may launch in all."""

    policy: Policy
    budget: int
    by_type: dict[str, list[int]] = field(default_factory=dict)  # type -> [count, tasks, for minimum]
    for_reserve: dict[str, int] = field(default_factory=dict)  # type -> launched to fill its reserve
    for_base: dict[str, int] = field(default_factory=dict)  # type -> launched to keep its base
    # type -> machines EC2 recommends rebalancing, each replaced by one launch
    for_replacement: dict[str, tuple[str, ...]] = field(default_factory=dict)
    started: int = 0  # machines the plan starts from the warm pool (they count toward the minimum)

    @staticmethod
    def of(snapshot: Snapshot, policy: Policy) -> LaunchBook:
        alive = sum(1 for i in snapshot.instances if i.alive)
        budget = max(0, policy.max_instances - alive)
        if policy.max_launch_per_tick > 0:
            budget = min(budget, policy.max_launch_per_tick)
        return LaunchBook(policy, budget)

    @property
    def total(self) -> int:
        return sum(entry[0] for entry in self.by_type.values())

    @property
    def left(self) -> int:
        return self.budget - self.total

    def __contains__(self, type_name: object) -> bool:
        return type_name in self.by_type

    def __bool__(self) -> bool:
        return bool(self.by_type)

    def add(self, type_name: str, count: int, tasks: int) -> None:
        """`count` instances of `type_name` for `tasks` pending tasks (0: for the minimum or a reserve)."""
        entry = self.by_type.setdefault(type_name, [0, 0, 0])
        entry[0] += count
        entry[1] += tasks
        entry[2] += 0 if tasks else count

    def keep_bases(self, cluster: Fleet, options: Sequence[TypeOption], started: Mapping[str, int]) -> None:
        """Launch what each type's base (`TypePolicy.minimum`: machines always running, its reserve on
        top) lacks, while EC2 does not refuse the type everywhere."""
        available = {o.name for o in options if o.available}
        reserve: dict[str, int] = {}
        for member in cluster.reserve:
            reserve[member.type_name] = reserve.get(member.type_name, 0) + 1
        for tp in self.policy.allowed_types:
            if tp.minimum <= 0 or tp.name not in available:
                continue
            have = useful_of(cluster, tp.name) - reserve.get(tp.name, 0) + started.get(tp.name, 0)
            planned = self.by_type.get(tp.name, [0, 0, 0])[0]
            missing = min(tp.minimum - have - planned, self.left)
            if missing > 0:
                self.add(tp.name, missing, 0)
                self.for_base[tp.name] = self.for_base.get(tp.name, 0) + missing

    def top_up(self, cluster: Fleet, options: Sequence[TypeOption]) -> None:
        """Launch the cheapest available type for what `min_instances` lacks (the reserve is on top)."""
        have = useful(cluster) - len(cluster.reserve) + self.started
        missing = min(self.policy.min_instances - have - self.total, self.left)
        cheapest = next((o for o in options if o.available), None)
        if missing > 0 and cheapest is not None:
            self.add(cheapest.name, missing, 0)

    def fill_reserve(
        self,
        cluster: Fleet,
        received: Mapping[str, int],
        options: Sequence[TypeOption],
        now: float,
        started: Mapping[str, int],
    ) -> None:
        """Launch what a type's reserve lacks (`reserve_missing`), less the machines started from its
        warm pool for it (`started`)."""
        available = {o.name for o in options if o.available}
        for tp in self.policy.allowed_types:
            if tp.reserve <= 0 or tp.name not in available or self.left <= 0:
                continue
            planned = self.by_type.get(tp.name, [0, 0, 0])[0]
            lacking = reserve_missing(cluster, received, tp, now) - started.get(tp.name, 0)
            missing = min(lacking - planned, self.left)
            if missing > 0:
                self.add(tp.name, missing, 0)
                self.for_reserve[tp.name] = self.for_reserve.get(tp.name, 0) + missing

    def actions(self) -> list[Launch]:
        out = []
        for type_name, (count, tasks, for_minimum) in self.by_type.items():
            parts = []
            if tasks:
                parts.append(f"{tasks} pending task(s) need new capacity; cheapest fitting type: {type_name}")
            replaced = self.for_replacement.get(type_name, ())
            if replaced:
                parts.append(
                    f"{len(replaced)} to replace {', '.join(replaced)} early (EC2 recommends rebalancing it)"
                )
            for_reserve = self.for_reserve.get(type_name, 0)
            for_base = self.for_base.get(type_name, 0)
            if for_base:
                tp = self.policy.type_policy(type_name)
                parts.append(f"{for_base} to keep the base of {tp.minimum if tp else 0} {type_name} running")
            for_min = for_minimum - for_reserve - for_base - len(replaced)
            if for_min > 0:
                parts.append(f"{for_min} to keep min_instances={self.policy.min_instances}")
            if for_reserve:
                tp = self.policy.type_policy(type_name)
                parts.append(
                    f"{for_reserve} to fill the reserve of {tp.reserve if tp else 0} warm {type_name}"
                )
            out.append(Launch(type_name, count, "; ".join(parts)))
        return out
