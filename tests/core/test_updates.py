"""One update per node per phase (core/updates.py) and the table of kinds (core/kinds.py): the plan
states every write act makes, complete, and act only reads the table. Plain dataclasses in, whole
actions out, plus a property over the random worlds the planner's other properties use."""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter

from hypothesis import HealthCheck, given, settings
from tests.builders import NOW, assemble, machine, make_policy
from tests.core.randomized import policies, worlds

from swarm_autoscaler.core import actions as actions_module
from swarm_autoscaler.core.actions import (
    ActivateNode,
    Cordon,
    DrainNode,
    NodeOurs,
    NodeUpdate,
    Stop,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.kinds import KINDS, Phase, kind_of
from swarm_autoscaler.core.model import NodeMarks, Policy, Snapshot
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.steps import MarkChanges, mark
from swarm_autoscaler.core.updates import Labels, node_updates


def test_every_kind_of_action_has_one_row_and_only_terminations_and_stops_are_batched() -> None:
    union = set(typing.get_args(actions_module.Action))
    assert set(KINDS) == union
    assert {k for k, kind in KINDS.items() if kind.batched} == {Terminate, Stop}
    # every action with an effect on a busy machine is re-checked, and runs after the gentle phase
    for kind in KINDS.values():
        if kind.disruptive:
            assert kind.recheck and kind.phase > Phase.GENTLE
    # a take-in (an activation carrying checks) is re-checked after the gentle phase wrote its labels
    assert kind_of(ActivateNode("n", "h", "take in", (NodeOurs("n"),))).phase == Phase.DISRUPT
    assert kind_of(ActivateNode("n", "h", "work")).phase == Phase.GENTLE


def test_later_changes_win_and_keep_leaves_a_mark_alone() -> None:
    first = mark("n", "a", empty_since=1.0, ready=True).changes
    later = mark("n", "b", empty_since=None).changes
    assert first.then(later) == MarkChanges(ready=True, empty_since=None)
    before = NodeMarks(ready=False, empty_since=5.0, drained_since=7.0)
    assert first.then(later).applied(before) == NodeMarks(ready=True, empty_since=None, drained_since=7.0)


def test_a_drained_node_s_marks_ride_with_its_drain_and_its_labels_go_first() -> None:
    snapshot = assemble(machine(1, marks=NodeMarks(ready=True, empty_since=NOW - 100)))
    drain = DrainNode("node-1", "ip-10-0-0-1", "empty", (NodeOurs("node-1"),))
    updates, actions = node_updates(
        snapshot,
        [mark("node-1", "drained", drained_since=NOW, empty_since=None)],
        [Labels("node-1", (("zone", "a"),), "labels")],
        frozenset(),
        [drain],
    )
    assert updates == (NodeUpdate("node-1", "labels", None, (("zone", "a"),)),)
    assert actions == (
        DrainNode(
            "node-1", "ip-10-0-0-1", "empty", (NodeOurs("node-1"),), NodeMarks(True, drained_since=NOW)
        ),
    )


def test_a_cordon_and_an_uncordon_carry_the_node_s_complete_marks() -> None:
    snapshot = assemble(
        machine(1, marks=NodeMarks(ready=True)),
        machine(2, marks=NodeMarks(ready=True, cordoned_since=NOW - 50)),
    )
    cordon = Cordon("node-1", "ip-10-0-0-1", ("a",), "light")
    uncordon = Uncordon("node-2", "ip-10-0-0-2", ("b",), "work")
    updates, actions = node_updates(
        snapshot, [mark("node-1", "idle", empty_since=NOW)], [], frozenset(), [cordon, uncordon]
    )
    assert updates == (NodeUpdate("node-1", "idle", NodeMarks(True, empty_since=NOW)),)
    assert [a.marks for a in actions] == [  # type: ignore[attr-defined]
        NodeMarks(True, empty_since=NOW, cordoned_since=NOW),
        NodeMarks(True),
    ]


def test_a_removed_node_gets_no_update_and_an_unchanged_one_none() -> None:
    snapshot = assemble(machine(1, marks=NodeMarks(ready=True)), machine(2, marks=NodeMarks(ready=True)))
    changes = [mark("node-1", "down", down_since=NOW), mark("node-2", "seen", ready=True)]
    assert node_updates(snapshot, changes, [], frozenset({"node-1"}), []) == ((), ())


REACHED: Counter[str] = Counter()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), policies())
def test_every_plan_has_at_most_one_update_per_node_per_phase(snapshot: Snapshot, policy: Policy) -> None:
    """What act relies on to compute nothing: one gentle NodeUpdate per node at most; a Cordon or an
    Uncordon always carries marks with its cordon mark set or cleared; a drained node's marks are in its
    DrainNode, never in a NodeUpdate of the same plan."""
    result = plan(snapshot, policy)
    updates = [a for a in result.actions if isinstance(a, NodeUpdate)]
    assert len({u.node_id for u in updates}) == len(updates)
    drained = {a.node_id for a in result.actions if isinstance(a, DrainNode)}
    assert not any(u.marks is not None and u.node_id in drained for u in updates)
    for action in result.actions:
        match action:
            case Cordon(marks=marks):
                REACHED["cordon"] += 1
                assert marks is not None and marks.cordoned_since == snapshot.now
            case Uncordon(marks=marks):
                REACHED["uncordon"] += 1
                assert marks is not None and marks.cordoned_since is None
            case DrainNode(marks=marks) if marks is not None:
                REACHED["drain with marks"] += 1


def test_the_property_reached_cordons_uncordons_and_drains_with_marks() -> None:
    """The property above protects these cases only if its worlds go through them."""
    test_every_plan_has_at_most_one_update_per_node_per_phase()
    assert REACHED["cordon"] and REACHED["uncordon"] and REACHED["drain with marks"], REACHED


def test_a_plan_drains_a_node_with_its_marks() -> None:
    snapshot = assemble(machine(1, worker=False, marks=NodeMarks(ready=True, empty_since=NOW - 1000)))
    result = plan(snapshot, make_policy())
    (drain,) = result.of_kind(DrainNode)
    assert drain.marks == NodeMarks(ready=True, drained_since=NOW)  # type: ignore[attr-defined]
    assert not [a for a in result.of_kind(NodeUpdate) if a.node_id == "node-1"]  # type: ignore[attr-defined]


def test_applied_keeps_every_mark_it_does_not_change() -> None:
    """(Each of the six marks kept, one by one: found by mutation testing.)"""
    full = NodeMarks(True, 1.0, 2.0, 3.0, 4.0, 5.0)
    assert MarkChanges().applied(full) == full
    assert MarkChanges(empty_since=None).applied(full) == NodeMarks(True, None, 2.0, 3.0, 4.0, 5.0)


def test_a_removed_node_does_not_stop_the_others_updates_and_an_uncordon_builds_on_the_plan_s_marks() -> None:
    snapshot = assemble(
        machine(1, marks=NodeMarks(ready=True)),
        machine(2, marks=NodeMarks(ready=True, cordoned_since=NOW - 9)),
    )
    changes = [mark("node-1", "down", down_since=NOW), mark("node-2", "work", empty_since=None, ready=True)]
    changes.append(mark("node-2", "idle", empty_since=NOW))
    uncordon = Uncordon("node-2", "ip-10-0-0-2", ("b",), "work")
    updates, actions = node_updates(snapshot, changes, [], frozenset({"node-1"}), [uncordon])
    assert updates == (NodeUpdate("node-2", "work; idle", NodeMarks(True, NOW, cordoned_since=NOW - 9)),)
    assert actions == (dataclasses.replace(uncordon, marks=NodeMarks(True, NOW)),)
