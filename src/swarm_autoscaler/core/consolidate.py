"""Consolidation: which under-used workers to cordon so that the fleet can shrink. Pure; used by plan().

Dask sends each task to the least busy worker, and an empty worker is the least busy of all: without
consolidation, a fleet stays as large as its last peak for as long as tasks keep arriving, every
machine running a task or two, none ever empty for `drain_delay`. A *cordoned* worker gets no new task
(dask's `closing_gracefully` status) while its running tasks finish; once empty, its node follows the
usual rules (drained after `drain_delay`, terminated beyond the reserve after `termination_delay`),
and pending work that fits it takes it back (uncordoned) before drained nodes or new instances.

The rule, per instance type, least used first (the rule and default threshold of Kubernetes'
cluster-autoscaler, `--scale-down-utilization-threshold` 0.5): a worker using at most `threshold` of
its machine, in its most used resource, is cordoned when its tasks and then one more of the largest task
running on that type can each be placed on ONE of the other uncordoned workers of its type (first fit
decreasing onto each worker's own free room, never onto room summed over several workers: a task runs
on one worker, and summed room let a cordon be undone a tick later). Dask queues a new task behind a
busy worker rather than wait for a cordoned one, and does not reliably move it once queued, so the
room must be there when the task arrives. The room a cordoned worker's tasks take stays taken for
the next candidates, and those tasks move on with a worker that is itself cordoned later. One worker of each type always stays uncordoned,
and a worker with a task waiting on it is never cordoned (that task would never start).

**Cost-aware, across types** (after the per-type pass, most expensive machine first): a worker of a
type dearer than others present is also cordoned when its tasks, and then one more of its largest,
each fit on ONE uncordoned worker of a strictly cheaper type (first fit decreasing, as above; a task
pinned to its type never moves): an expensive machine whose tasks fit on cheaper ones, paid for anyway,
goes. A machine with GPUs running no GPU task is a candidate whatever its share (its GPUs, what it is
paid for, are idle). Such a cordon may leave no uncordoned worker of its type: a task only it can run
then waits on it and takes it back (uncordoned) at once.

plan() calls this when nothing is pending, and **under load** (Karpenter's `WhenEmptyOrUnderutilized`)
when the plan placed every pending task on existing capacity: members that received pending tasks are
no candidates, and their room counts for nobody (the plan gave it to that work).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from swarm_autoscaler.core.actions import Check, Cordon, NodeOurs, NothingWaits
from swarm_autoscaler.core.cluster import Member
from swarm_autoscaler.core.vectors import Space, Vec, fits, minus, plus

Rooms = dict[str, Vec]  # worker address -> free room


def choose_cordons(
    candidates: Iterable[Member],
    free: Mapping[str, Vec],
    capacity: Mapping[str, Vec],
    threshold: float,
    space: Space,
    prices: Mapping[str, float | None] | None = None,
    by: float = float("inf"),
) -> list[Cordon]:
    """Cordon actions for `candidates` (active, uncordoned members with workers). `free` is each worker's
    free capacity, `capacity` a whole machine's per type; `space` turns task needs into vectors;
    `prices` (per type, None: unknown) enables the cost-aware pass across types."""
    by_type: dict[str, list[Member]] = {}
    for member in candidates:
        by_type.setdefault(member.type_name, []).append(member)
    out: list[Cordon] = []
    left: Rooms = {}  # the room of every worker still uncordoned after the per-type pass
    for type_name, members in sorted(by_type.items()):
        whole = capacity.get(type_name)
        rooms = {w.address: free[w.address] for m in members for w in m.workers}
        if whole is not None and len(members) > 1:
            cordons, rooms = _of_type(members, free, whole, threshold, space)
            out.extend(cordons)
        left.update(rooms)
    if prices:
        cordoned = {a for c in out for a in c.addresses}
        rest = [m for ms in by_type.values() for m in ms if not cordoned & {w.address for w in m.workers}]
        out.extend(_to_cheaper(rest, (left, free), capacity, threshold, space, prices, by))
    return out


def _of_type(
    members: Sequence[Member], free: Mapping[str, Vec], whole: Vec, threshold: float, space: Space
) -> tuple[list[Cordon], Rooms]:
    """The per-type pass: its cordons, and the room left on the workers it left uncordoned."""
    needs = [space.vec(t.needs) for m in members for w in m.workers for t in w.processing]
    rooms = _Rooms({w.address: free[w.address] for m in members for w in m.workers}, needs, space)
    out: list[Cordon] = []
    uncordoned = len(members)
    for share, member in _ranked(members, free, whole, threshold):
        # One worker of the type stays uncordoned. The room check alone already ensures it (the last
        # worker's tasks and the next task would have no other worker to go to), so deleting this test
        # changes no plan; it stays so that the rule does not rest on that. Rooms only shrink: once
        # no worker has room for the next task, none will.
        if uncordoned <= 1 or not rooms.roomy:
            break
        mine = frozenset(w.address for w in member.workers)
        tasks = [space.vec(t.needs) for w in member.workers for t in w.processing]
        packed = rooms.pack(tasks, mine)
        if packed is None:
            continue
        rooms.take(packed, mine)
        uncordoned -= 1
        node = member.node
        assert node is not None
        reason = f"uses {share:.0%} of its machine; the rest of its type has room for its tasks"
        out.append(_cordon(member, reason))
    gone = {a for c in out for a in c.addresses}
    return out, {a: room for a, room in rooms.rooms.items() if a not in gone}


def _cordon(member: Member, reason: str) -> Cordon:
    node = member.node
    assert node is not None
    expect: tuple[Check, ...] = (NothingWaits(member.hostname), NodeOurs(node.id))
    return Cordon(
        node.id, node.hostname, tuple(sorted(w.address for w in member.workers)), reason, expect=expect
    )


def _to_cheaper(
    members: Sequence[Member],
    room: tuple[Rooms, Mapping[str, Vec]],
    capacity: Mapping[str, Vec],
    threshold: float,
    space: Space,
    prices: Mapping[str, float | None],
    by: float,
) -> list[Cordon]:
    """The cost-aware pass (module doc): dearest first, then least used, then by key. `room` is (the
    room of every candidate worker still uncordoned, consumed; each worker's free room). A member that
    runs nothing, or took tasks of a worker cordoned by the per-type pass, stays out."""
    rooms, free = room
    type_of = {w.address: m.type_name for m in members for w in m.workers}
    ranked = []
    for m in members:
        price, whole = prices.get(m.type_name), capacity.get(m.type_name)
        if price is None or whole is None or not _movable(m, rooms, free, by):
            continue
        share = _share(m, free, whole)
        idle_gpus = whole[2] > 0 and not any(t.needs.gpus for w in m.workers for t in w.processing)
        if share <= threshold or idle_gpus:
            ranked.append((-price, share, m.key, m))
    out: list[Cordon] = []
    for neg_price, share, _, member in sorted(ranked, key=lambda r: r[:3]):
        mine = {w.address for w in member.workers}
        if not mine <= rooms.keys():
            continue  # it took tasks of a worker cordoned in this pass
        cheaper = [a for a in sorted(rooms) if (p := prices.get(type_of[a])) is not None and p < -neg_price]
        tasks = [space.vec(t.needs) for w in member.workers for t in w.processing]
        packed = _pack(tasks, cheaper, rooms, space)
        if packed is None:
            continue
        for a in mine:
            del rooms[a]
        rooms.update(packed)
        t = member.type_name
        what = (
            f"runs no GPU task on its {t} ({share:.0%} used)"
            if share > threshold
            else f"uses {share:.0%} of its {t}"
        )
        out.append(_cordon(member, f"{what}; cheaper machines have room for its tasks"))
    return out


def _movable(member: Member, rooms: Rooms, free: Mapping[str, Vec], by: float) -> bool:
    """It runs tasks, every one of them (none waits), none pinned to its type, all expected (by dask's
    estimates) to end by `by`, and its workers took no task of a worker cordoned before."""
    tasks = [t for w in member.workers for t in w.processing]
    if not tasks or not all(t.executing and t.pinned_type is None for t in tasks):
        return False
    if not all(
        t.expected is not None and t.started is not None and t.started + t.expected <= by for t in tasks
    ):
        return False
    return all(rooms.get(w.address) == free[w.address] for w in member.workers)


def _share(member: Member, free: Mapping[str, Vec], whole: Vec) -> float:
    """The share of its machine it uses, in its most used resource."""
    room = tuple(0.0 for _ in whole)
    for w in member.workers:
        room = plus(room, free[w.address])
    used = minus(whole, room)
    return max((u / c for u, c in zip(used, whole, strict=True) if c > 0), default=0.0)


def _pack(tasks: Sequence[Vec], targets: Sequence[str], rooms: Rooms, space: Space) -> Rooms | None:
    """The rooms of `targets` after each of `tasks`, largest first, went to the first with room; None
    when one fits none, or when none is left with room for one more of the largest task (the next
    such task must find room when it arrives)."""
    changed: Rooms = {}
    for need in sorted(tasks, reverse=True):
        target = next((a for a in targets if fits(need, changed.get(a, rooms[a]))), None)
        if target is None:
            return None
        changed[target] = minus(changed.get(target, rooms[target]), need)
    largest = _largest(tasks, space)
    if not any(fits(largest, changed.get(a, rooms[a])) for a in targets):
        return None
    return changed


class _Rooms:
    """The free room of each uncordoned worker of one type (by address), and the tasks of cordoned
    workers counted on each (`load`: when such a worker is itself cordoned later, they move on with its
    own). In address order: `order`, the workers with room for the smallest task running on the type
    (the others can take none: rooms only shrink, so leaving them out of first-fit scans keeps a large
    quiet fleet's plan fast), and `roomy`, those with room for the next task (`headroom`, the largest),
    which a cordon relies on."""

    def __init__(self, rooms: Rooms, needs: Sequence[Vec], space: Space) -> None:
        self.rooms = rooms
        self.load: dict[str, list[Vec]] = {}
        self.headroom = _largest(needs, space)
        self.smallest = tuple(map(min, *needs)) if len(needs) > 1 else needs[0] if needs else space.zero
        self.order = [a for a in sorted(rooms) if fits(self.smallest, rooms[a])]
        self.roomy = [a for a in self.order if fits(self.headroom, rooms[a])]

    def pack(self, tasks: Sequence[Vec], skip: frozenset[str]) -> list[tuple[str, Vec]] | None:
        """Where each of `tasks`, and of the load counted on `skip`, goes: on one worker not in `skip`
        each (largest first, first worker with room in address order). None when one fits no single
        worker, or when no worker is left with room for the next task."""
        changed: Rooms = {}
        placed = []
        for need in sorted([*tasks, *(v for a in skip for v in self.load.get(a, ()))], reverse=True):
            target = next(
                (a for a in self.order if a not in skip and fits(need, changed.get(a, self.rooms[a]))), None
            )
            if target is None:
                return None
            changed[target] = minus(changed.get(target, self.rooms[target]), need)
            placed.append((target, need))
        roomy = (a for a in self.roomy if a not in skip)
        return placed if any(fits(self.headroom, changed.get(a, self.rooms[a])) for a in roomy) else None

    def take(self, placed: list[tuple[str, Vec]], cordoned: frozenset[str]) -> None:
        """Apply a cordon: its tasks (and the load counted on it) take room on the workers chosen by
        `pack`, and its own workers take no new tasks."""
        for a, need in placed:
            self.rooms[a] = minus(self.rooms[a], need)
            self.load.setdefault(a, []).append(need)
        changed = {a for a, _ in placed}
        gone = set(cordoned) | {a for a in changed if not fits(self.smallest, self.rooms[a])}
        full = gone | {a for a in changed if not fits(self.headroom, self.rooms[a])}
        self.order = [a for a in self.order if a not in gone]
        self.roomy = [a for a in self.roomy if a not in full]


def _ranked(
    members: Sequence[Member], free: Mapping[str, Vec], whole: Vec, threshold: float
) -> list[tuple[float, Member]]:
    """The members using at most `threshold` of their machine in their most used resource, least used
    first (then by key); a member with a task waiting on it is left out (it would never start)."""
    ranked = []
    for m in members:
        if not all(t.executing for w in m.workers for t in w.processing):
            continue
        room = tuple(0.0 for _ in whole)
        for w in m.workers:
            room = plus(room, free[w.address])
        used = minus(whole, room)
        share = max((u / c for u, c in zip(used, whole, strict=True) if c > 0), default=0.0)
        if share <= threshold:
            ranked.append((share, m.key, m))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(share, m) for share, _, m in ranked]


def _largest(needs: Sequence[Vec], space: Space) -> Vec:
    """The most CPUs, RAM and GPUs any one of `needs` (the tasks running on a type) asks for: the room
    kept for the next such task, on one worker. Dask queues a task behind a busy worker rather than
    wait for a cordoned one, and does not reliably move it when room appears elsewhere, so an
    uncordoned worker must have room for it when it arrives. (Generic resources keep no headroom.)"""
    largest = list(space.zero)
    for need in needs:
        for d in range(3):
            largest[d] = max(largest[d], need[d])
    return tuple(largest)
