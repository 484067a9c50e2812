"""Bookkeeping steps: the lifecycle marks kept in node labels, stale cordons, and the labels a joined
node gets from its instance. Pure; each returns what it decided (see steps.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from swarm_autoscaler.core.actions import ActivateNode, NodeOurs, NodePaused, Uncordon
from swarm_autoscaler.core.cluster import IDENTITY_LABEL, Bucket, Fleet, Member
from swarm_autoscaler.core.model import Availability, NodeStatus
from swarm_autoscaler.core.scaleup import uncordon_action
from swarm_autoscaler.core.steps import Facts, Mark, mark
from swarm_autoscaler.core.updates import Labels

# Buckets whose nodes get the labels their instance was launched with. Among them is the ownership
# label: every node matched by hostname to an owned instance gets it, whatever its state, so that the
# node of a machine terminated right after it joined is still recognised as ours once its instance
# is no longer listed (and is then removed). The interrupted bucket is among them: a machine given notice
# before its node joined is drained and terminated only once that node is ours (`NodeOurs`).
_LABELLED = (
    Bucket.JOINING,
    Bucket.ACTIVE,
    Bucket.RETIRING,
    Bucket.DRAINED,
    Bucket.RESERVE,
    Bucket.BROKEN,
    Bucket.TERMINATING,
    Bucket.DISCONNECTED,
    Bucket.INTERRUPTED,
)


def keep_marks(facts: Facts, received: Mapping[str, int]) -> tuple[Mark, ...]:
    """ready / empty_since / drained_since / down_since bookkeeping for every owned node. `received`:
    member key -> tasks scale-up placed on it (such a member is not empty)."""
    cluster, now = facts.cluster, facts.now
    out: list[Mark] = []
    for member in cluster.active:
        out += _active_marks(member, member.key in received, now)
    for member in (*cluster.drained, *cluster.reserve):
        node = member.node
        if node is not None and node.marks.drained_since is None and member.key not in received:
            out.append(mark(node.id, "seen drained", drained_since=now))
    for member in (*cluster.active, *cluster.retiring, *cluster.joining):
        node = member.node
        if node is not None and node.status == NodeStatus.READY and node.marks.down_since is not None:
            out.append(mark(node.id, "node is ready again", down_since=None))
    return tuple(out)


def _active_marks(member: Member, received: bool, now: float) -> list[Mark]:
    node = member.node
    assert node is not None
    out = []
    if member.workers and not node.marks.ready:
        out.append(mark(node.id, "joined with a connected worker", ready=True))
    # A worker that only holds results is empty too: the drain retires it (its results moved first).
    idle = not member.working and not received
    if idle and node.marks.empty_since is None:
        why = "worker holds results only" if member.busy else "worker idle" if member.workers else "no worker"
        out.append(mark(node.id, why, empty_since=now))
    elif not idle and node.marks.empty_since is not None:
        out.append(mark(node.id, "has work again", empty_since=None))
    if node.marks.drained_since is not None:
        out.append(mark(node.id, "active again", drained_since=None))
    return out


# The reason of the Uncordon that sets a stray retiring worker running again (see `keep_cordons`).
STRAY_RETIREMENT = "retiring without a retirement in progress (one cut short): set running again"


def keep_cordons(
    cluster: Fleet, uncordoned: Collection[str], rolling: Collection[str] = ()
) -> tuple[tuple[Mark, ...], tuple[Uncordon, ...]]:
    """A cordon mark whose worker takes tasks again (restarted, or uncordoned by someone else) is
    stale; a cordoned worker with tasks waiting on it is uncordoned, or they would never start.
    `uncordoned`: node ids scale-up already uncordons.

    A member in the `retiring` bucket (a worker closing_gracefully, no cordon mark) is set running again
    (reason `STRAY_RETIREMENT`). act awaits every RetireWorkers it starts, so at the next plan none of
    ours is in flight, and a retirement act saw to its end has removed its worker or been refused (act
    sets a kept worker running). A member still retiring is then one of two kinds, which a snapshot
    cannot tell apart (both are closing_gracefully without a mark; dask's retirements in progress live
    in its scheduler's memory manager, which the Workload port does not report):
    - one whose RetireWorkers was cut short on our side (the tick's deadline, SIGTERM): dask's own
      `retire_workers` may still be running on the scheduler, and ends by itself, the worker removed
      or set back to the status it had when the retirement began;
    - one dask put back into closing_gracefully after an Uncordon: a cordoned worker whose cut-short
      retirement gave up restores the status it had then. Nothing else makes it leave the bucket: it
      would take no task and never be retired.
    Both are set running; the second needs it, and is retired again by a later plan once idle. The first
    is set running while dask may still be retiring it: setting it running does not stop dask's
    retirement, which still moves its unique data before removing it (no result is lost), but a task
    the scheduler gives it in between is rescheduled when it is removed, costing that task a retry.
    Waiting before setting it running would not remove that cost (no snapshot says when dask is done; a
    large data move outlasts any wait) and would keep the second kind idle longer."""
    marks: list[Mark] = []
    actions: list[Uncordon] = [
        uncordon_action(m, STRAY_RETIREMENT)
        for m in cluster.retiring
        if m.node is not None and m.workers and m.node.id not in uncordoned
    ]
    for member in cluster.active:
        node = member.node
        assert node is not None
        if node.marks.cordoned_since is None:
            continue
        if not member.cordoned:
            marks.append(mark(node.id, "worker takes tasks again", cordoned_since=None))
            continue
        waiting = sum(1 for w in member.workers for t in w.processing if not t.executing)
        rebalancing = member.instance is not None and member.instance.rebalance_at is not None
        # (advice, or a drift or expiry roll, `rolling`: it stays cordoned)
        if waiting and node.id not in uncordoned and not rebalancing and node.id not in rolling:
            actions.append(uncordon_action(member, f"{waiting} task(s) wait on this cordoned worker"))
    return tuple(marks), tuple(actions)


# The reason a node is given the labels its instance was launched with (see `label_nodes`).
LAUNCH_LABELS = "labels its instance was launched with"


def label_nodes(cluster: Fleet) -> tuple[Labels, ...]:
    """A joined node gets the labels its instance was launched with that it lacks (swarm placement
    constraints and the ownership label rely on them). Manager nodes are never labelled."""
    out = []
    for member in (m for b in _LABELLED for m in cluster.bucket(b)):
        inst, node = member.instance, member.node
        # (A manager matched to an owned instance is in the manager bucket, never listed above: the
        # is_manager test is a second line that no plan reaches today.)
        if inst is None or node is None or not inst.labels or node.is_manager:
            continue
        # (never the identity label: only the join desk writes it, for the machine that confirmed it)
        missing = tuple(
            sorted((k, v) for k, v in inst.labels.items() if node.labels.get(k) != v and k != IDENTITY_LABEL)
        )
        if missing:
            out.append(Labels(node.id, missing, LAUNCH_LABELS))
    return tuple(out)


# The reason of the ActivateNode that takes in a node that joined paused (see `accept_joined`).
TAKEN_IN = "joined paused; taken in: labelled ours, now active"


def accept_joined(cluster: Fleet, join_paused: bool) -> tuple[ActivateNode, ...]:
    """With `Policy.join_paused` (machines join the swarm paused), the nodes that joined and that the
    daemon has not taken in yet are set active: each one matched by hostname to one of our live
    instances (the joining bucket), ready, paused and without a `ready` mark. Its labels (the ownership
    label among them) come from `label_nodes` in the same plan and are written first; the activation is
    re-checked on a fresh read after them (`NodeOurs`: the ownership label is there; `NodePaused`: still
    paused, not taken in, no termination begun). Its `ready` mark follows once it is active
    (`keep_marks`). A machine planned as broken has no node at all in the plan, so whatever joins before
    its termination lands stays paused: swarm places no task there."""
    if not join_paused:
        return ()
    out = []
    for member in cluster.joining:
        node = member.node
        if member.instance is None or node is None or node.is_manager:
            continue
        if node.status != NodeStatus.READY or node.availability != Availability.PAUSE or node.marks.ready:
            continue
        out.append(ActivateNode(node.id, node.hostname, TAKEN_IN, (NodeOurs(node.id), NodePaused(node.id))))
    return tuple(out)
