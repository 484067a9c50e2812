"""The swarm adapter's pure translations: lifecycle marks <-> node labels, and API node entries -> Node.

These need no docker engine, so they are not marked `swarm` (they run in `make test-fast`).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm_autoscaler.adapters.swarm import (
    labels_to_marks,
    mark_label_names,
    marks_to_labels,
    node_from_api,
    nodes_from_api,
)
from swarm_autoscaler.core.model import Availability, NodeMarks, NodeStatus

times = st.none() | st.floats(min_value=0, max_value=4e9, allow_nan=False)
marks_strategy = st.builds(
    NodeMarks,
    ready=st.booleans(),
    empty_since=times,
    drained_since=times,
    termination_started=times,
    down_since=times,
)


@given(marks=marks_strategy, prefix=st.sampled_from(["swarm-autoscaler.", "acme/", "x-"]))
def test_marks_survive_a_round_trip_through_labels(marks: NodeMarks, prefix: str) -> None:
    labels = marks_to_labels(marks, prefix)
    assert set(labels) <= set(mark_label_names(prefix).values())
    assert labels_to_marks(labels | {"unrelated": "label"}, prefix) == marks


def test_unset_marks_write_no_labels() -> None:
    assert marks_to_labels(NodeMarks()) == {}


@pytest.mark.parametrize("garbled", ["", "soon", "nan", "inf", "-5", "1e999", "12:30", "None"])
def test_a_garbled_time_reads_as_absent(garbled: str) -> None:
    labels = {"swarm-autoscaler.empty-since": garbled, "swarm-autoscaler.down-since": "1700000000.5"}
    assert labels_to_marks(labels) == NodeMarks(down_since=1_700_000_000.5)


@pytest.mark.parametrize(
    ("text", "ready"), [("true", True), ("True", True), ("1", True), ("false", False), ("?", False)]
)
def test_ready_label(text: str, ready: bool) -> None:
    assert labels_to_marks({"swarm-autoscaler.ready": text}).ready is ready


def api_node(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "ID": "abc123",
        "Version": {"Index": 42},
        "Spec": {
            "Role": "worker",
            "Availability": "drain",
            "Labels": {"swarm-autoscaler.ready": "true", "k": "v"},
        },
        "Description": {"Hostname": "ip-10-0-0-7"},
        "Status": {"State": "down"},
    }
    return raw | overrides


def test_node_from_api() -> None:
    node = node_from_api(api_node())
    assert (node.id, node.hostname, node.availability, node.status) == (
        "abc123",
        "ip-10-0-0-7",
        Availability.DRAIN,
        NodeStatus.DOWN,
    )
    assert not node.is_manager
    assert node.marks == NodeMarks(ready=True)
    assert dict(node.labels) == {"swarm-autoscaler.ready": "true", "k": "v"}


def test_node_without_labels_and_a_manager() -> None:
    node = node_from_api(api_node(Spec={"Role": "manager", "Availability": "active"}))
    assert node.is_manager
    assert dict(node.labels) == {}


@pytest.mark.parametrize("broken", [{"Spec": None}, {"Status": {"State": "exploded"}}, {"Description": {}}])
def test_a_malformed_api_node_is_a_value_error(broken: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="abc123"):
        node_from_api(api_node(**broken))


def test_a_node_still_joining_without_a_hostname_is_left_out_not_an_error() -> None:
    joining = api_node(ID="joining", Description={})
    assert [n.id for n in nodes_from_api([joining, api_node()])] == ["abc123"]


@pytest.mark.parametrize(
    ("labels", "role", "ours"),
    [
        ({"swarm-autoscaler.cluster": "analytics"}, "worker", True),
        ({"swarm-autoscaler.cluster": "other"}, "worker", False),  # another cluster's daemon owns it
        ({"instance-type": "m5.large", "swarm-autoscaler.ready": "true"}, "worker", False),  # placement only
        ({"swarm-autoscaler.cluster": "analytics"}, "manager", False),  # never a manager
        ({}, "worker", False),
    ],
)
def test_ownership_is_the_namespaced_cluster_label_only(
    labels: dict[str, str], role: str, ours: bool
) -> None:
    raw = api_node(Spec={"Role": role, "Availability": "active", "Labels": labels})
    assert node_from_api(raw, cluster_name="analytics").ours is ours
    assert node_from_api(raw).ours is False  # an orchestrator without a cluster name owns nothing
