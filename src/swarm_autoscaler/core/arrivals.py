"""What the daemon has seen of the work, per instance type, and how long an idle machine is worth
keeping (ski rental). Pure; the memory between ticks is an `ArrivalBook` the caller keeps (`Learner`).

An *arrival* for a type is a tick at which more machines of the type run or queue work than at the
tick before: work arrived that the type took (on a machine that was idle, or on a new one once it came
up). The book keeps, per type, the time of the last arrival and the gaps between the recent ones; the
typical gap is their median (the `RECENT` last gaps).

The rule (`idle_delays`, used by scale-down): an idle machine of a type is kept, as before, for the
drain and termination delays while any machine of ours works (the fleet is in use: the next task
may come any moment, arrivals onto busy machines are not seen, and a task may go to another type that
fits it), or while the type's next arrival is expected (`expected_next`: the last
arrival plus the typical gap, or, once that is past or before a gap is known, as long again as it has
been since the last arrival) within what a relaunch would cost, `break_even`: a new machine's boot billed while its task
waits that long (twice `Policy.tolerated_wait`, "about what a new machine takes to run a task"). When
the next arrival is expected later than that, keeping the machine idle costs more than launching again
when the work comes (the ski-rental break-even): it is drained after `Policy.idle_floor` (the operator's
lower bound) instead, and terminated at once once drained. Before any arrival of the type is seen (a fresh start, a restart: the
book lives in memory only, and a lost book only costs the old delays), or with `Policy.idle_learning`
off, the delays are the policy's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from swarm_autoscaler.core.actions import Plan
from swarm_autoscaler.core.model import Arrivals, Policy, Snapshot

RECENT = 7  # gaps kept per type


@dataclass(frozen=True, slots=True)
class ArrivalBook:
    """Per type: machines working at the last tick, the last arrival and the recent gaps."""

    working: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    last: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    gaps: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def view(self) -> Mapping[str, Arrivals]:
        """What the planner sees: per type with an arrival, its last one and typical gap (the median of
        the recent gaps; 0 before a second arrival)."""
        return MappingProxyType(
            {
                name: Arrivals(last, _median(self.gaps[name]) if self.gaps.get(name) else 0.0)
                for name, last in self.last.items()
            }
        )


def _median(values: tuple[float, ...]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def working_by_type(snapshot: Snapshot) -> dict[str, int]:
    """Type -> machines of ours (alive) whose workers run or queue a task."""
    type_of = {i.hostname: i.type_name for i in snapshot.instances if i.alive}
    hosts = {w.hostname for w in snapshot.workers if w.processing and w.hostname in type_of}
    out: dict[str, int] = {}
    for host in hosts:
        out[type_of[host]] = out.get(type_of[host], 0) + 1
    return out


def observe(book: ArrivalBook, snapshot: Snapshot) -> ArrivalBook:
    """The book after one more snapshot: an arrival for each type whose working machines grew."""
    now = snapshot.now
    working = working_by_type(snapshot)
    last, gaps = dict(book.last), dict(book.gaps)
    for name, count in working.items():
        if count <= book.working.get(name, 0):
            continue
        if name in last and now > last[name]:
            gaps[name] = (*gaps.get(name, ()), now - last[name])[-RECENT:]
        last[name] = now
    return ArrivalBook(MappingProxyType(working), MappingProxyType(last), MappingProxyType(gaps))


def expected_next(seen: Arrivals, now: float) -> float:
    """Seconds until the type's next arrival is expected: the last arrival plus the typical gap; when
    that is past, or no gap is known yet, as long again as it has been since the last arrival (the
    longer nothing came, the longer nothing is expected to come)."""
    elapsed = now - seen.last
    if seen.gap > elapsed:
        return seen.gap - elapsed
    return elapsed


def break_even(policy: Policy) -> float:
    """What a relaunch costs, in seconds of one machine: its boot billed while its task waits that long
    (a boot of about `tolerated_wait`, counted twice)."""
    return 2.0 * policy.tolerated_wait


def idle_delays(policy: Policy, snapshot: Snapshot, type_name: str) -> tuple[float, float, str]:
    """(drain delay, termination delay, why) for idle machines of `type_name` (see the module doc)."""
    seen = snapshot.arrivals.get(type_name) if policy.idle_learning else None
    if seen is None or any(working_by_type(snapshot).values()):
        return policy.drain_delay, policy.termination_delay, ""
    next_in = expected_next(seen, snapshot.now)
    if next_in <= break_even(policy):
        return policy.drain_delay, policy.termination_delay, ""
    floor = policy.idle_floor
    seen_as = f"one every {seen.gap:.0f}s" if seen.gap else f"none for {snapshot.now - seen.last:.0f}s"
    why = (
        f"idle_floor {floor:g}s: the next task for {type_name} is expected in {next_in:.0f}s "
        f"({seen_as}), later than a relaunch costs ({break_even(policy):g}s)"
    )
    return min(floor, policy.drain_delay), 0.0, why


Planner = Callable[[Snapshot, Policy], Plan]


class Learner:
    """A planner that remembers what it has seen of the work: each call records the snapshot's arrivals
    in its book and plans with them (`Snapshot.arrivals`). The decision stays `planner`'s, pure; only
    the book is carried from one call to the next (in memory: a restart starts a new one)."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.book = ArrivalBook()

    def __call__(self, snapshot: Snapshot, policy: Policy) -> Plan:
        self.book = observe(self.book, snapshot)
        if policy.idle_learning:
            snapshot = dataclasses.replace(snapshot, arrivals=self.book.view())
        return self.planner(snapshot, policy)
