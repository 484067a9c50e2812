"""Dynamic mode's machines join the swarm paused and the planner takes each in (labels, then active,
re-checked on a fresh read): a machine planned as broken that joins before its termination lands stays
paused, so swarm places no task there (the chaos world's replayed run CHAOS_SEED=3 lost tasks that way
while machines joined active). The computational mode is unchanged: its machines join active."""

from __future__ import annotations

from dataclasses import replace

from tests.builders import NOW, make_instance, make_node, make_policy, make_snapshot

from swarm_autoscaler.adapters.ec2_support import render_start_user_data, render_user_data
from swarm_autoscaler.core.actions import ActivateNode, DrainNode, NodeOurs, NodePaused, NodeUpdate, Terminate
from swarm_autoscaler.core.cluster import TYPE_LABEL, classify
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Availability, NodeMarks, NodeStatus
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.recheck import Fresh, violations
from swarm_autoscaler.core.services import SwarmNode, dynamic_policy, service_view
from swarm_autoscaler_lab.localcloud.machines import JOIN_RE

CLUSTER = "c1"
LABELS = {TYPE_LABEL: "m5.large", OWNERSHIP_LABEL: CLUSTER}


def joined_paused(age: float) -> tuple[object, object]:
    """One instance of ours (launched `age` ago) whose node just joined paused, unlabelled, unmarked."""
    inst = replace(make_instance(1, age=age), labels=LABELS)
    node = make_node(1, Availability.PAUSE, marks=NodeMarks(), labels={}, ours=False)
    return inst, node


def snapshot_for(inst, node, policy):  # type: ignore[no-untyped-def]
    workers = service_view([SwarmNode(node)], [], (), policy, CLUSTER).workers
    return make_snapshot([inst], [node], workers)


def test_a_node_joined_paused_is_taken_in_labels_then_a_rechecked_activation() -> None:
    policy = dynamic_policy(make_policy(max_start_time=8))
    for age in (3.0, 30.0):  # in time, or late: joined is joined, the node is up
        inst, node = joined_paused(age)
        snapshot = snapshot_for(inst, node, policy)
        assert [m.key for m in classify(snapshot, policy).joining] == ["i-0001"]
        result = plan(snapshot, policy)
        labels = [a for a in result.of_kind(NodeUpdate) if a.labels]  # type: ignore[attr-defined]
        assert [dict(a.labels) for a in labels] == [LABELS]  # type: ignore[attr-defined]
        (activate,) = result.of_kind(ActivateNode)
        assert activate.expect == (NodeOurs("node-1"), NodePaused("node-1"))  # type: ignore[attr-defined]
        assert not result.of_kind(Terminate) and not result.of_kind(DrainNode)


def test_the_activation_is_refused_unless_the_node_is_ours_and_still_paused_untaken() -> None:
    activate = ActivateNode("node-1", "ip-1", "x", (NodeOurs("node-1"), NodePaused("node-1")))
    labelled = make_node(1, Availability.PAUSE, marks=NodeMarks(), labels=LABELS, ours=True)
    assert violations(activate, Fresh((labelled,), ())) == ()
    unlabelled = replace(labelled, labels={}, ours=False)
    assert violations(activate, Fresh((unlabelled,), ()))  # its label write did not happen
    for changed in (
        replace(labelled, availability=Availability.DRAIN),  # an operator drained it
        replace(labelled, marks=NodeMarks(termination_started=NOW)),
        replace(labelled, status=NodeStatus.DOWN),
    ):
        assert violations(activate, Fresh((changed,), ()))
    assert violations(activate, Fresh((), ()))  # gone


def test_a_machine_with_no_node_is_planned_broken_and_only_a_paused_join_can_follow() -> None:
    """The race: planned broken with no node; whatever joins before TerminateInstances lands joins
    paused, and a paused node gets no task. On the next plan its terminated instance is terminating,
    never taken in."""
    policy = dynamic_policy(make_policy(max_start_time=8))
    inst = replace(make_instance(1, age=30.0), labels=LABELS)
    (term,) = plan(make_snapshot([inst]), policy).of_kind(Terminate)
    assert term.instance_ids == ("i-0001",)  # type: ignore[attr-defined]
    _, node = joined_paused(30.0)
    gone = replace(inst, state=type(inst.state).SHUTTING_DOWN)
    after = plan(snapshot_for(gone, node, policy), policy)
    assert not after.of_kind(ActivateNode)


def test_the_computational_mode_is_unchanged_a_paused_fresh_node_is_drained_and_not_activated() -> None:
    policy = make_policy(max_start_time=8)
    assert not policy.join_paused
    inst, node = joined_paused(3.0)
    snapshot = make_snapshot([inst], [node])
    fleet = classify(snapshot, policy)
    assert [m.key for m in fleet.drained + fleet.reserve] == ["i-0001"]
    assert not plan(snapshot, policy).of_kind(ActivateNode)


def test_the_boot_script_joins_paused_only_when_asked_and_the_emulator_reads_it() -> None:
    for text in (render_user_data("echo hi", "SWMTKN-1-x", "10.0.0.1:2377", paused=True),
                 render_start_user_data("SWMTKN-1-x", "10.0.0.1:2377", paused=True)):  # fmt: skip
        assert "docker swarm join --availability pause --token SWMTKN-1-x 10.0.0.1:2377" in text
        match = JOIN_RE.search(text)
        assert match is not None and match.group(1) and match.group(2, 3) == ("SWMTKN-1-x", "10.0.0.1:2377")
    plain = render_user_data("echo hi", "SWMTKN-1-x", "10.0.0.1:2377")
    assert "--availability" not in plain
    match = JOIN_RE.search(plain)
    assert match is not None and match.group(1) is None
