"""Safety guards that no whole-plan rule reaches on its own, tested on the step that holds them, and
the story of a machine terminated as broken just as it joined, told tick by tick."""

from __future__ import annotations

from dataclasses import replace

from tests.builders import (
    NOW,
    assemble,
    hostname,
    machine,
    make_instance,
    make_node,
    make_policy,
    make_snapshot,
)

from swarm_autoscaler.core.actions import NodeUpdate, RemoveNode, Terminate
from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.demand import estimate_demand
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Availability,
    InstanceState,
    NodeMarks,
    NodeStatus,
    Policy,
    Snapshot,
)
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.recheck import Fresh, violations
from swarm_autoscaler.core.shrink import scale_down
from swarm_autoscaler.core.steps import Facts

DRAINED_LONG = NodeMarks(ready=True, drained_since=NOW - 200)


def facts(snapshot: Snapshot, policy: Policy) -> Facts:
    return Facts(snapshot, policy, classify(snapshot, policy), estimate_demand(snapshot, policy)[1])


def test_scale_down_never_terminates_a_type_the_same_plan_launches() -> None:
    """plan() composes its steps so that a drained machine beyond the reserve always takes work of its
    type before a launch would, which makes this guard unreachable through plan() today; it still
    holds on the step, so that a change in placement cannot make the plan launch and terminate the
    same type (paying for a boot to save an idle machine)."""
    snapshot = assemble(machine(1, worker=False, availability=Availability.DRAIN, marks=DRAINED_LONG))
    known = facts(snapshot, make_policy())
    alone = scale_down(known, {}, launching=set(), launched=0)
    assert [type(a) for a in alone.actions] == [Terminate]
    assert scale_down(known, {}, launching={"m5.large"}, launched=1).actions == ()
    assert [type(a) for a in scale_down(known, {}, launching={"m5.xlarge"}, launched=1).actions] == [
        Terminate
    ]


def test_scale_down_keeps_min_instances_counting_the_plans_launches() -> None:
    snapshot = assemble(machine(1, worker=False, availability=Availability.DRAIN, marks=DRAINED_LONG))
    known = facts(snapshot, make_policy(min_instances=1))
    assert scale_down(known, {}, launching=set(), launched=0).actions == ()
    assert [type(a) for a in scale_down(known, {}, launching=set(), launched=1).actions] == [Terminate]


def test_a_machine_terminated_as_broken_just_as_it_joined_is_checked_then_labelled_and_removed() -> None:
    labels = {OWNERSHIP_LABEL: "c1", "instance-type": "m5.large"}
    inst = replace(make_instance(1, age=700), labels=labels)
    policy = make_policy()
    # Tick 1: planned as never joined; by the time act re-reads, its node has joined: skipped.
    (first,) = plan(make_snapshot(instances=[inst]), policy).actions
    assert isinstance(first, Terminate) and first.node_ids == ()
    node = make_node(1, marks=NodeMarks(), labels={"instance-type": "m5.large"}, ours=False)
    assert violations(first, Fresh((node,), ())) == (f"{hostname(1)} joined the swarm since the plan",)
    # Tick 2: joined, unlabelled, no worker: labelled ours first, and terminated with its node.
    second = plan(make_snapshot(instances=[inst], nodes=[node]), policy).actions
    assert [type(a) for a in second] == [NodeUpdate, Terminate]  # its marks and labels: one update
    label, end = second
    assert isinstance(label, NodeUpdate) and label.labels == ((OWNERSHIP_LABEL, "c1"),)
    assert isinstance(end, Terminate) and end.node_ids == ("node-1",)
    assert violations(end, Fresh((node,), ())) != ()  # not ours until the label is written
    assert violations(end, Fresh((replace(node, ours=True),), ())) == ()
    # Tick 3: had the termination raced the join, the node (down, now labelled) is still removed.
    gone = replace(inst, state=InstanceState.SHUTTING_DOWN)
    down = replace(node, status=NodeStatus.DOWN, labels=labels, ours=True)
    (removal,) = plan(make_snapshot(instances=[gone], nodes=[down]), policy).actions
    assert isinstance(removal, RemoveNode) and violations(removal, Fresh((down,), ())) == ()
    # Tick 4: its instance is no longer listed: the labelled node is ours by its label, and removed.
    (orphan,) = plan(make_snapshot(nodes=[down]), policy).actions
    assert isinstance(orphan, RemoveNode) and orphan.node_id == "node-1"
