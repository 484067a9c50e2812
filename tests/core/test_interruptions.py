"""A machine EC2 gave notice it takes back (`Instance.interrupted_at`): the planner retires its worker
whatever it holds, drains and terminates it, launches its replacement in the same plan (also at the
maximum), never counts it as capacity and never stops it into the warm pool. Whole plans compared."""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import MappingProxyType

from tests.builders import (
    NOW,
    assemble,
    hostname,
    machine,
    make_instance,
    make_node,
    make_policy,
    make_task,
    make_tasks,
)
from tests.builders import worker_address as addr
from tests.core.randomized import apply

from swarm_autoscaler.core.actions import (
    DrainNode,
    HostIdle,
    Launch,
    NodeOurs,
    NodeUpdate,
    NotJoined,
    NoWorker,
    Retired,
    RetireWorkers,
    Stop,
    Terminate,
)
from swarm_autoscaler.core.cluster import Bucket, allowed, classify
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Availability,
    Instance,
    InstanceState,
    NodeMarks,
    TypePolicy,
)
from swarm_autoscaler.core.plan import plan

NOTICE = NOW - 10
WHY = f"EC2 gave notice at {NOTICE:.0f} that it takes i-0001 back"


def interrupted(inst: Instance) -> Instance:
    return replace(inst, interrupted_at=NOTICE, spot=True)


def test_a_busy_interrupted_machine_is_retired_drained_terminated_and_replaced_at_once() -> None:
    tasks = make_tasks(2, cpus=1)
    inst, node, worker = machine(1, processing=tasks, unique=True)
    snap = assemble((interrupted(inst), node, worker))
    policy = make_policy(types=["m5.large"])

    got = plan(snap, policy)

    assert classify(snap, policy).interrupted[0].key == "i-0001"
    assert got.actions == (
        Launch("m5.large", 1, "2 pending task(s) need new capacity; cheapest fitting type: m5.large"),
        RetireWorkers((addr(1),), f"{WHY}: its results move to workers that stay", (NodeOurs(node.id),)),
        DrainNode(node.id, node.hostname, WHY, (Retired(hostname(1)), NodeOurs(node.id))),
        # the terminating mark rides with the termination: written only if it goes ahead
        Terminate(
            ("i-0001",),
            f"{WHY}: let go",
            (node.id,),
            (HostIdle(hostname(1)), Retired(hostname(1)), NodeOurs(node.id)),
            NodeMarks(ready=True, termination_started=NOW),
        ),
    )
    assert got.pending == 2


def test_the_machine_is_no_capacity_but_counts_against_the_maximum_until_let_go() -> None:
    inst, node, worker = machine(1, processing=[make_task("a", cpus=1)])
    other = machine(2)  # an idle m5.large with room: the task goes there, nothing launched
    at_max = make_policy(types=["m5.large"], max_instances=1)

    alone = plan(assemble((interrupted(inst), node, worker)), at_max)
    assert alone.of_kind(Launch) == () and len(alone.of_kind(Terminate)) == 1
    # The tick after: terminated (shutting down), its task back in the scheduler's unrunnable queue.
    shut = replace(interrupted(inst), state=InstanceState.SHUTTING_DOWN)
    after = assemble((shut, None, None), unrunnable=[make_task("a", cpus=1)])
    assert len(plan(after, at_max).of_kind(Launch)) == 1

    with_room = plan(assemble((interrupted(inst), node, worker), other), make_policy(types=["m5.large"]))
    assert with_room.of_kind(Launch) == ()
    assert dict(with_room.placed).get("active") == 1


def test_an_interrupted_machine_that_never_joined_is_terminated_only_while_it_has_no_worker() -> None:
    inst = interrupted(make_instance(1, age=30))
    got = plan(assemble((inst, None, None)), make_policy(types=["m5.large"]))
    assert got.actions == (
        Terminate(("i-0001",), f"{WHY}: let go", (), (NoWorker(hostname(1)), NotJoined(hostname(1)))),
    )


def test_a_drained_interrupted_machine_is_terminated_never_stopped_into_the_pool() -> None:
    inst, node, _ = machine(1, worker=False, availability=Availability.DRAIN)
    pooled = make_policy(types=[TypePolicy("m5.large", warm_pool=2)])
    got = plan(assemble((replace(inst, interrupted_at=NOTICE), node, None)), pooled)
    assert got.of_kind(Stop) == ()
    assert [a.instance_ids for a in got.of_kind(Terminate)] == [("i-0001",)]  # type: ignore[union-attr]
    assert got.of_kind(DrainNode) == ()  # already drained


def test_it_stays_interrupted_until_ec2_shuts_it_down_and_every_step_is_an_allowed_transition() -> None:
    inst, node, worker = machine(1, processing=make_tasks(1))
    policy = make_policy(types=["m5.large"])
    before = assemble((inst, node, worker))
    noticed = assemble((interrupted(inst), node, worker))
    after = apply(noticed, plan(noticed, policy))
    buckets = [classify(s, policy).bucket_of()["i-0001"] for s in (before, noticed, after)]
    assert buckets == [Bucket.ACTIVE, Bucket.INTERRUPTED, Bucket.TERMINATING]
    assert all(allowed(a, b) for a, b in itertools.pairwise(buckets))
    # The termination was skipped (results still moving): marked terminating, still alive, so each
    # tick plans the steps again.
    marked = replace(node, marks=NodeMarks(ready=True, termination_started=NOW))
    again = assemble((interrupted(inst), marked, replace(worker, retiring=True)))
    assert classify(again, policy).bucket_of()["i-0001"] == Bucket.INTERRUPTED
    assert len(plan(again, policy).of_kind(Terminate)) == 1


def test_without_a_notice_nothing_changes() -> None:
    inst, node, worker = machine(1, processing=make_tasks(1))
    got = plan(assemble((inst, node, worker)), make_policy(types=["m5.large"]))
    assert got.of_kind(RetireWorkers) == () and got.of_kind(Terminate) == ()


def test_a_node_that_joins_after_the_notice_gets_its_labels_and_the_machine_is_then_let_go() -> None:
    """EC2 gave notice before the node joined: the node is not labelled ours yet, and every disruptive
    action on it waits on `NodeOurs`. The plan labels it (the ownership label among its launch labels),
    so the next plan's drain and termination can land. Found by a fresh-clone run in which the
    termination was skipped on every tick ("does not carry our ownership label") and never happened."""
    inst, _, worker = machine(1)
    launch_labels = {OWNERSHIP_LABEL: "main", "instance-type": "m5.large"}
    inst = replace(interrupted(inst), labels=launch_labels)
    node = make_node(1, marks=NodeMarks(), ours=False)
    snap = assemble((inst, node, worker))
    policy = make_policy(types=["m5.large"])

    first = plan(snap, policy)

    assert [m.key for m in classify(snap, policy).interrupted] == ["i-0001"]
    assert [(a.node_id, dict(a.labels)) for a in first.of_kind(NodeUpdate) if a.labels] == [
        (node.id, launch_labels)
    ]  # type: ignore[union-attr]
    labelled = replace(node, labels=MappingProxyType(launch_labels), ours=True)
    second = plan(assemble((inst, labelled, worker)), policy)
    assert [a.instance_ids for a in second.of_kind(Terminate)] == [("i-0001",)]  # type: ignore[union-attr]
    assert [a for a in second.of_kind(NodeUpdate) if a.labels] == []  # type: ignore[attr-defined]
