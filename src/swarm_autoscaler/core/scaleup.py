"""Scale up: place pending tasks virtually on existing capacity, tier by tier, then on new instances.

Tiers, in order: free room on active workers (and on active nodes whose worker is starting), on
cordoned workers (which are then uncordoned), then drained and reserve nodes (activated), joining nodes,
launched instances and machines starting from the warm pool (in-flight capacity always counts, so a task
never causes two launches, nor a launch and a start), then stopped warm-pool machines (started; see
pool.py). What is left is packed onto new instances of the cheapest fitting type, within the launch
budget less the starts. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from swarm_autoscaler.core.actions import ActivateNode, Start, Uncordon
from swarm_autoscaler.core.cluster import Bucket, Member
from swarm_autoscaler.core.drift import staying
from swarm_autoscaler.core.interrupt import rebalancing
from swarm_autoscaler.core.model import Availability, NodeStatus
from swarm_autoscaler.core.placement import NewBins, TypeOption, Unplaced, dearer_special
from swarm_autoscaler.core.pool import POOLED, start_actions, start_bins
from swarm_autoscaler.core.steps import Facts, Mark, mark
from swarm_autoscaler.core.surge import BELOW_SURGE, below_threshold
from swarm_autoscaler.core.vectors import Vec

# Buckets that receive pending tasks, in order, and where their capacity comes from.
TIERS = (Bucket.ACTIVE, Bucket.DRAINED, Bucket.RESERVE, Bucket.JOINING, Bucket.LAUNCHED, Bucket.STARTING)
NEW = "new"
CORDONED = "cordoned"
UNOWNED = "unowned"  # idle room on workers whose nodes the daemon does not own (never touched)
OWN_WORKER = "own-worker"  # queued tasks their busy worker is expected to start within tolerated_wait

Bin = tuple[str, str, Vec]  # (key, type name, free room)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where scale-up put the pending work.

    `received`: member key -> tasks placed on it; `placed`: tier name -> tasks (in tier order);
    `uncordon` / `activate`: the cordoned workers and drained nodes that received tasks, with the
    marks activation changes; `new_bins`: the fill patterns of new instances; `bins`: every existing
    bin offered (key -> type, free room), only when tracing; `start`: the warm-pool machines started."""

    received: Mapping[str, int]
    placed: tuple[tuple[str, int], ...]
    uncordon: tuple[Uncordon, ...]
    activate: tuple[ActivateNode, ...]
    marks: tuple[Mark, ...]
    new_bins: tuple[NewBins, ...]
    bins: Mapping[str, tuple[str, Vec]]
    start: tuple[Start, ...] = ()


@dataclass
class _Fill:
    """Scale-up's own running totals; local to `scale_up`."""

    unplaced: Unplaced
    tracing: bool
    received: dict[str, int] = field(default_factory=dict)
    placed: dict[str, int] = field(default_factory=dict)
    bins: dict[str, tuple[str, Vec]] = field(default_factory=dict)

    def place(
        self,
        tier: str,
        owner: Mapping[str, Member],
        bins: list[Bin],
        barred: Mapping[str, frozenset[int]] | None = None,
    ) -> list[Member]:
        """Fill `bins` from the unplaced tasks (a type's `barred` groups excepted); count what each
        member received. Returns the members that received tasks, once each."""
        if self.tracing:
            self.bins.update((key, (type_name, free)) for key, type_name, free in bins)
        got = self.unplaced.fill(bins, barred)
        self.placed[tier] = sum(got.values())
        members: dict[str, Member] = {}
        if tier == UNOWNED:  # not ours: no member of ours received anything
            return []
        for key, n in got.items():
            member = owner[key]
            self.received[member.key] = self.received.get(member.key, 0) + n
            members[member.key] = member
        return list(members.values())


def scale_up(
    facts: Facts,
    unplaced: Unplaced,
    options: tuple[TypeOption, ...],
    capacity: Mapping[str, Vec],
    budget: int,
    tracing: bool = False,
) -> Placement:
    """Place what is left in `unplaced` (consumed) tier by tier, then onto at most `budget` new instances."""
    fill = _Fill(unplaced, tracing)
    uncordon: list[Uncordon] = []
    activate: list[Member] = []
    for tier in TIERS:
        if unplaced.left:
            owner, bins = _tier_bins(facts, tier, capacity)
            asleep = tier in (Bucket.DRAINED, Bucket.RESERVE)
            barred = dearer_special(unplaced.groups, options, (b[1] for b in bins)) if asleep else None
            got = fill.place(tier.value, owner, bins, barred)
            activate += got if asleep else []
        if tier == Bucket.ACTIVE and unplaced.left:
            fill.place(UNOWNED, *_unowned_bins(facts))
        if tier == Bucket.ACTIVE and unplaced.left:
            for member in fill.place(CORDONED, *_cordoned_bins(facts)):
                why = f"{fill.received[member.key]} pending task(s) fit on this cordoned worker"
                uncordon.append(uncordon_action(member, why))
        if tier == Bucket.ACTIVE and (held := unplaced.hold_soon()):
            fill.placed[OWN_WORKER] = held
    start: tuple[Start, ...] = ()
    if unplaced.left:
        starting = fill.place(POOLED, *start_bins(facts, capacity, budget))
        start = start_actions(starting, fill.received)
        budget -= len(starting)
    new_bins, waiting = _hold_below_surge(facts, unplaced, options, budget)
    if new := sum(b.count * b.tasks_each for b in new_bins):
        fill.placed[NEW] = new
    if waiting:
        fill.placed[BELOW_SURGE] = waiting
    actions, marks = _activations(activate, fill.received)
    return Placement(
        received=fill.received,
        placed=tuple((name, n) for name, n in fill.placed.items() if n),
        uncordon=tuple(uncordon),
        activate=actions,
        marks=marks,
        new_bins=new_bins,
        bins=fill.bins,
        start=start,
    )


def _hold_below_surge(
    facts: Facts, unplaced: Unplaced, options: tuple[TypeOption, ...], budget: int
) -> tuple[tuple[NewBins, ...], int]:
    """New bins for what is left, within `budget`, and how many tasks wait below a queue threshold.

    A type with a queue threshold launches only for a longer queue while a worker of it is up (surge.py):
    its bins are dropped, and the rest of its queue (tasks the budget left unplaced whose cheapest type it
    is) waits with them. The budget its bins held goes to the other types' tasks left unplaced: packed
    again, and checked again (the queue is shorter now), until no type is held back."""
    new_bins = tuple(unplaced.pack_new(options, budget))
    held: set[str] = set()
    waiting = 0
    while below := below_threshold(new_bins, facts.cluster, facts.policy, unplaced.left):
        held.update(below)
        waiting += sum(below.values()) + unplaced.hold_for_types(options, held)
        new_bins = tuple(b for b in new_bins if b.type_name not in held)
        freed = budget - sum(b.count for b in new_bins)
        if unplaced.left and freed > 0:
            new_bins += tuple(unplaced.pack_new(options, freed))
    return new_bins, waiting


def _tier_bins(
    facts: Facts, tier: Bucket, capacity: Mapping[str, Vec]
) -> tuple[dict[str, Member], list[Bin]]:
    """The bins one tier offers and the member owning each bin key."""
    members = facts.cluster.bucket(tier)
    if tier != Bucket.ACTIVE:
        owner = {m.key: m for m in members}
        return owner, [
            (m.key, m.type_name, capacity[m.type_name]) for m in members if m.type_name in capacity
        ]
    # A machine EC2 recommends rebalancing takes no new work (interrupt.py): it offers no room.
    owner = {w.address: m for m in members if not m.cordoned and not rebalancing(m) for w in m.workers}
    bins = [(a, m.type_name, facts.demand.free[a]) for a, m in owner.items()]
    for m in members:  # activated or restarted nodes whose worker is starting: in-flight capacity
        if not m.workers and m.type_name in capacity and _worker_expected(facts, m):
            owner[m.key] = m
            bins.append((m.key, m.type_name, capacity[m.type_name]))
    return owner, bins


def _unowned_bins(facts: Facts) -> tuple[dict[str, Member], list[Bin]]:
    """Free room on workers of nodes the daemon does not own (a static base, a manager's worker) comes
    right after its own active workers: dask sends them work as it does to ours, and they cost nothing
    more. Before, such room was ignored and the daemon launched beside it. Only their room is used:
    they are never marked, cordoned, drained or retired (not ours), and the members are not counted as
    having received work (no mark of ours is written on their nodes). Their type is their node's
    `instance-type` label, if any, for pinned tasks."""
    owner = {
        w.address: m
        for m in (*facts.cluster.unowned, *facts.cluster.manager)
        if m.node is not None
        and m.node.status == NodeStatus.READY
        and m.node.availability == Availability.ACTIVE
        for w in m.workers
        if not w.retiring and w.address in facts.demand.free
    }
    return owner, [(a, m.type_name, facts.demand.free[a]) for a, m in owner.items()]


def _cordoned_bins(facts: Facts) -> tuple[dict[str, Member], list[Bin]]:
    """Free room on cordoned workers comes right after active workers: they are up and paid for."""
    # (nor does a machine cordoned for its drift or expiry roll: drift.py)
    owner = {
        w.address: m
        for m in facts.cluster.active
        if m.cordoned and not rebalancing(m) and staying(m, facts.policy, facts.now)
        for w in m.workers
    }
    return owner, [(a, m.type_name, facts.demand.free[a]) for a, m in owner.items()]


def _worker_expected(facts: Facts, member: Member) -> bool:
    """An active node without a worker counts as capacity while its worker may still start."""
    since = member.node.marks.empty_since if member.node is not None else None
    return since is None or facts.now - since < facts.policy.max_start_time


def _activations(
    members: list[Member], received: Mapping[str, int]
) -> tuple[tuple[ActivateNode, ...], tuple[Mark, ...]]:
    actions, marks = [], []
    for member in members:
        node = member.node
        assert node is not None
        why = f"{received[member.key]} pending task(s) fit on this drained node"
        actions.append(ActivateNode(node.id, node.hostname, why))
        marks.append(mark(node.id, "reactivated for pending work", drained_since=None, empty_since=None))
    return tuple(actions), tuple(marks)


def uncordon_action(member: Member, reason: str) -> Uncordon:
    node = member.node
    assert node is not None
    return Uncordon(node.id, node.hostname, tuple(w.address for w in member.workers), reason)
