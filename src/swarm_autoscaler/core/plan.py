"""plan(snapshot, policy) -> Plan: the only decision maker. Pure and deterministic.

No clock (only `snapshot.now`), no randomness, no I/O, no logging; the inputs are never mutated, and the
same snapshot always gives an equal Plan. The recipe:

1. classify the machines into buckets (cluster.py) and estimate the pending work (demand.py):
   unrunnable tasks plus each worker's estimated queue; a queued task dask's duration estimates say its
   worker starts within `tolerated_wait` (starts.py) may only take free room on active and cordoned
   workers;
2. set aside tasks no allowed type can ever run (`Plan.unplaceable`);
3. scale up: place pending tasks virtually on free capacity of active workers, then of cordoned
   workers (which get uncordoned), then drained and reserve nodes (which get activated), then joining nodes, then launched instances (in-flight capacity always
   counts, so a task never causes two launches), then new instances of the cheapest fitting type, within
   `max_instances`; top up to `min_instances`; when nothing is pending, launch what each type's reserve
   lacks (a reserve is only warm if the machines exist: they join, idle, and are drained into it);
4. repair, even while work is pending: terminate broken instances, remove nodes whose instance is gone
   or that stayed down past `node_down_timeout`, retry terminations that did not take;
5. scale down when no placeable task is pending, or when pending work cannot get capacity (at
   `max_instances`, or its types refused) so idle machines it cannot use must make room: retire idle workers and drain nodes that stayed
   empty for `drain_delay`, then terminate drained nodes beyond the reserve after `termination_delay`,
   never below `min_instances` and never a type launched in the same plan;
6. consolidate when nothing is pending (and no cordon is being undone): cordon under-used workers (no new tasks reach them) while
   others of their type have room for their tasks, so that they empty and step 5 drains them; a
   cordoned worker is uncordoned when pending work fits it or a task waits on it;
7. keep the lifecycle marks (node labels) up to date so the timing survives a restart; a mark stamped
   in the future (by a clock ahead of the cloud's) is restamped now (clockmarks.py).

A machine whose worker runs or queues a task, or holds unique data, is never drained, retired or
terminated. Actions come in the order they should run: marks, repairs, uncordons, activations,
launches, cordons, then scale-down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from swarm_autoscaler.core.clockmarks import future_marks
from swarm_autoscaler.core.cluster import Bucket, Cluster, Member, classify
from swarm_autoscaler.core.consolidate import choose_cordons
from swarm_autoscaler.core.demand import Demand, Group, estimate_demand
from swarm_autoscaler.core.launches import LaunchBook, useful
from swarm_autoscaler.core.model import (
    Action,
    ActivateNode,
    Cordon,
    DrainNode,
    LabelNode,
    MarkNode,
    NodeStatus,
    Plan,
    Policy,
    RemoveNode,
    RetireWorkers,
    Snapshot,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.placement import NewBins, Pool, TypeOption, rank_types, type_capacity
from swarm_autoscaler.core.vectors import Space, Vec

# Buckets that receive pending tasks, in order, and where their capacity comes from.
TIERS = (Bucket.ACTIVE, Bucket.DRAINED, Bucket.RESERVE, Bucket.JOINING, Bucket.LAUNCHED)
NEW = "new"
OWN_WORKER = "own-worker"  # queued tasks their busy worker is expected to start within tolerated_wait

# Buckets whose nodes get the labels their instance was launched with.
_LABELLED = (Bucket.JOINING, Bucket.ACTIVE, Bucket.RETIRING, Bucket.DRAINED, Bucket.RESERVE)
_MARK_ORDER = ("ready", "empty_since", "drained_since", "termination_started", "down_since", "cordoned_since")


def plan(snapshot: Snapshot, policy: Policy) -> Plan:
    """Decide one tick (see the module docstring for the rules)."""
    return _decide(snapshot, policy, None)[0]


@dataclass(frozen=True, slots=True)
class Trace:
    """How a plan placed the pending work, for tests and an explain view.

    `bins` maps each existing bin (worker address, or instance id of a drained, joining or launched
    machine) to its type and free capacity before placement; `placements` lists (bin key, group index,
    tasks) onto existing bins; `new` the fill patterns of new instances; vectors are in `space`.
    """

    groups: tuple[Group, ...]
    bins: Mapping[str, tuple[str, Vec]]
    placements: tuple[tuple[str, int, int], ...]
    new: tuple[NewBins, ...]
    capacity: Mapping[str, Vec]
    space: Space


def plan_traced(snapshot: Snapshot, policy: Policy) -> tuple[Plan, Trace]:
    """`plan()` plus the Trace of its placements (slower: records every placement)."""
    result, trace = _decide(snapshot, policy, [])
    assert trace is not None
    return result, trace


def _decide(
    snapshot: Snapshot, policy: Policy, ledger: list[tuple[str, int, int]] | None
) -> tuple[Plan, Trace | None]:
    cluster = classify(snapshot, policy)
    space, demand = estimate_demand(snapshot, policy)
    options = rank_types(snapshot, policy, space)
    pool = Pool(demand.groups, ledger)
    unplaceable = pool.drop_unplaceable(options, policy)
    launches = LaunchBook.of(snapshot, policy)
    planner = _Planner(snapshot, policy, cluster, demand, launches, tracing=ledger is not None)
    for node_id, ahead in future_marks(snapshot):  # first: any later decision on the node overrides it
        planner._mark(node_id, "mark stamped in the future (a clock ahead): delay restarts now", **ahead)
    nothing_pending = pool.left == 0
    capacity = type_capacity(snapshot, options, space)
    planner.scale_up(pool, options, capacity)
    planner.repair()
    planner.keep_marks()
    planner.label_nodes()
    if nothing_pending:
        planner.launches.fill_reserve(cluster, planner.received, options)
    # Idle machines are scaled down when nothing is pending, and also when pending work could not get
    # capacity (max_instances reached, or its types refused): placement put nothing on them, so they
    # cannot serve it, and keeping them would block the launches it needs forever.
    if nothing_pending or pool.left > 0:
        planner.scale_down()
    # Not while this plan undoes a cordon (a task waits on a cordoned worker): one change at a time.
    if nothing_pending and not planner.launches and not planner.uncordon and policy.consolidate_below > 0.0:
        planner.consolidate(capacity)
    result = Plan(
        actions=planner.actions(),
        unplaceable=unplaceable,
        pending=demand.pending,
        placed=tuple((name, n) for name, n in planner.placed.items() if n),
    )
    if ledger is None:
        return result, None
    new = tuple(planner.new_bins)
    return result, Trace(demand.groups, planner.bins, tuple(ledger), new, capacity, space)


@dataclass
class _Planner:
    """Collects the decisions of one plan. Local and mutable; never escapes `plan()`."""

    snapshot: Snapshot
    policy: Policy
    cluster: Cluster
    demand: Demand
    launches: LaunchBook
    placed: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)  # member key -> tasks placed on it
    marks: dict[str, dict[str, float | bool | None]] = field(default_factory=dict)
    why: dict[str, list[str]] = field(default_factory=dict)
    activate: list[ActivateNode] = field(default_factory=list)
    uncordon: list[Uncordon] = field(default_factory=list)
    cordon: list[Cordon] = field(default_factory=list)
    repairs: list[Action] = field(default_factory=list)
    shrink: list[Action] = field(default_factory=list)
    removed: set[str] = field(default_factory=set)  # node ids removed by this plan
    draining: set[str] = field(default_factory=set)  # member keys drained by this plan
    labelled: list[LabelNode] = field(default_factory=list)
    tracing: bool = False
    bins: dict[str, tuple[str, Vec]] = field(default_factory=dict)  # only when tracing
    new_bins: list[NewBins] = field(default_factory=list)

    @property
    def now(self) -> float:
        return self.snapshot.now

    # ------------------------------------------------------------------------------ scale up

    def scale_up(self, pool: Pool, options: tuple[TypeOption, ...], capacity: Mapping[str, Vec]) -> None:
        for tier in TIERS:
            if pool.left:
                self._fill_tier(pool, tier, capacity)
            if tier == Bucket.ACTIVE and pool.left:
                self._fill_cordoned(pool)
            if tier == Bucket.ACTIVE and (held := pool.hold_soon()):
                self.placed[OWN_WORKER] = held
        for bins in pool.pack_new(options, self.launches.left):
            self.new_bins.append(bins)
            self.launches.add(bins.type_name, bins.count, bins.count * bins.tasks_each)
            self.placed[NEW] = self.placed.get(NEW, 0) + bins.count * bins.tasks_each
        self.launches.top_up(self.cluster, options)

    def _fill_tier(self, pool: Pool, tier: Bucket, capacity: Mapping[str, Vec]) -> None:
        members = self.cluster.bucket(tier)
        if tier == Bucket.ACTIVE:
            owner = {w.address: m for m in members if not m.cordoned for w in m.workers}
            bins = [(a, m.type_name, self.demand.free[a]) for a, m in owner.items()]
            for m in members:  # activated or restarted nodes whose worker is starting: in-flight capacity
                if not m.workers and m.type_name in capacity and self._worker_expected(m):
                    owner[m.key] = m
                    bins.append((m.key, m.type_name, capacity[m.type_name]))
        else:
            owner = {m.key: m for m in members}
            bins = [(m.key, m.type_name, capacity[m.type_name]) for m in members if m.type_name in capacity]
        for member in self._place(pool, tier.value, owner, bins):
            if tier in (Bucket.DRAINED, Bucket.RESERVE):
                self._activate(member)

    def _fill_cordoned(self, pool: Pool) -> None:
        """Free room on cordoned workers comes next: they are up and paid for; the ones that receive
        tasks are uncordoned."""
        owner = {w.address: m for m in self.cluster.active if m.cordoned for w in m.workers}
        bins = [(a, m.type_name, self.demand.free[a]) for a, m in owner.items()]
        for member in self._place(pool, "cordoned", owner, bins):
            n = self.received[member.key]
            self._uncordon(member, f"{n} pending task(s) fit on this cordoned worker")

    def _place(
        self, pool: Pool, tier: str, owner: Mapping[str, Member], bins: list[tuple[str, str, Vec]]
    ) -> list[Member]:
        """Fill `bins` (key, type, free room) from the pool; count what each member received. Returns
        the members that received tasks, once each."""
        if self.tracing:
            self.bins.update((key, (type_name, free)) for key, type_name, free in bins)
        got = pool.fill(bins)
        self.placed[tier] = sum(got.values())
        members: dict[str, Member] = {}
        for key, n in got.items():
            member = owner[key]
            self.received[member.key] = self.received.get(member.key, 0) + n
            members[member.key] = member
        return list(members.values())

    def _uncordon(self, member: Member, reason: str) -> None:
        node = member.node
        assert node is not None
        self.uncordon.append(
            Uncordon(node.id, node.hostname, tuple(w.address for w in member.workers), reason)
        )

    def _worker_expected(self, member: Member) -> bool:
        """An active node without a worker counts as capacity while its worker may still start."""
        since = member.node.marks.empty_since if member.node is not None else None
        return since is None or self.now - since < self.policy.max_start_time

    def _activate(self, member: Member) -> None:
        node = member.node
        assert node is not None
        n = self.received[member.key]
        self.activate.append(
            ActivateNode(node.id, node.hostname, f"{n} pending task(s) fit on this drained node")
        )
        self._mark(node.id, "reactivated for pending work", drained_since=None, empty_since=None)

    # ------------------------------------------------------------------------------ repair

    def repair(self) -> None:
        """Broken instances, vanished or long-down nodes, and terminations that did not take."""
        broken = [m for m in self.cluster.broken if not m.busy]
        if broken:
            self._terminate(
                self.repairs,
                broken,
                f"broken: not up with a worker within {self.policy.max_start_time:g}s of launch",
            )
        for member in self.cluster.disconnected:
            self._repair_disconnected(member)
        stuck = [m for m in self.cluster.terminating if self._termination_stuck(m)]
        if stuck:
            self._terminate(self.repairs, stuck, "termination requested earlier did not take; asking again")

    def _repair_disconnected(self, member: Member) -> None:
        node = member.node
        assert node is not None
        if member.instance is None:
            if node.status != NodeStatus.READY and not member.busy:
                self.repairs.append(RemoveNode(node.id, node.hostname, "its instance is gone"))
                self.removed.add(node.id)
            return
        down_since = node.marks.down_since
        if down_since is None:
            self._mark(node.id, f"node is {node.status}", down_since=self.now)
        elif self.now - down_since >= self.policy.node_down_timeout and not member.busy:
            timeout = self.policy.node_down_timeout
            reason = f"node {node.status} for {self.now - down_since:g}s (node_down_timeout {timeout:g}s)"
            self.repairs.append(RemoveNode(node.id, node.hostname, reason))
            self.removed.add(node.id)
            if member.instance.alive:
                self.repairs.append(Terminate((member.instance.id,), reason))

    def _termination_stuck(self, member: Member) -> bool:
        inst, node = member.instance, member.node
        if inst is None or not inst.alive or node is None or member.busy:
            return False
        started = node.marks.termination_started
        return started is not None and self.now - started >= self.policy.termination_delay

    def _terminate(self, into: list[Action], members: list[Member], reason: str) -> None:
        ids = tuple(m.key for m in members if m.instance is not None)
        nodes = tuple(m.node.id for m in members if m.node is not None and m.instance is not None)
        for member in members:
            if member.node is not None and member.node.marks.termination_started is None:
                self._mark(member.node.id, "terminating", termination_started=self.now)
        if ids:
            into.append(Terminate(ids, reason, nodes))

    # ------------------------------------------------------------------------------ marks

    def label_nodes(self) -> None:
        """A joined node gets the labels its instance was launched with (swarm placement constraints
        and the daemon's own recognition of its nodes rely on them)."""
        for member in (m for b in _LABELLED for m in self.cluster.bucket(b)):
            inst, node = member.instance, member.node
            if inst is None or node is None or not inst.labels or node.is_manager:
                continue
            missing = tuple(sorted((k, v) for k, v in inst.labels.items() if node.labels.get(k) != v))
            if missing:
                reason = "labels its instance was launched with"
                self.labelled.append(LabelNode(node.id, node.hostname, missing, reason))

    def keep_marks(self) -> None:
        """ready / empty_since / drained_since / down_since bookkeeping for every owned node."""
        for member in self.cluster.active:
            self._keep_active_marks(member)
        for member in (*self.cluster.drained, *self.cluster.reserve):
            node = member.node
            if node is not None and node.marks.drained_since is None and member.key not in self.received:
                self._mark(node.id, "seen drained", drained_since=self.now)
        for member in (*self.cluster.active, *self.cluster.retiring, *self.cluster.joining):
            node = member.node
            if node is not None and node.status == NodeStatus.READY and node.marks.down_since is not None:
                self._mark(node.id, "node is ready again", down_since=None)
        for member in self.cluster.active:
            self._keep_cordon(member)

    def _keep_cordon(self, member: Member) -> None:
        """A cordon mark whose worker takes tasks again (restarted, or uncordoned by someone else) is
        stale; a cordoned worker with tasks waiting on it is uncordoned, or they would never start."""
        node = member.node
        assert node is not None
        if node.marks.cordoned_since is None:
            return
        if not member.cordoned:
            self._mark(node.id, "worker takes tasks again", cordoned_since=None)
            return
        waiting = sum(1 for w in member.workers for t in w.processing if not t.executing)
        if waiting and not any(u.node_id == node.id for u in self.uncordon):
            self._uncordon(member, f"{waiting} task(s) wait on this cordoned worker")

    def _keep_active_marks(self, member: Member) -> None:
        node = member.node
        assert node is not None
        if member.workers and not node.marks.ready:
            self._mark(node.id, "joined with a connected worker", ready=True)
        idle = not member.busy and member.key not in self.received
        if idle and node.marks.empty_since is None:
            self._mark(node.id, "worker idle" if member.workers else "no worker", empty_since=self.now)
        elif not idle and node.marks.empty_since is not None:
            self._mark(node.id, "has work again", empty_since=None)
        if node.marks.drained_since is not None:
            self._mark(node.id, "active again", drained_since=None)

    def _mark(self, node_id: str, why: str, **changes: float | bool | None) -> None:
        self.marks.setdefault(node_id, {}).update(changes)
        self.why.setdefault(node_id, []).append(why)

    def _mark_actions(self) -> list[MarkNode]:
        current = {n.id: n.marks for n in self.snapshot.nodes}
        out = []
        for node_id in sorted(self.marks):
            if node_id in self.removed:
                continue
            changes = self.marks[node_id]
            real = tuple(
                (name, changes[name])
                for name in _MARK_ORDER
                if name in changes and getattr(current[node_id], name) != changes[name]
            )
            if real:
                out.append(MarkNode(node_id, real, "; ".join(dict.fromkeys(self.why[node_id]))))
        return out

    # ------------------------------------------------------------------------------ scale down

    def scale_down(self) -> None:
        """Retire and drain nodes empty for drain_delay; terminate drained nodes beyond the reserve."""
        retire: list[str] = []
        for member in self.cluster.active:
            node = member.node
            assert node is not None
            since = node.marks.empty_since
            if member.busy or member.key in self.received or since is None:
                continue
            if self.now - since < self.policy.drain_delay:
                continue
            retire.extend(w.address for w in member.workers)
            self.draining.add(member.key)
            reason = f"empty for {self.now - since:.0f}s (drain_delay {self.policy.drain_delay:g}s)"
            self.shrink.append(DrainNode(node.id, node.hostname, reason))
            self._mark(node.id, "drained", drained_since=self.now, empty_since=None, cordoned_since=None)
        if retire:
            reason = f"idle for at least drain_delay={self.policy.drain_delay:g}s"
            self.shrink.insert(0, RetireWorkers(tuple(retire), reason))
        self._terminate_beyond_reserve()

    def _terminate_beyond_reserve(self) -> None:
        # The reserve comes on top of min_instances.
        live = useful(self.cluster) + self.launches.total - len(self.cluster.reserve)
        chosen: list[Member] = []
        for member in self.cluster.drained:
            node = member.node
            assert node is not None
            since = node.marks.drained_since
            if live <= self.policy.min_instances:
                break
            if member.busy or member.key in self.received or since is None:
                continue
            if self.now - since < self.policy.termination_delay:
                continue
            if member.type_name in self.launches:  # never launch and terminate the same type
                continue
            chosen.append(member)
            live -= 1
        if chosen:
            reason = (
                f"drained for at least termination_delay={self.policy.termination_delay:g}s, "
                "beyond the reserve"
            )
            self._terminate(self.shrink, chosen, reason)

    # ------------------------------------------------------------------------------ consolidation

    def consolidate(self, capacity: Mapping[str, Vec]) -> None:
        """Cordon under-used workers while nothing is pending (see consolidate.py)."""
        candidates = [
            m
            for m in self.cluster.active
            if m.workers and not m.cordoned and m.key not in self.received and m.key not in self.draining
        ]
        threshold = self.policy.consolidate_below
        self.cordon.extend(choose_cordons(candidates, self.demand.free, capacity, threshold))

    # ------------------------------------------------------------------------------ output

    def actions(self) -> tuple[Action, ...]:
        return (
            *self._mark_actions(),
            *self.labelled,
            *self.repairs,
            *self.uncordon,
            *self.activate,
            *self.launches.actions(),
            *self.cordon,
            *self.shrink,
        )
