"""The disruptive steps: repair (broken machines, gone or long-down nodes, terminations that did not
take) and scale-down (retire -> drain -> terminate beyond the reserve). Pure; each returns a Step.

Every disruptive action is single-target and states in `expect` what it was planned on (model's check
types), so that `act` can re-check it on a fresh read right before it runs:

- Terminate of a broken machine that never joined: NoWorker + NotJoined; that joined without a
  worker: NoWorker + NodeOurs (HostIdle instead of NoWorker when a worker is connected);
- Terminate of a drained machine beyond the reserve, or a re-asked termination: HostIdle + NodeOurs;
- Terminate of a machine whose node stayed down: HostIdle + NodeDown + NodeOurs;
- RemoveNode: HostIdle + NodeDown + NodeOurs;
- RetireWorkers (one per node): HostIdle, or NoTasks for a worker holding results only (dask's
  `retire_workers` moves them to a worker that stays first, and keeps the worker when it cannot);
- DrainNode: HostIdle + NodeOurs, and Retired when the plan retires its workers first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from swarm_autoscaler.core.actions import (
    Action,
    Check,
    DrainNode,
    HostIdle,
    NodeDown,
    NodeOurs,
    NoTasks,
    NotJoined,
    NoWorker,
    RemoveNode,
    Retired,
    RetireWorkers,
    Terminate,
)
from swarm_autoscaler.core.arrivals import idle_delays
from swarm_autoscaler.core.cluster import Member, broken_reason
from swarm_autoscaler.core.launches import reserve_expired, useful, useful_of
from swarm_autoscaler.core.model import Availability, NodeStatus
from swarm_autoscaler.core.pool import PoolRoom
from swarm_autoscaler.core.steps import Facts, Mark, Step, mark


def terminate(member: Member, reason: str, expect: tuple[Check, ...]) -> Step:
    """One Terminate of `member`'s instance (and the removal of its node, if it joined). Its node's
    `termination_started` mark rides in the Terminate (`core.updates`): act writes it only when the
    termination goes ahead, right before the cloud call, so that a restart does not count the machine
    as capacity, and a termination skipped on its re-check leaves no mark behind."""
    inst, node = member.instance, member.node
    assert inst is not None
    node_ids = (node.id,) if node is not None else ()
    return Step((Terminate((inst.id,), reason, node_ids, expect=expect),))


def _idle_and_ours(member: Member) -> tuple[Check, ...]:
    assert member.node is not None
    return (HostIdle(member.hostname), NodeOurs(member.node.id))


def _broken_checks(member: Member) -> tuple[Check, ...]:
    """A broken machine is planned as never having come up: no worker (or only idle ones) and, if it
    has no node, still not joined."""
    host = member.hostname
    work: Check = HostIdle(host) if member.workers else NoWorker(host)
    return (work, NotJoined(host) if member.node is None else NodeOurs(member.node.id))


def repair(facts: Facts, halted: bool = False) -> Step:
    """Broken instances, vanished, long-down or terminated machines' nodes, and terminations that did
    not take. Runs even while work is pending. `halted` (the safety stop, safety.py): a machine whose
    node stayed down is not terminated (its down mark is still kept), nor a broken one whose node is
    down (`_cut_off`)."""
    cluster, policy = facts.cluster, facts.policy
    steps = []
    steps += [
        terminate(m, broken_reason(m, policy), _broken_checks(m))
        for m in cluster.broken
        if not m.busy and not (halted and _cut_off(m))
    ]
    steps += [_repair_disconnected(facts, m, halted) for m in cluster.disconnected]
    steps += [_remove_terminated(m) for m in cluster.terminating]
    steps += [_ask_again(m) for m in cluster.terminating if _stuck(facts, m)]
    return Step(
        tuple(a for s in steps for a in s.actions),
        tuple(m for s in steps for m in s.marks),
        frozenset(n for s in steps for n in s.removed),
    )


def _cut_off(member: Member) -> bool:
    """A broken member a partition can fake: its instance runs and its node joined but is not ready.
    No worker reaches (or is seen on) a node its managers cannot reach, so "not up with a worker" says
    nothing about the machine while the node is down. One that never joined (no node), or whose node
    is ready, or that EC2 lists as stopped, is broken whatever the network does."""
    inst, node = member.instance, member.node
    return inst is not None and inst.alive and node is not None and node.status != NodeStatus.READY


def _remove(member: Member, reason: str) -> Step:
    node = member.node
    assert node is not None
    expect: tuple[Check, ...] = (HostIdle(member.hostname), NodeDown(node.id), NodeOurs(node.id))
    return Step((RemoveNode(node.id, node.hostname, reason, expect=expect),), removed=frozenset({node.id}))


def _repair_disconnected(facts: Facts, member: Member, halted: bool = False) -> Step:
    """A node whose instance is gone is removed once down; one down past `node_down_timeout` is
    removed with its instance (one Terminate, which removes the node too)."""
    node, inst, now = member.node, member.instance, facts.now
    assert node is not None
    if inst is None:
        down = node.status != NodeStatus.READY and not member.busy
        return _remove(member, "its instance is gone") if down else Step()
    down_since = node.marks.down_since
    if down_since is None:
        return Step(marks=(mark(node.id, f"node is {node.status}", down_since=now),))
    timeout = facts.policy.node_down_timeout
    if now - down_since < timeout or member.busy or halted:
        return Step()
    reason = f"node {node.status} for {now - down_since:g}s (node_down_timeout {timeout:g}s)"
    # (A disconnected member's instance is alive: one shutting down is in the terminating bucket.)
    expect: tuple[Check, ...] = (HostIdle(member.hostname), NodeDown(node.id), NodeOurs(node.id))
    return Step((Terminate((inst.id,), reason, (node.id,), expect=expect),), removed=frozenset({node.id}))


def _remove_terminated(member: Member) -> Step:
    """The node of an instance EC2 is shutting down is removed once it is down: it is recognised by its
    hostname (and labelled as ours by label_nodes), even if it joined after the termination was asked."""
    inst, node = member.instance, member.node
    if inst is None or inst.alive or node is None or node.status == NodeStatus.READY or member.busy:
        return Step()
    return _remove(member, f"its instance is {inst.state}")


# The reasons of a termination asked again, and of a stale terminating mark cleared (see `_ask_again`).
ASK_AGAIN = "termination requested earlier did not take; asking again"
STALE_TERMINATING = "marked terminating, but it serves work: no termination went out; mark cleared"


def _ask_again(member: Member) -> Step:
    """A machine marked terminating `termination_delay` ago that is still alive. act writes the mark
    only for a termination that went ahead, so this is one EC2 did not carry out, asked again on the
    checks of a first termination of a machine in its state: no worker connected since (or, with one,
    its host idle) and its node still ours. A node that is ready, active and has a connected worker
    serves work: its mark did not come from a termination that went out (a cut-short call, an older
    version that wrote the mark before the re-check), so the mark is cleared, never asked again, and
    the next plan decides from what the machine is."""
    node = member.node
    assert node is not None
    if node.status == NodeStatus.READY and node.availability == Availability.ACTIVE and member.workers:
        return Step(marks=(mark(node.id, STALE_TERMINATING, termination_started=None),))
    work: Check = HostIdle(member.hostname) if member.workers else NoWorker(member.hostname)
    return terminate(member, ASK_AGAIN, (work, NodeOurs(node.id)))


def _stuck(facts: Facts, member: Member) -> bool:
    inst, node = member.instance, member.node
    if inst is None or not inst.alive or node is None or member.busy:
        return False
    started = node.marks.termination_started
    return started is not None and facts.now - started >= facts.policy.termination_delay


def scale_down(
    facts: Facts,
    received: Mapping[str, int],
    launching: Collection[str],
    launched: int,
    cordoned_only: bool = False,
) -> Step:
    """Retire and drain nodes empty for `drain_delay`; terminate drained nodes beyond the reserve.
    `received`: members scale-up placed tasks on (never touched); `launching`: the types this plan
    launches (never terminated in the same plan); `launched`: how many instances it launches;
    `cordoned_only` (under load): only cordoned members are drained (they take no new task)."""
    drain = _drain(facts, received, cordoned_only)
    chosen = _beyond_reserve(facts, received, launching, launched)
    room = PoolRoom(facts)
    ends = [
        room.stop(m, reason, _idle_and_ours(m)) or terminate(m, reason, _idle_and_ours(m))
        for m, reason in chosen
    ]
    if not cordoned_only:
        ends += [terminate(m, why, _idle_and_ours(m)) for m, why in _expired_reserve(facts, launching)]
        ends += _released_at_once(facts, drain, launching, launched + len(chosen))
    return Step(
        (*drain.actions, *(a for s in ends for a in s.actions)),
        (*drain.marks, *(m for s in ends for m in s.marks)),
    )


def _drain(facts: Facts, received: Mapping[str, int], cordoned_only: bool = False) -> Step:
    """Active members empty (running and queuing nothing) for `drain_delay`: their workers retired (one
    action per node), then their nodes drained, each drain expecting its workers really retired.

    A member whose workers only hold results (a client's, not yet released) is empty too: dask's
    `retire_workers` moves such results to a worker that stays before it closes the worker, and keeps
    the worker when none can take them (the drain, expecting `Retired`, is then skipped). It takes its
    recipients among running workers only, so such a member is retired only while an uncordoned worker
    that is not retired stays (`_holders_kept`)."""
    retire: list[Action] = []
    drain: list[Action] = []
    marks: list[Mark] = []
    delays = {
        t: idle_delays(facts.policy, facts.snapshot, t) for t in {m.type_name for m in facts.cluster.active}
    }
    due = [
        m
        for m in facts.cluster.active
        if _empty_for(facts, m, received, delays[m.type_name][0]) and (m.cordoned or not cordoned_only)
    ]
    kept = _holders_kept(facts.cluster.active, due) | _base_kept(facts, due)
    for member in (m for m in due if m.key not in kept):
        node = member.node
        assert node is not None
        host = member.hostname
        delay, _, why = delays[member.type_name]
        named = f"drain_delay={delay:g}s" if not why else f"{delay:g}s ({why})"
        expect: tuple[Check, ...] = (HostIdle(host), NodeOurs(node.id))
        if member.workers:
            addresses = tuple(w.address for w in member.workers)
            # A holder's retirement checks that it still runs nothing; its results may move.
            check: Check = NoTasks(host) if member.busy else HostIdle(host)
            holds = "; its results move to a worker that stays" if member.busy else ""
            retire.append(RetireWorkers(addresses, f"idle for at least {named}{holds}", (check,)))
            expect += (Retired(host),)
        since = node.marks.empty_since
        assert since is not None
        reason = f"empty for {facts.now - since:.0f}s ({why or f'drain_delay {delay:g}s'})"
        drain.append(DrainNode(node.id, node.hostname, reason, expect=expect))
        marks.append(mark(node.id, "drained", drained_since=facts.now, empty_since=None, cordoned_since=None))
    return Step((*retire, *drain), tuple(marks))


def _released_at_once(facts: Facts, drain: Step, launching: Collection[str], leaving: int) -> list[Step]:
    """Terminations, in the plan that drains them, of machines idle learning lets go (`arrivals.
    idle_delays`: termination delay 0): as for a machine EC2 takes back (interrupt.py), the termination
    expects the host idle and its workers really retired, re-checked after the drain, so a machine that
    took work meanwhile is kept. Only where nothing else wants the drained machine: no reserve or warm
    pool for its type, a type this plan does not launch, and above `min_instances` (`leaving`: machines
    this plan already ends or launches)."""
    policy = facts.policy
    by_node = {m.node.id: m for m in facts.cluster.active if m.node is not None}
    live = useful(facts.cluster) - len(facts.cluster.reserve) - leaving
    out = []
    for action in drain.actions:
        if not isinstance(action, DrainNode):
            continue
        member = by_node.get(action.node_id)
        if member is None or member.busy or member.type_name in launching or member.instance is None:
            continue
        tp = policy.type_policy(member.type_name)
        _, delay, why = idle_delays(policy, facts.snapshot, member.type_name)
        if tp is None or tp.reserve or tp.warm_pool or not why or delay > 0 or live <= policy.min_instances:
            continue
        expect: tuple[Check, ...] = (HostIdle(member.hostname), *action.expect[2:], NodeOurs(action.node_id))
        out.append(terminate(member, f"let go once drained ({why})", expect))
        live -= 1
    return out


def _base_kept(facts: Facts, due: Sequence[Member]) -> frozenset[str]:
    """The keys of due members kept active as their type's base (`TypePolicy.minimum`): the base is
    always on, with its workers; retired and drained for idleness, its machines billed with no worker
    and the queue threshold (surge.py) no longer saw them. The base is counted among the type's active
    members; the first due ones by key make up what the others lack."""
    leaving = {m.key for m in due}
    kept: set[str] = set()
    for tp in facts.policy.allowed_types:
        if tp.minimum <= 0:
            continue
        staying = sum(1 for m in facts.cluster.active if m.type_name == tp.name and m.key not in leaving)
        mine = sorted(m.key for m in due if m.type_name == tp.name)
        kept.update(mine[: max(0, tp.minimum - staying)])
    return frozenset(kept)


def base_keys(facts: Facts) -> frozenset[str]:
    """Keys of the active members that make up each type's base (the first `minimum` by key): never
    cordoned by consolidation, which would leave the base up without taking work."""
    keys: set[str] = set()
    for tp in facts.policy.allowed_types:
        if tp.minimum > 0:
            mine = sorted(m.key for m in facts.cluster.active if m.type_name == tp.name)
            keys.update(mine[: tp.minimum])
    return frozenset(keys)


def _empty_for(facts: Facts, member: Member, received: Mapping[str, int], delay: float) -> bool:
    """The member runs and queues nothing, received no task in this plan and has been empty for
    `delay` (results its workers hold do not count)."""
    since = member.node.marks.empty_since if member.node is not None else None
    if member.working or member.key in received or since is None:
        return False
    return facts.now - since >= delay


def _holders_kept(active: Sequence[Member], due: Sequence[Member]) -> frozenset[str]:
    """The keys of members holding results that are not retired now: all of them when no uncordoned
    worker would be left to receive their results (only cordoned holders), else one uncordoned holder
    (the last by key) when every other uncordoned worker is retired in this plan."""
    leaving = {m.key for m in due}
    holders = [m for m in due if m.busy]
    if not holders or any(m.workers and not m.cordoned and m.key not in leaving for m in active):
        return frozenset()
    open_holders = [m for m in holders if not m.cordoned]
    if not open_holders:
        return frozenset(m.key for m in holders)
    return frozenset({max(m.key for m in open_holders)})


def _expired_reserve(facts: Facts, launching: Collection[str]) -> list[tuple[Member, str]]:
    """Reserve machines of a type unused past its `reserve_idle_limit` (launches.reserve_expired), with
    the reason: a reserve is kept warm for work that comes back soon, not for ever (the peer's
    inactivity limit of its hot buffer). Never while the plan launches the type, never a busy one."""
    out = []
    for member in facts.cluster.reserve:
        tp = facts.policy.type_policy(member.type_name)
        if tp is None or member.busy or member.type_name in launching or member.node is None:
            continue
        unused = reserve_expired(facts.cluster, tp, facts.now)
        if unused is not None:
            limit = f"reserve_idle_limit {tp.reserve_idle_limit:g}s"
            since = f"{unused:.0f}s" if unused != float("inf") else "ever"
            out.append((member, f"reserve unused for {since} ({limit})"))
    return out


def _beyond_reserve(
    facts: Facts, received: Mapping[str, int], launching: Collection[str], launched: int
) -> list[tuple[Member, str]]:
    """Drained members to terminate, with the reason: past `termination_delay` (or the shorter delay
    of `arrivals.idle_delays`), idle, never below `min_instances` (the reserve comes on top of it) nor
    below their type's base, and never of a type this plan launches."""
    cluster, policy = facts.cluster, facts.policy
    live = useful(cluster) + launched - len(cluster.reserve)
    above_base = _above_base(facts)
    chosen: list[tuple[Member, str]] = []
    for member in cluster.drained:
        node = member.node
        assert node is not None
        since = node.marks.drained_since
        if live <= policy.min_instances:
            break
        if member.busy or member.key in received or since is None:
            continue
        _, delay, why = idle_delays(policy, facts.snapshot, member.type_name)
        if facts.now - since < delay:
            continue
        if member.type_name in launching:  # never launch and terminate the same type
            continue
        if above_base.get(member.type_name, 1) <= 0:  # its type's base (TypePolicy.minimum) keeps it
            continue
        named = f"termination_delay={delay:g}s" if not why else f"{delay:g}s ({why})"
        chosen.append((member, f"drained for at least {named}, beyond the reserve"))
        live -= 1
        if member.type_name in above_base:
            above_base[member.type_name] -= 1
    return chosen


def _above_base(facts: Facts) -> dict[str, int]:
    """Type -> how many of its useful machines (its reserve aside) run above its base, for types with one."""
    out: dict[str, int] = {}
    for tp in facts.policy.allowed_types:
        if tp.minimum > 0:
            reserve = sum(1 for m in facts.cluster.reserve if m.type_name == tp.name)
            out[tp.name] = useful_of(facts.cluster, tp.name) - reserve - tp.minimum
    return out
