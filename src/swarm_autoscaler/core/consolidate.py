"""Consolidation: which under-used workers to cordon so that the fleet can shrink. Pure; used by plan().

Dask sends each task to the least busy worker, and an empty worker is the least busy of all: without
consolidation, a fleet stays as large as its last peak for as long as tasks keep arriving, every
machine running a task or two, none ever empty for `drain_delay`. A *cordoned* worker gets no new task
(dask's `closing_gracefully` status) while its running tasks finish; once empty, its node follows the
usual rules (drained after `drain_delay`, terminated beyond the reserve after `termination_delay`),
and pending work that fits it takes it back (uncordoned) before drained nodes or new instances.

The rule, per instance type, least used first (the rule and default threshold of Kubernetes'
cluster-autoscaler, `--scale-down-utilization-threshold` 0.5): a worker using at most `threshold` of
its machine, in its most used resource, is cordoned when the other uncordoned workers of its type have
room for its tasks plus one more of the largest task running on that type (dask queues a new task
behind a busy worker rather than wait for a cordoned one, and does not reliably move it once queued,
so the room must be there when the task arrives). One worker of each type always stays uncordoned,
and a worker with a task waiting on it is never cordoned (that task would never start). plan() only
calls this when nothing is pending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from swarm_autoscaler.core.cluster import Member
from swarm_autoscaler.core.model import Cordon
from swarm_autoscaler.core.vectors import Vec, fits, minus, plus


def choose_cordons(
    candidates: Iterable[Member], free: Mapping[str, Vec], capacity: Mapping[str, Vec], threshold: float
) -> list[Cordon]:
    """Cordon actions for `candidates` (active, uncordoned members with workers). `free` is each worker's
    free capacity, `capacity` a whole machine's per type."""
    by_type: dict[str, list[Member]] = {}
    for member in candidates:
        by_type.setdefault(member.type_name, []).append(member)
    out: list[Cordon] = []
    for type_name, members in sorted(by_type.items()):
        whole = capacity.get(type_name)
        if whole is not None and len(members) > 1:
            out.extend(_of_type(members, free, whole, threshold))
    return out


def _of_type(
    members: Sequence[Member], free: Mapping[str, Vec], whole: Vec, threshold: float
) -> list[Cordon]:
    room_of = {m.key: _room(m, free, whole) for m in members}
    room = tuple(0.0 for _ in whole)
    for m in members:
        room = plus(room, room_of[m.key])
    ranked = []
    for m in members:
        if not all(t.executing for w in m.workers for t in w.processing):
            continue  # a task waits on it: cordoning would leave it stuck
        used = minus(whole, room_of[m.key])
        share = max((u / c for u, c in zip(used, whole, strict=True) if c > 0), default=0.0)
        if share <= threshold:
            ranked.append((share, m.key, m, used))
    ranked.sort(key=lambda r: (r[0], r[1]))
    headroom = _largest_task(members, whole)
    out: list[Cordon] = []
    uncordoned = len(members)
    for share, _key, member, used in ranked:
        rest = minus(room, room_of[member.key])
        if uncordoned <= 1 or not fits(plus(used, headroom), rest):
            continue
        room = minus(rest, used)
        uncordoned -= 1
        node = member.node
        assert node is not None
        reason = f"uses {share:.0%} of its machine; the rest of its type has room for its tasks"
        out.append(Cordon(node.id, node.hostname, tuple(w.address for w in member.workers), reason))
    return out


def _largest_task(members: Sequence[Member], whole: Vec) -> Vec:
    """The most CPUs, RAM and GPUs any one task running on these members needs: the room kept for the
    next such task. Dask queues a task behind a busy worker rather than wait for a cordoned one, and
    does not reliably move it when room appears elsewhere, so the uncordoned workers must have room
    for it when it arrives. (Generic resources keep no headroom.)"""
    largest = [0.0] * len(whole)
    for m in members:
        for w in m.workers:
            for t in w.processing:
                need = (t.needs.cpus, t.needs.ram, t.needs.gpus)
                for d in range(3):
                    largest[d] = max(largest[d], float(need[d]))
    return tuple(largest)


def _room(member: Member, free: Mapping[str, Vec], whole: Vec) -> Vec:
    """The member's free room: what its workers have left."""
    total = tuple(0.0 for _ in whole)
    for w in member.workers:
        total = plus(total, free[w.address])
    return total
