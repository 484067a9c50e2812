"""What every planning step reads (`Facts`) and returns (`Step`), and how marks are merged. Pure.

plan() runs its steps as functions: each reads the same frozen facts plus, explicitly, what an earlier
step decided (which members received tasks, which types are launched), and returns its actions and
the mark changes it wants. No step sees another's side effects; plan() alone assembles the output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Action, MarkNode
from swarm_autoscaler.core.cluster import Fleet, Member
from swarm_autoscaler.core.demand import Demand
from swarm_autoscaler.core.model import NodeMarks, Policy, Snapshot

MarkValue = float | bool | None


@dataclass(frozen=True, slots=True)
class Facts:
    """The inputs of one plan, classified and estimated once."""

    snapshot: Snapshot
    policy: Policy
    cluster: Fleet
    demand: Demand

    @property
    def now(self) -> float:
        return self.snapshot.now


@dataclass(frozen=True, slots=True)
class Mark:
    """A change a step wants in one node's marks (field name -> new value; None clears), and why."""

    node_id: str
    why: str
    changes: tuple[tuple[str, MarkValue], ...]


def mark(node_id: str, why: str, **changes: MarkValue) -> Mark:
    unknown = set(changes) - {f.name for f in dataclasses.fields(NodeMarks)}
    assert not unknown, unknown
    return Mark(node_id, why, tuple(changes.items()))


@dataclass(frozen=True, slots=True)
class Step:
    """What one step decided: its actions (in order), its mark changes, and the nodes it removes from
    the swarm (a removed node gets no marks)."""

    actions: tuple[Action, ...] = ()
    marks: tuple[Mark, ...] = ()
    removed: frozenset[str] = frozenset()


def mark_actions(snapshot: Snapshot, marks: Iterable[Mark], removed: frozenset[str]) -> list[MarkNode]:
    """One MarkNode per node whose marks change, carrying its complete new NodeMarks. Changes apply in
    the order given (a later step's value wins); the reasons of every change are kept, in order."""
    current: Mapping[str, NodeMarks] = {n.id: n.marks for n in snapshot.nodes}
    changes: dict[str, dict[str, MarkValue]] = {}
    why: dict[str, list[str]] = {}
    for m in marks:
        changes.setdefault(m.node_id, {}).update(m.changes)
        why.setdefault(m.node_id, []).append(m.why)
    out = []
    for node_id in sorted(changes):
        if node_id in removed:
            continue
        new = dataclasses.replace(current[node_id], **changes[node_id])  # type: ignore[arg-type]
        if new != current[node_id]:
            out.append(MarkNode(node_id, new, "; ".join(dict.fromkeys(why[node_id]))))
    return out


def node_of(member: Member) -> str:
    """The node id of a member known to have a node."""
    assert member.node is not None
    return member.node.id
