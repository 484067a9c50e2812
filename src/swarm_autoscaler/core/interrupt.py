"""Machines EC2 gave notice it takes back (`Instance.interrupted_at`): the `interrupted` bucket. Pure.

A notice (a spot interruption warning, two minutes before EC2 takes the machine; a rebalance
recommendation; a scheduled change) overrides the rule that a busy machine is kept: EC2 takes it anyway.
What the planner does, in the same plan, for each interrupted machine:

1. its replacement: an interrupted machine is no capacity (no placement tier holds the bucket), and
   the tasks its workers run or queue count as pending (`pending_view`), so scale-up launches for them
   at once; it still counts against `max_instances` while it is alive (the maximum is a hard limit), so
   at the maximum the replacement launches once it is terminated, the tick after at the earliest;
2. `RetireWorkers` of every worker on it, busy or not: dask's `retire_workers` moves the results it
   holds to workers that stay, and the scheduler gives its running and queued tasks to other workers
   (they run again there), so no task is lost; the only check is that the node is still ours;
3. `DrainNode` (expect `Retired`, on the read taken after the retirement, and `NodeOurs`), so that no
   swarm task lands there;
4. `Terminate` once no worker holds work there (expect `HostIdle`, re-checked after the retirement and by
   the fence, and `NodeOurs`): no worker on it, or all of them retired this tick. While the scheduler
   still moves results, the termination is skipped and planned again next tick; for a spot warning
   EC2 may come first, which loses nothing dask has not moved already.

A **rebalance recommendation** (`Instance.rebalance_at`: EC2 says a spot machine is at raised risk,
usually well before any warning) is advice, as Karpenter treats it: a busy machine is not taken from
its work. Its worker is cordoned (it takes no new task; its running tasks finish undisturbed) and one
replacement of its type is launched at once (`replacements`: in the plan that cordons it, so once), so
that capacity is there if the warning follows. Once its workers run and hold nothing it is in the
`interrupted` bucket (cluster.py) and let go as above. Before, a recommendation was handled as a
warning: busy workers were retired and their running work redone elsewhere.

The machine stays in the bucket (its node marked terminating once its termination went ahead) until EC2 lists it as shutting down, so
each tick plans the steps still to do again. It is never stopped into the warm pool (the pool's steps
never see the bucket).
"""

from __future__ import annotations

import dataclasses

from swarm_autoscaler.core.actions import (
    Action,
    Check,
    Cordon,
    DrainNode,
    HostIdle,
    NodeOurs,
    NotJoined,
    NoWorker,
    Retired,
    RetireWorkers,
)
from swarm_autoscaler.core.cluster import Member
from swarm_autoscaler.core.model import Availability, Snapshot, Task
from swarm_autoscaler.core.shrink import terminate
from swarm_autoscaler.core.steps import Facts, Step


def interrupted_hosts(snapshot: Snapshot) -> frozenset[str]:
    """Hostnames of live instances with a notice."""
    return frozenset(i.hostname for i in snapshot.instances if i.alive and i.interrupted_at is not None)


def pending_view(snapshot: Snapshot) -> Snapshot:
    """`snapshot` as demand sees it: the workers on interrupted machines left out, and every task they
    run or queue counted as unrunnable (pending), since it must run elsewhere."""
    hosts = interrupted_hosts(snapshot)
    if not hosts:
        return snapshot
    leaving = [w for w in snapshot.workers if w.hostname in hosts]
    moved: tuple[Task, ...] = tuple(
        dataclasses.replace(t, executing=False, started=None) for w in leaving for t in w.processing
    )
    return dataclasses.replace(
        snapshot,
        workers=tuple(w for w in snapshot.workers if w.hostname not in hosts),
        unrunnable=(*snapshot.unrunnable, *moved),
    )


def advised(facts: Facts) -> list[Member]:
    """Busy active machines with a rebalance recommendation and no warning, not yet cordoned."""
    return [
        m
        for m in facts.cluster.active
        if m.instance is not None
        and m.instance.rebalance_at is not None
        and m.node is not None
        and m.workers
        and m.node.marks.cordoned_since is None
    ]


def rebalancing(member: Member) -> bool:
    """The member's machine carries a rebalance recommendation: it takes no new work."""
    return member.instance is not None and member.instance.rebalance_at is not None


def replacements(facts: Facts) -> dict[str, tuple[str, ...]]:
    """Type -> the machines a replacement is launched for now (those cordoned in this plan)."""
    out: dict[str, tuple[str, ...]] = {}
    for member in advised(facts):
        out[member.type_name] = (*out.get(member.type_name, ()), member.key)
    return out


def _advise(member: Member) -> Cordon:
    inst, node = member.instance, member.node
    assert inst is not None and inst.rebalance_at is not None and node is not None
    why = f"EC2 recommends rebalancing {inst.id} (notice at {inst.rebalance_at:.0f}): it takes no new task"
    return Cordon(node.id, node.hostname, tuple(w.address for w in member.workers), why, (NodeOurs(node.id),))


def let_go(facts: Facts) -> Step:
    """Retire, drain and terminate every interrupted machine; cordon the busy ones EC2 recommends
    rebalancing (see the module docstring)."""
    actions: list[Action] = [_advise(m) for m in advised(facts)]
    for member in facts.cluster.interrupted:
        actions += _let_go(member)
    return Step(tuple(actions))


def _let_go(member: Member) -> tuple[Action, ...]:
    inst, node = member.instance, member.node
    assert inst is not None
    at = inst.interrupted_at if inst.interrupted_at is not None else inst.rebalance_at
    assert at is not None
    why = f"EC2 gave notice at {at:.0f} that it takes {inst.id} back"
    actions: list[Action] = []
    ours: tuple[Check, ...] = (NodeOurs(node.id),) if node is not None else ()
    if member.workers:
        addresses = tuple(w.address for w in member.workers)
        actions.append(RetireWorkers(addresses, f"{why}: its results move to workers that stay", ours))
    if node is not None and node.availability == Availability.ACTIVE:
        actions.append(DrainNode(node.id, node.hostname, why, (Retired(member.hostname), *ours)))
    if node is None:
        expect: tuple[Check, ...] = (NoWorker(member.hostname), NotJoined(member.hostname))
    else:
        expect = (HostIdle(member.hostname), Retired(member.hostname), *ours)
    ended = terminate(member, f"{why}: let go", expect)
    return (*actions, *ended.actions)
