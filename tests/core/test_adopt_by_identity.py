"""Adoption by identity (`Policy.adopt_by_identity`, on with join tickets: `AUTOSCALER_EC2_JOIN_URL`): a
node is matched to the pending machine whose hostname it carries only when a manager labelled it with
that instance's id (`IDENTITY_LABEL`, written by the join desk when the machine itself confirmed its node
id, from its own private IP, with its ticket: `tests/adapters/ec2/test_join_ticket.py`), or when it is
ours already (adopted before the check was on: an upgrade keeps its fleet). A node that only took the
hostname, with a join token obtained elsewhere, stays unowned: never labelled ours, drained or removed.

Plain dataclasses in, classification and the whole plan's label writes out; the label is what the
swarm adapter reads from the node's `Spec.Labels`, which only managers write (tested on a raw record)."""

from __future__ import annotations

from dataclasses import replace

from tests.builders import make_instance, make_node, make_policy, make_snapshot

from swarm_autoscaler.adapters.swarm import node_from_api
from swarm_autoscaler.core.actions import NodeUpdate
from swarm_autoscaler.core.cluster import IDENTITY_LABEL, TYPE_LABEL, classify
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Node,
    NodeMarks,
)
from swarm_autoscaler.core.plan import plan

LABELS = {TYPE_LABEL: "m5.large", OWNERSHIP_LABEL: "c1"}
STRICT = replace(make_policy(), adopt_by_identity=True)
LOOSE = make_policy()


def _pending_machine(n: int = 1) -> object:
    return replace(make_instance(n, age=60.0), labels=LABELS, private_ip=f"10.0.0.{n}")


def _node(n: int, labels: dict[str, str] | None = None, ours: bool = False) -> Node:
    """A node under machine 1's hostname: unmarked, with these labels (a manager's)."""
    return replace(make_node(1, marks=NodeMarks(), labels=labels or {}, ours=ours), id=f"node-{n}")


def _labelled(snapshot: object, policy: object) -> list[str]:
    result = plan(snapshot, policy)  # type: ignore[arg-type]
    return [a.node_id for a in result.of_kind(NodeUpdate) if a.labels]  # type: ignore[attr-defined]


def test_a_node_with_the_machine_s_hostname_but_no_confirmation_stays_unowned() -> None:
    inst, impostor = _pending_machine(), _node(9)
    snapshot = make_snapshot([inst], [impostor])  # type: ignore[list-item]
    fleet = classify(snapshot, STRICT)
    assert [m.node.id for m in fleet.unowned if m.node] == ["node-9"]
    assert [m.key for m in fleet.launched] == ["i-0001"]  # still waiting for its own node
    assert _labelled(snapshot, STRICT) == []
    assert _labelled(snapshot, LOOSE) == ["node-9"]  # by hostname alone: the attack the check closes


def test_the_confirmed_node_is_adopted_beside_an_impostor() -> None:
    inst = _pending_machine()
    mine = _node(5, {IDENTITY_LABEL: "i-0001"})
    snapshot = make_snapshot([inst], [_node(9), mine])  # type: ignore[list-item]
    fleet = classify(snapshot, STRICT)
    assert [m.node.id for m in fleet.unowned if m.node] == ["node-9"]
    assert _labelled(snapshot, STRICT) == ["node-5"]


def test_the_planner_never_copies_the_identity_label_from_the_instance_s_tags() -> None:
    """The labels a node gets come from its instance's `swarm-autoscaler/label/*` tags; one naming the
    identity label (written by someone allowed to tag the instance) would let that tag choose which
    instance a node is. Only the join desk writes it: the planner leaves it out and copies the rest."""
    inst = replace(_pending_machine(), labels={**LABELS, IDENTITY_LABEL: "i-0009"})
    snapshot = make_snapshot([inst], [_node(5, {IDENTITY_LABEL: "i-0001"})])  # type: ignore[list-item]
    [update] = [a for a in plan(snapshot, STRICT).of_kind(NodeUpdate) if a.labels]
    assert dict(update.labels) == LABELS


def test_a_node_confirmed_for_another_instance_is_not_this_one_s() -> None:
    inst = _pending_machine()
    other = _node(7, {IDENTITY_LABEL: "i-0002"}, ours=True)
    snapshot = make_snapshot([inst], [other])  # type: ignore[list-item]
    fleet = classify(snapshot, STRICT)
    assert [m.key for m in fleet.launched] == ["i-0001"]
    assert _labelled(snapshot, STRICT) == []


def test_a_node_ours_from_before_the_check_keeps_its_machine() -> None:
    """An upgrade: the running fleet's nodes were adopted by hostname and carry no identity label. They
    stay matched (else every machine would look node-less and be ended as broken)."""
    inst = replace(make_instance(1, age=5000.0), labels=LABELS)
    old = replace(make_node(1, labels=LABELS, ours=True), id="node-1")
    snapshot = make_snapshot([inst], [old])  # type: ignore[list-item]
    assert classify(snapshot, STRICT).bucket_of() == classify(snapshot, LOOSE).bucket_of()
    assert [m.node.id for m in classify(snapshot, STRICT).active if m.node] == ["node-1"]


def test_the_adapter_reads_the_label_from_the_managers_spec_only() -> None:
    """`Spec.Labels` are written by managers; `Description.Engine.Labels` by the node's own dockerd
    (`dockerd --label`): the latter proves nothing and is not read."""
    raw = {
        "ID": "n1",
        "Spec": {"Labels": {IDENTITY_LABEL: "i-1"}, "Role": "worker", "Availability": "active"},
        "Description": {"Hostname": "ip-10-0-0-5", "Engine": {"Labels": {IDENTITY_LABEL: "i-2"}}},
        "Status": {"State": "ready", "Addr": "10.0.0.5"},
    }
    assert node_from_api(raw).labels.get(IDENTITY_LABEL, "") == "i-1"
    raw["Spec"]["Labels"] = {}  # type: ignore[index]
    assert node_from_api(raw).labels.get(IDENTITY_LABEL, "") == ""
