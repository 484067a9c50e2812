"""Which nodes get a mark stamped in the future restamped (core/clockmarks.py): ours, by label or by the
hostname of one of our instances, and no other. The mutation run found this selection without a test:
a node of another owner (or a manager) listed first, or carrying a future mark itself, changed nothing."""

from __future__ import annotations

from tests.builders import NOW, assemble, make_instance, make_node

from swarm_autoscaler.core.clockmarks import future_marks
from swarm_autoscaler.core.model import NodeMarks

AHEAD = NodeMarks(ready=True, empty_since=NOW + 3600)  # a clock an hour ahead wrote it


def test_only_our_nodes_future_marks_are_restamped() -> None:
    foreign = make_node(1, marks=AHEAD, ours=False)  # another owner's node, no instance of ours
    manager = make_node(2, marks=AHEAD, manager=True)
    orphan = make_node(3, marks=AHEAD)  # ours by label; its instance is gone
    unlabelled = make_node(4, marks=AHEAD, ours=False)  # not labelled yet, but our instance's host
    snapshot = assemble(
        (None, foreign, None),
        (None, manager, None),
        (None, orphan, None),
        (make_instance(4), unlabelled, None),
    )
    assert list(future_marks(snapshot)) == [
        ("node-3", {"empty_since": NOW}),
        ("node-4", {"empty_since": NOW}),
    ]
