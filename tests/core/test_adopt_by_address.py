"""Adoption by address (`Policy.adopt_by_address`, `AUTOSCALER_EC2_ADOPT_BY_ADDRESS`): a node that took a
pending machine's hostname from elsewhere in the VPC (with the join token read from user data) is not
that machine's node: it is left unowned, never labelled ours, and the machine's own node, whose swarm
address is the instance's private IP, is the one adopted. Off, the hostname alone decides (today's
default, kept for a deployment whose workers reach the managers through NAT).

Plain dataclasses in, classification and the whole plan's label writes out; the addresses are what the
swarm adapter reads from `Status.Addr` (swarm sets it from the node's authenticated connection) and the
EC2 adapter from `PrivateIpAddress` (both adapters tested below on their raw records)."""

from __future__ import annotations

import datetime
from dataclasses import replace

from tests.builders import make_instance, make_node, make_policy, make_snapshot

from swarm_autoscaler.adapters.ec2_support import to_instance
from swarm_autoscaler.adapters.swarm import node_from_api
from swarm_autoscaler.core.actions import NodeUpdate
from swarm_autoscaler.core.cluster import TYPE_LABEL, classify
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, NodeMarks
from swarm_autoscaler.core.plan import plan

LABELS = {TYPE_LABEL: "m5.large", OWNERSHIP_LABEL: "c1"}
STRICT = replace(make_policy(), adopt_by_address=True)
LOOSE = make_policy()


def _pending_machine() -> object:
    return replace(make_instance(1, age=60.0), labels=LABELS, private_ip="10.0.0.5")


def _node(n: int, address: str) -> object:
    """A node that just joined under the machine's hostname: unlabelled, unmarked."""
    return replace(make_node(1, marks=NodeMarks(), labels={}, ours=False), id=f"node-{n}", address=address)


def _labelled(snapshot: object, policy: object) -> list[str]:
    result = plan(snapshot, policy)  # type: ignore[arg-type]
    return [a.node_id for a in result.of_kind(NodeUpdate) if a.labels]  # type: ignore[attr-defined]


def test_an_impostor_with_the_machine_s_hostname_stays_unowned_and_unlabelled() -> None:
    inst, impostor = _pending_machine(), _node(9, "10.9.9.9")
    snapshot = make_snapshot([inst], [impostor])  # type: ignore[list-item]
    fleet = classify(snapshot, STRICT)
    assert [m.node.id for m in fleet.unowned if m.node] == ["node-9"]
    assert [m.key for m in fleet.launched] == ["i-0001"]  # still waiting for its own node
    assert _labelled(snapshot, STRICT) == []
    # Without the check the impostor is adopted: the attack the setting closes.
    assert _labelled(snapshot, LOOSE) == ["node-9"]


def test_the_machine_s_own_node_is_adopted_beside_an_impostor() -> None:
    inst = _pending_machine()
    snapshot = make_snapshot([inst], [_node(9, "10.9.9.9"), _node(5, "10.0.0.5")])  # type: ignore[list-item]
    fleet = classify(snapshot, STRICT)
    assert [m.node.id for m in fleet.unowned if m.node] == ["node-9"]
    assert _labelled(snapshot, STRICT) == ["node-5"]


def test_an_address_or_an_ip_not_known_matches_nothing() -> None:
    for inst, node in (
        (_pending_machine(), _node(5, "")),
        (replace(_pending_machine(), private_ip=""), _node(5, "10.0.0.5")),  # type: ignore[type-var]
    ):
        snapshot = make_snapshot([inst], [node])  # type: ignore[list-item]
        assert _labelled(snapshot, STRICT) == []
        assert _labelled(snapshot, LOOSE) == ["node-5"]


def test_the_adapters_read_the_node_s_swarm_address_and_the_instance_s_private_ip() -> None:
    raw_node = {
        "ID": "n1",
        "Spec": {"Labels": {}, "Role": "worker", "Availability": "active"},
        "Description": {"Hostname": "ip-10-0-0-5"},
        "Status": {"State": "ready", "Addr": "10.0.0.5"},
    }
    assert node_from_api(raw_node).address == "10.0.0.5"
    raw_instance = {
        "InstanceId": "i-1", "InstanceType": "m5.large", "State": {"Name": "pending"},
        "LaunchTime": datetime.datetime.now(datetime.UTC), "PrivateDnsName": "ip-10-0-0-5.ec2.internal",
        "PrivateIpAddress": "10.0.0.5",
    }  # fmt: skip
    inst = to_instance(raw_instance)
    assert inst is not None and inst.private_ip == "10.0.0.5"
