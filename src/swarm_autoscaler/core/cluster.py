"""classify(snapshot, policy) -> Fleet: every owned machine and every swarm node in one named bucket.

A *member* is one machine as the daemon sees it: an owned EC2 instance, the swarm node with the same
hostname (if it joined) and the dask workers on that node (matched by hostname). Nodes that match no
owned instance are members too (instance None), so that nothing observed is silently dropped.
A node matched by hostname to an owned instance belongs to that member even before it carries the
ownership label: the planner gives it the label (a NodeUpdate), and every disruptive action on a node
expects `NodeOurs`, so `act` touches it only once the label is there.

Lifecycle of a machine (the buckets, in the order a healthy machine passes through them)::

    new ─Launch─► launched ──node joins──► joining ──worker connects──► active ─RetireWorkers─► retiring
                     │                        │                          │  ▲                     │
                     └──── max_start_time ────┴──────► broken            │  └── ActivateNode ──┐  │
                                                          │           DrainNode                │  │
                                                      Terminate          ▼                     │  ▼
                                                          ▼       drained / reserve ───────────┘ (drained)
                                                    terminating ◄─── Terminate (beyond reserve)
                                                          │
                                                          ▼
                                                        gone   ◄── RemoveNode ── disconnected

Warm pool (core/pool.py): ``new ─Launch(pool)─► preparing ──stops itself──► stopped ─Start─► starting
──node joins──► joining / active``, and ``drained ─Stop─► stopped`` (scale-down into a short pool).
`preparing` is a pool machine booting for the first time (it runs its boot script and stops itself,
without joining); `stopped` a stopped (or stopping) machine within its type's `warm_pool`; `starting` a
machine started from the pool that has not joined yet.

`disconnected` is a node that went down (or whose instance vanished); it comes back to where it was
when the node is ready again, or is removed after `node_down_timeout`. `manager` and `unowned` nodes
are observed and never touched. An owned instance whose node is a manager is put in `manager` too:
the daemon never scales a manager.

Classification rules, first match wins (age = now - instance.launched_at). A terminated instance (EC2
lists them for about an hour) is considered only while a swarm node with its hostname exists and no live
instance has that hostname: its node, if it joined as the machine was terminated, is then ours and is
removed once down (rule 4); otherwise it is left out.

1. node is a manager                                   -> manager
2. no owned instance with the node's hostname          -> disconnected if the node is ours (`Node.ours`:
   it carries this cluster's namespaced ownership label), else unowned. The plain `instance-type`
   label and the lifecycle marks prove nothing: a node without the ownership label that matches no
   owned instance is never touched, even when it goes down. With `Policy.adopt_by_address` a node
   matches an instance only when its swarm address is the instance's private IP: one that only took
   the instance's hostname is classified by this rule (and so never adopted); with
   `Policy.adopt_by_identity` (join tickets on) only when a manager labelled it with the instance's id
   (`IDENTITY_LABEL`, written when the machine confirms its node id on the join desk) or it is ours
   already
2b. instance alive with an interruption notice
   (`interrupted_at`, see core/interrupt.py), or with
   a rebalance recommendation (`rebalance_at`) and
   nothing on its workers                              -> interrupted (a busy one goes on by the rules
   below: the recommendation is advice, interrupt.py)
3. instance stopped, or stopping with a pool for its
   type (its node not marked `termination_started`)    -> stopped for the first `warm_pool` of its type
   (newest instance first, then id); beyond that -> broken ("stopped outside the warm pool")
3b. instance launched into the pool (pool phase
   prepare), alive                                     -> preparing if age < max_start_time, else broken
3c. instance started from the pool (pool phase start),
   alive, no node or one not ready and never accepted  -> starting if age < max_start_time, else broken
4. instance not alive, or the node carries
   a `termination_started` mark                        -> terminating
5. no node yet                                         -> launched if age < max_start_time, else broken
6. node status not ready: accepted before (`ready`
   mark)                                               -> disconnected; never accepted -> rule 9
6b. with `Policy.join_paused` (the dynamic mode: machines join paused), availability pause and no
   `ready` mark                                        -> joining, whatever its age: the planner takes
   it in (`marks.accept_joined`: its labels, then active on a fresh read). A machine with no node is
   never active, so one planned broken that joins before its termination lands takes no task
7. availability drain or pause                         -> drained; per type, the first `reserve` of them
   (newest instance first, then instance id) are reserve
8. a worker is retiring (and the node carries no
   `cordoned_since` mark: a cordoned worker is active) -> retiring
9. a worker is connected, or the node was accepted
   before (`ready` mark: its worker was retired or is
   restarting; the planner drains it once it stayed
   empty for `drain_delay`)                            -> active
10. otherwise (node present, no worker yet)            -> joining if age < max_start_time, else broken

Why one file of this size: the buckets, their transition table and the classification rules are one
state machine, read together; splitting them would put the table away from the rules it draws.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.model import (
    Availability,
    Instance,
    InstanceState,
    InstanceType,
    Node,
    NodeStatus,
    Policy,
    PoolPhase,
    Snapshot,
    Worker,
)

# The node label that names a machine's instance type: for placement constraints, and the type of a node
# whose instance is no longer listed. It proves no ownership (users set it too): see `Node.ours`.
TYPE_LABEL = "instance-type"
# The node label naming the instance whose machine confirmed that node from its own address with its join
# ticket (daemon/join.py writes it; only managers write node labels): `Policy.adopt_by_identity`.
IDENTITY_LABEL = "swarm-autoscaler.instance-id"


class Bucket(enum.StrEnum):
    """Where a member is in its lifecycle. NEW and GONE are pseudo-buckets for the transition table:
    no observed member is ever in them."""

    NEW = "new"
    LAUNCHED = "launched"
    JOINING = "joining"
    ACTIVE = "active"
    RETIRING = "retiring"
    DRAINED = "drained"
    RESERVE = "reserve"
    TERMINATING = "terminating"
    DISCONNECTED = "disconnected"
    BROKEN = "broken"
    MANAGER = "manager"
    UNOWNED = "unowned"
    PREPARING = "preparing"
    STOPPED = "stopped"
    STARTING = "starting"
    INTERRUPTED = "interrupted"
    GONE = "gone"


# The ONE table of allowed transitions between two ticks (staying in the same bucket is always allowed).
# Each entry says which action or outside event causes it; tests/core checks that every transition the
# planner's actions cause is listed here.
_TERMINAL = frozenset({Bucket.TERMINATING, Bucket.GONE})
_NODE_STATES = frozenset({Bucket.ACTIVE, Bucket.DRAINED, Bucket.RESERVE, Bucket.RETIRING})
_POOL_OUT = frozenset({Bucket.STOPPED, Bucket.BROKEN})  # Stop into the pool / stopped outside it
# EC2 gives notice it takes a live machine back (interrupted), from any bucket of a live machine.
_NOTICE = frozenset({Bucket.INTERRUPTED})
_TRANSITIONS: Mapping[Bucket, frozenset[Bucket]] = {
    # Launch creates an instance; EC2 lists it as pending/running (preparing: launched into the pool).
    Bucket.NEW: frozenset({Bucket.LAUNCHED, Bucket.PREPARING}),
    # The machine stops itself once prepared (stopped; broken beyond a pool that shrank meanwhile); the
    # start time passes (broken); Terminate.
    Bucket.PREPARING: _POOL_OUT | _TERMINAL,
    # Start (starting; joining or active at once when it boots within a tick); the pool shrinks (broken:
    # stopped outside it); Terminate.
    Bucket.STOPPED: frozenset({Bucket.STARTING, Bucket.JOINING, Bucket.ACTIVE, Bucket.BROKEN}) | _TERMINAL,
    # As launched; EC2 gives up the start and stops it again (stopped).
    Bucket.STARTING: frozenset({Bucket.JOINING, Bucket.ACTIVE, Bucket.BROKEN, Bucket.STOPPED})
    | {Bucket.DRAINED, Bucket.RESERVE}
    | _TERMINAL,
    # The node joins (joining, or active at once when the worker is already up); the start time passes
    # (broken); an operator drains the fresh node (drained/reserve); Terminate.
    Bucket.LAUNCHED: frozenset({Bucket.JOINING, Bucket.ACTIVE, Bucket.BROKEN})
    | {Bucket.DRAINED, Bucket.RESERVE}
    | _TERMINAL,
    # The worker connects (active); the start time passes (broken); drained by an operator; Terminate.
    Bucket.JOINING: frozenset({Bucket.ACTIVE, Bucket.BROKEN, Bucket.DRAINED, Bucket.RESERVE})
    | _TERMINAL
    | {Bucket.DISCONNECTED},
    # RetireWorkers (retiring); DrainNode (drained/reserve); node down (disconnected); Terminate.
    Bucket.ACTIVE: _NODE_STATES | {Bucket.DISCONNECTED} | _TERMINAL,
    # The retired worker leaves (active, then drained); DrainNode; node down; Terminate.
    Bucket.RETIRING: _NODE_STATES | {Bucket.DISCONNECTED} | _TERMINAL,
    # ActivateNode (active, or joining/broken for a node never accepted); the reserve moves between
    # drained nodes (drained <-> reserve); node down; Terminate beyond the reserve; Stop into the pool.
    Bucket.DRAINED: _NODE_STATES
    | {Bucket.JOINING, Bucket.BROKEN, Bucket.DISCONNECTED}
    | _TERMINAL
    | _POOL_OUT,
    Bucket.RESERVE: _NODE_STATES
    | {Bucket.JOINING, Bucket.BROKEN, Bucket.DISCONNECTED}
    | _TERMINAL
    | _POOL_OUT,
    # The node comes back (its previous bucket); RemoveNode / Terminate after node_down_timeout.
    Bucket.DISCONNECTED: _NODE_STATES | {Bucket.JOINING, Bucket.BROKEN} | _TERMINAL,
    # A late worker finally connects (active), or a late node joins paused (joining: join_paused);
    # Terminate.
    Bucket.BROKEN: frozenset({Bucket.ACTIVE, Bucket.JOINING}) | _TERMINAL,
    # EC2 finishes terminating (gone); the instance vanishes first while its node lingers
    # (disconnected, then RemoveNode); a stale terminating mark on a node that serves work is cleared
    # (active: no termination went out, shrink._ask_again); a machine stopped (not by the pool) while
    # its termination began has its down node removed, and is then stopped outside the pool (broken:
    # terminated on the next plan).
    Bucket.TERMINATING: frozenset({Bucket.GONE, Bucket.DISCONNECTED, Bucket.ACTIVE, Bucket.BROKEN}),
    # Never touched by the planner; an operator may remove them.
    Bucket.MANAGER: frozenset({Bucket.GONE}),
    Bucket.UNOWNED: frozenset({Bucket.GONE}),
    # Retire, drain, Terminate (terminating once EC2 shuts it down); EC2 takes it (gone, or its node
    # lingers: disconnected).
    Bucket.INTERRUPTED: frozenset({Bucket.DISCONNECTED}) | _TERMINAL,
    Bucket.GONE: frozenset(),
}
_LIVE = frozenset(
    {
        Bucket.LAUNCHED,
        Bucket.JOINING,
        Bucket.ACTIVE,
        Bucket.RETIRING,
        Bucket.DRAINED,
        Bucket.RESERVE,
        Bucket.DISCONNECTED,
        Bucket.BROKEN,
        Bucket.PREPARING,
        Bucket.STARTING,
        Bucket.STOPPED,  # started from the pool and given notice within one tick
    }
)
TRANSITIONS: Mapping[Bucket, frozenset[Bucket]] = {
    b: targets | (_NOTICE if b in _LIVE else frozenset()) for b, targets in _TRANSITIONS.items()
}


def allowed(before: Bucket, after: Bucket) -> bool:
    """True when a member may move from `before` to `after` between two ticks."""
    return before == after or after in TRANSITIONS[before]


@dataclass(frozen=True, slots=True)
class Member:
    """One machine: its owned instance, its swarm node and the workers on that node (any may be missing:
    a member always has an instance or a node). `itype` is the catalogue entry of the instance's type."""

    instance: Instance | None
    node: Node | None
    workers: tuple[Worker, ...] = ()
    itype: InstanceType | None = None

    @property
    def key(self) -> str:
        """The instance id, or the node id for a node without an owned instance."""
        if self.instance is not None:
            return self.instance.id
        assert self.node is not None
        return self.node.id

    @property
    def hostname(self) -> str:
        return self.instance.hostname if self.instance is not None else self.node.hostname  # type: ignore[union-attr]

    @property
    def type_name(self) -> str:
        """The instance's type; for a node without an owned instance, its type label (or "")."""
        if self.instance is not None:
            return self.instance.type_name
        return self.node.labels.get(TYPE_LABEL, "") if self.node is not None else ""

    @property
    def busy(self) -> bool:
        """A worker on it runs or queues a task, or holds data no other worker has."""
        return any(w.busy for w in self.workers)

    @property
    def working(self) -> bool:
        """A worker on it runs or queues a task (results it holds do not count: see `Worker.holding`)."""
        return any(w.processing for w in self.workers)

    @property
    def cordoned(self) -> bool:
        """The daemon cordoned its worker: the node is marked and the worker takes no new tasks."""
        marked = self.node is not None and self.node.marks.cordoned_since is not None
        return marked and any(w.retiring for w in self.workers)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The buckets of one snapshot. Every owned instance and every node is in exactly one bucket."""

    launched: tuple[Member, ...] = ()
    joining: tuple[Member, ...] = ()
    active: tuple[Member, ...] = ()
    retiring: tuple[Member, ...] = ()
    drained: tuple[Member, ...] = ()
    reserve: tuple[Member, ...] = ()
    terminating: tuple[Member, ...] = ()
    disconnected: tuple[Member, ...] = ()
    broken: tuple[Member, ...] = ()
    manager: tuple[Member, ...] = ()
    unowned: tuple[Member, ...] = ()
    preparing: tuple[Member, ...] = ()
    stopped: tuple[Member, ...] = ()
    starting: tuple[Member, ...] = ()
    interrupted: tuple[Member, ...] = ()

    def bucket(self, name: Bucket) -> tuple[Member, ...]:
        members: tuple[Member, ...] = getattr(self, name.value)
        return members

    def counts(self) -> dict[str, int]:
        """Bucket name -> number of members, for every observed bucket (zeros included)."""
        return {b.value: len(self.bucket(b)) for b in OBSERVED}

    def counts_by_type(self) -> dict[tuple[str, str], int]:
        """(bucket name, instance type) -> number of members, for non-empty buckets only. Members
        whose type is not known count under "unknown"."""
        out: dict[tuple[str, str], int] = {}
        for b in OBSERVED:
            for member in self.bucket(b):
                key = (b.value, member.type_name or "unknown")
                out[key] = out.get(key, 0) + 1
        return out

    def bucket_of(self) -> dict[str, Bucket]:
        """Member key -> its bucket."""
        return {m.key: b for b in OBSERVED for m in self.bucket(b)}


OBSERVED: tuple[Bucket, ...] = tuple(b for b in Bucket if b not in (Bucket.NEW, Bucket.GONE))


def classify(snapshot: Snapshot, policy: Policy) -> Fleet:
    """Put every owned instance and every node of `snapshot` in one bucket (rules in the module doc)."""
    types = {t.name: t for t in snapshot.instance_types}
    workers: dict[str, list[Worker]] = defaultdict(list)
    for worker in snapshot.workers:
        workers[worker.hostname].append(worker)
    nodes: dict[str, list[Node]] = defaultdict(list)
    for node in snapshot.nodes:
        nodes[node.hostname].append(node)
    out: dict[Bucket, list[Member]] = {b: [] for b in OBSERVED}
    owned_hosts: set[str] = set()
    live_hosts = {i.hostname for i in snapshot.instances if i.state != InstanceState.TERMINATED}
    for inst in snapshot.instances:
        if inst.state == InstanceState.TERMINATED and (
            inst.hostname in live_hosts or inst.hostname not in nodes
        ):
            continue  # gone: it matters only while a node of its lingers (and a reused hostname is the new one's)
        owned_hosts.add(inst.hostname)
        candidates, impostors = _same_machine(inst, nodes.get(inst.hostname, ()), policy)
        for node in impostors:  # its hostname, another address: not this machine's node
            out[_orphan_bucket(node)].append(Member(None, node))
        picked, extra = _pick_node(candidates)
        member = Member(inst, picked, tuple(workers.get(inst.hostname, ())), types.get(inst.type_name))
        out[_instance_bucket(member, snapshot.now, policy)].append(member)
        for stale in extra:  # an older entry of a node that left and joined again
            bucket = Bucket.DISCONNECTED if stale.status != NodeStatus.READY else Bucket.UNOWNED
            out[bucket].append(Member(None, stale))
    for node in snapshot.nodes:
        if node.hostname not in owned_hosts:
            out[_orphan_bucket(node)].append(Member(None, node, tuple(workers.get(node.hostname, ()))))
    reserve, drained = _split_reserve(out[Bucket.DRAINED], policy)
    out[Bucket.DRAINED], out[Bucket.RESERVE] = drained, reserve
    pooled, outside = _split_pool(out[Bucket.STOPPED], policy)
    out[Bucket.STOPPED] = pooled
    out[Bucket.BROKEN] += outside
    return Fleet(**{b.value: tuple(members) for b, members in out.items()})


def _same_machine(
    inst: Instance, candidates: Sequence[Node], policy: Policy
) -> tuple[Sequence[Node], list[Node]]:
    """(the nodes that may be `inst`'s, the others). By hostname alone, unless a check is on:
    `policy.adopt_by_identity`: only a node a manager labelled with the instance's id (its machine
    confirmed it on the join desk), or one already ours (adopted before), and never one labelled with
    another instance; `policy.adopt_by_address`: only a node whose swarm address (from its authenticated
    connection) is the instance's private IP, an address or IP not known matching nothing."""
    mine = list(candidates)
    if policy.adopt_by_identity:
        mine = [n for n in mine if confirmed_instance(n) == inst.id or (n.ours and not confirmed_instance(n))]
    if policy.adopt_by_address:
        mine = [n for n in mine if inst.private_ip and n.address == inst.private_ip]
    if len(mine) == len(candidates):
        return candidates, []
    return mine, [n for n in candidates if n not in mine]


def confirmed_instance(node: Node) -> str:
    """The instance id a manager labelled `node` with (`IDENTITY_LABEL`; "": none)."""
    return node.labels.get(IDENTITY_LABEL, "")


def _pick_node(candidates: Sequence[Node]) -> tuple[Node | None, list[Node]]:
    """The node entry an instance is matched to (a ready one first), and any other entries."""
    if len(candidates) <= 1:  # the common case
        return (candidates[0] if candidates else None), []
    ordered = sorted(candidates, key=lambda n: (n.status != NodeStatus.READY, n.id))
    return ordered[0], ordered[1:]


def _orphan_bucket(node: Node) -> Bucket:
    if node.is_manager:
        return Bucket.MANAGER
    if node.ours:
        return Bucket.DISCONNECTED
    return Bucket.UNOWNED


def _instance_bucket(member: Member, now: float, policy: Policy) -> Bucket:
    inst, node = member.instance, member.node
    assert inst is not None
    young = now - inst.launched_at < policy.max_start_time
    if node is not None and node.is_manager:
        return Bucket.MANAGER
    if inst.alive and (
        inst.interrupted_at is not None or (inst.rebalance_at is not None and not member.busy)
    ):
        return Bucket.INTERRUPTED  # until EC2 lists it as shutting down (core/interrupt.py)
    ending = node is not None and node.marks.termination_started is not None
    if _stopped_for_pool(inst, policy) and not ending:
        return Bucket.STOPPED  # within the pool, or broken beyond it (`_split_pool`)
    if inst.alive and inst.pool == PoolPhase.PREPARE:
        return Bucket.PREPARING if young else Bucket.BROKEN
    if inst.alive and inst.pool == PoolPhase.START and (node is None or _never_accepted(node)):
        return Bucket.STARTING if young else Bucket.BROKEN
    if not inst.alive or ending:
        return Bucket.TERMINATING
    joined = _joined_bucket(member, node, policy) if node is not None else None
    if joined is not None:
        return joined
    if node is None:
        return Bucket.LAUNCHED if young else Bucket.BROKEN
    return Bucket.JOINING if young else Bucket.BROKEN


def _stopped_for_pool(inst: Instance, policy: Policy) -> bool:
    """Stopped, or stopping into a pool (a stopping machine of a type without a pool is terminating)."""
    if inst.state == InstanceState.STOPPED:
        return True
    tp = policy.type_policy(inst.type_name)
    return inst.state == InstanceState.STOPPING and tp is not None and tp.warm_pool > 0


def _never_accepted(node: Node) -> bool:
    return node.status != NodeStatus.READY and not node.marks.ready


def _joined_paused(node: Node) -> bool:
    """A node that joined paused and that the daemon has not taken in yet (`Policy.join_paused`)."""
    return node.availability == Availability.PAUSE and not node.marks.ready


def _joined_bucket(member: Member, node: Node, policy: Policy) -> Bucket | None:
    """The bucket of a live machine whose node joined, or None while it is still joining."""
    if node.status != NodeStatus.READY:
        return Bucket.DISCONNECTED if node.marks.ready else None
    if policy.join_paused and _joined_paused(node):
        return Bucket.JOINING  # up, waiting to be taken in (`marks.accept_joined`), whatever its age
    if node.availability != Availability.ACTIVE:
        return Bucket.DRAINED
    if node.marks.cordoned_since is None and any(w.retiring for w in member.workers):
        return Bucket.RETIRING
    if member.workers or node.marks.ready:
        return Bucket.ACTIVE
    return None


def _split_reserve(drained: list[Member], policy: Policy) -> tuple[list[Member], list[Member]]:
    """(reserve, drained beyond the reserve): per type, the newest `reserve` drained machines are kept."""
    ordered = sorted(drained, key=lambda m: (-m.instance.launched_at, m.key) if m.instance else (0.0, m.key))
    wanted = {tp.name: tp.reserve for tp in policy.allowed_types}
    kept: dict[str, int] = defaultdict(int)
    reserve: list[Member] = []
    beyond: list[Member] = []
    for member in ordered:
        if kept[member.type_name] < wanted.get(member.type_name, 0) and not member.busy:
            kept[member.type_name] += 1
            reserve.append(member)
        else:
            beyond.append(member)
    return reserve, beyond


def _split_pool(stopped: list[Member], policy: Policy) -> tuple[list[Member], list[Member]]:
    """(in the pool, outside it): per type, the newest `warm_pool` stopped or stopping machines are
    its pool; any other stopped machine of ours is useless, and broken."""
    ordered = sorted(stopped, key=lambda m: (-m.instance.launched_at, m.key) if m.instance else (0.0, m.key))
    wanted = {tp.name: tp.warm_pool for tp in policy.allowed_types}
    kept: dict[str, int] = defaultdict(int)
    pooled: list[Member] = []
    outside: list[Member] = []
    for member in ordered:
        if kept[member.type_name] < wanted.get(member.type_name, 0):
            kept[member.type_name] += 1
            pooled.append(member)
        else:
            outside.append(member)
    return pooled, outside


def broken_reason(member: Member, policy: Policy) -> str:
    """Why a broken member is terminated (the Terminate's reason)."""
    inst = member.instance
    limit = f"{policy.max_start_time:g}s"
    if inst is not None and inst.state in (InstanceState.STOPPED, InstanceState.STOPPING):
        return f"stopped outside the warm pool of {inst.type_name}: a stopped machine of ours is useless"
    if inst is not None and inst.pool == PoolPhase.PREPARE:
        return f"broken: launched into the warm pool but not stopped after preparing within {limit}"
    if inst is not None and inst.pool == PoolPhase.START:
        return f"broken: started from the warm pool but not up with a worker within {limit} of the start"
    return f"broken: not up with a worker within {limit} of launch"
