"""The warm pool and the per-type base: which stopped machines to start, which drained ones to stop into
the pool, what to launch into it, and what to repair. Pure; used by plan() and scale-up.

A type's `warm_pool` (TypePolicy) is a number of *stopped* machines kept ready: launched into the pool
(`Launch(pool=True)`), each boots once, runs its boot script (pre-pulling images) and stops itself
without joining (bucket `preparing`, then `stopped`). Starting one (`Start`) takes well under a minute
where a launch takes minutes, and a stopped machine pays only for its EBS volume.

- **Start** (a scale-up tier, `start_bins`): after free room on active, cordoned, drained and reserve
  nodes, and after in-flight capacity (starting, joining and launched machines: a task never causes
  both a launch and a start), pending work goes onto stopped pool machines of a fitting type, then onto
  new instances. A pool machine whose (type, subnet) EC2 recently refused (`Snapshot.unavailable`: a
  refused start backs the pair off like a refused launch) is not offered, so a refusal falls through to
  a new launch in the next tick and never blocks scaling (osparc #8273).
- **Budget**: stopped and stopping machines do not count toward `max_instances`; a start comes out of
  the same budget as a launch (the machine is live again), and so does a machine preparing for the pool.
- **Refill** (`refill`, only when nothing is pending): a type whose pool (stopped plus preparing) is
  short gets the missing machines launched into it, within the budget.
- **Stop into the pool** (`PoolRoom`): scale-down's termination of a drained surplus machine becomes a
  `Stop` when its type's pool is short, with the same expectations (HostIdle + NodeOurs); `act` fences
  and re-checks it as a termination and removes its node, so no down node lingers.
- **Base** (`TypePolicy.minimum`): launches.py tops each type up to its base; shrink.py never scales
  a type below it.
- **Repair** (`repair_pool`): a down node left behind by a stopped pool machine is removed. An owned stopped machine outside its type's pool is `broken` (cluster.py) and
  terminated as "stopped outside the warm pool"; a machine in the pool is never broken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping

from swarm_autoscaler.core.actions import (
    Action,
    Check,
    HostIdle,
    Launch,
    NodeDown,
    NodeOurs,
    RemoveNode,
    Start,
    Stop,
    Terminate,
)
from swarm_autoscaler.core.backoff import refused_types
from swarm_autoscaler.core.cluster import Member
from swarm_autoscaler.core.launches import reserve_missing, useful_of
from swarm_autoscaler.core.model import InstanceState, NodeStatus
from swarm_autoscaler.core.steps import Facts, Step
from swarm_autoscaler.core.vectors import Vec

POOLED = "pool"  # the scale-up tier name of stopped pool machines

Bin = tuple[str, str, Vec]


def _blocked(facts: Facts, member: Member) -> bool:
    """EC2 recently refused this machine's type in its own subnet (a refused start, or launch, there): do
    not start it. A refusal elsewhere, or of launches where EC2 picks the subnet, leaves it startable: a
    pool machine may be the only capacity left while launches are refused."""
    inst = member.instance
    assert inst is not None
    now = facts.now
    return any(
        u.type_name == inst.type_name and u.until > now and u.subnet_id == inst.subnet_id
        for u in facts.snapshot.unavailable
    )


def start_bins(facts: Facts, capacity: Mapping[str, Vec], budget: int) -> tuple[dict[str, Member], list[Bin]]:
    """The stopped pool machines scale-up may start, at most `budget` of them (allowed types first in
    the policy's order, newest first within a type), as bins of their type's full capacity."""
    order = {tp.name: i for i, tp in enumerate(facts.policy.allowed_types)}
    candidates = sorted(
        (
            m
            for m in facts.cluster.stopped
            if m.instance is not None
            and m.instance.state is InstanceState.STOPPED  # EC2 cannot start a stopping machine yet
            and m.type_name in capacity
            and m.type_name in order
            and not _blocked(facts, m)
        ),
        key=lambda m: (order[m.type_name], -m.instance.launched_at if m.instance else 0.0, m.key),
    )[: max(0, budget)]
    return {m.key: m for m in candidates}, [(m.key, m.type_name, capacity[m.type_name]) for m in candidates]


def reserve_starts(
    facts: Facts, received: Mapping[str, int], taken: Collection[str], budget: int
) -> tuple[Start, ...]:
    """When nothing is pending: Starts of stopped pool machines for what each type's reserve lacks,
    before any launch (a start takes seconds where a launch takes minutes, and the pool machine is
    already paid for), within `budget`; `taken`: pool machines scale-up starts already. The started
    machine joins, idles and is drained into the reserve like a launched one; the pool is refilled by
    `refill` once it is short."""
    out = []
    for tp in facts.policy.allowed_types:
        missing = min(reserve_missing(facts.cluster, received, tp, facts.now), budget)
        if missing <= 0:
            continue
        _, bins = start_bins(facts, {tp.name: ()}, len(facts.cluster.stopped))
        ids = tuple(sorted([key for key, _, _ in bins if key not in taken][:missing]))
        if ids:
            why = f"fill the reserve of {tp.reserve} warm {tp.name} from its warm pool"
            out.append(Start(ids, tp.name, why))
            budget -= len(ids)
    return tuple(out)


def start_actions(members: list[Member], received: Mapping[str, int]) -> tuple[Start, ...]:
    """One Start per type for the pool machines that received pending tasks."""
    by_type: dict[str, list[Member]] = {}
    for member in members:
        by_type.setdefault(member.type_name, []).append(member)
    out = []
    for type_name, chosen in by_type.items():
        tasks = sum(received[m.key] for m in chosen)
        ids = tuple(sorted(m.key for m in chosen))
        why = f"{tasks} pending task(s) fit on {len(ids)} stopped {type_name} of the warm pool"
        out.append(Start(ids, type_name, why))
    return tuple(out)


def started(actions: tuple[Start, ...]) -> Counter[str]:
    """Type -> machines these Start actions start."""
    out: Counter[str] = Counter()
    for action in actions:
        out[action.type_name] += len(action.instance_ids)
    return out


def _in_pool(facts: Facts) -> Counter[str]:
    """Type -> machines in its pool or on their way into it (stopped, stopping, preparing)."""
    return Counter(m.type_name for m in (*facts.cluster.stopped, *facts.cluster.preparing))


class PoolRoom:
    """Where scale-down's terminations of drained machines go instead (shrink.py asks, machine by
    machine, before it plans each termination): a Stop into the type's warm pool while that pool is short
    (same expectations; no termination mark). EC2 cannot stop a one-time spot machine: it is terminated."""

    def __init__(self, facts: Facts) -> None:
        self._drained = {m.key for m in facts.cluster.drained}
        self._pools = {tp.name: tp.warm_pool for tp in facts.policy.allowed_types}
        self._pooled = _in_pool(facts)

    def stop(self, member: Member, reason: str, expect: tuple[Check, ...]) -> Step | None:
        """A Stop of `member` into its type's pool, counted against the pool's room, or None."""
        kind = member.type_name
        inst = member.instance
        if (
            inst is None
            or member.key not in self._drained
            or self._pooled[kind] >= self._pools.get(kind, 0)
            or inst.spot
        ):
            return None
        self._pooled[kind] += 1
        why = f"{reason}; stopped into the warm pool of {kind} ({self._pooled[kind]}/{self._pools[kind]})"
        node_ids = (member.node.id,) if member.node is not None else ()
        return Step((Stop((inst.id,), why, node_ids, expect),))


def refill(facts: Facts, shrink: Step, budget: int) -> tuple[Launch, ...]:
    """Launches into each pool that is short, within `budget`, for types not refused by EC2 everywhere.
    Counted as on their way into the pool: stopped, stopping and preparing machines, what `shrink`
    stops into it now, and the idle machines of the type running above its base and reserve: they are
    drained and stopped into the short pool by scale-down (so the end of a burst refills the pool with
    the machines it started, not with new launches beside them). A busy machine may run for long: it
    does not count."""
    pooled = _in_pool(facts)
    pooled.update(m.type_name for a in shrink.actions if isinstance(a, Stop) for m in _of(facts, a))
    reserve = Counter(m.type_name for m in facts.cluster.reserve)
    out = []
    for tp in facts.policy.allowed_types:
        idle = sum(
            1
            for m in (*facts.cluster.active, *facts.cluster.drained)
            if m.type_name == tp.name and not m.busy
        )
        above = min(useful_of(facts.cluster, tp.name) - reserve[tp.name] - tp.minimum, idle)
        ended = sum(
            1 for a in shrink.actions if isinstance(a, Stop | Terminate) and _type_of(facts, a) == tp.name
        )
        missing = min(tp.warm_pool - pooled[tp.name] - max(0, above - ended), budget)
        if missing <= 0 or _refused_everywhere(facts, tp.name):
            continue
        budget -= missing
        why = f"refill the warm pool of {tp.warm_pool} stopped {tp.name} ({pooled[tp.name]} there or on the way)"
        out.append(Launch(tp.name, missing, why, pool=True))
    return tuple(out)


def _type_of(facts: Facts, action: Stop | Terminate) -> str:
    ids = set(action.instance_ids)
    return next((i.type_name for i in facts.snapshot.instances if i.id in ids), "")


def _of(facts: Facts, action: Stop) -> list[Member]:
    ids = set(action.instance_ids)
    return [m for m in facts.cluster.drained if m.key in ids]


def _refused_everywhere(facts: Facts, type_name: str) -> bool:
    return type_name in refused_types(facts.snapshot.unavailable, facts.policy.subnets, facts.now)


def repair_pool(facts: Facts) -> Step:
    """A down node left behind by a stopped pool machine is removed (HostIdle, NodeDown and NodeOurs
    re-checked): the machine joins afresh when it is started. (A starting machine's node that is not
    ready yet may be joining: it is left alone.)"""
    actions: list[Action] = []
    removed: set[str] = set()
    for member in facts.cluster.stopped:
        node = member.node
        if node is None or node.status == NodeStatus.READY or member.busy:
            continue
        expect: tuple[Check, ...] = (HostIdle(member.hostname), NodeDown(node.id), NodeOurs(node.id))
        why = "left behind by its machine, stopped in the warm pool"
        actions.append(RemoveNode(node.id, node.hostname, why, expect=expect))
        removed.add(node.id)
    return Step(tuple(actions), removed=frozenset(removed))
