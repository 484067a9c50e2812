"""Assembling one update per node per phase from what the planning steps decided. Pure; used by plan().

The steps return mark changes (`steps.Mark`, typed) and the labels a joined node lacks (`Labels`); this
module alone turns them into what `act` writes, so that a node's next state is decided in one place
and act never computes a mark:

- GENTLE phase: one `NodeUpdate` per node whose marks change or that lacks labels, carrying its
  complete new marks (the snapshot's with every change applied, a later step's value winning) and the
  labels, written in ONE orchestrator call. A node the plan removes gets none.
- The marks of a node the plan drains wait for its drain: they go in its `DrainNode` (DISRUPT phase,
  skipped with it), not in its NodeUpdate (which keeps its labels: the ownership label among them is
  what the drain's re-check wants to see, `NodeOurs`).
- So do the marks of a node the plan terminates (its node not removed by the plan): they go in its
  `Terminate`, with `termination_started` = now (kept when set before), written only when the
  termination goes ahead. A node drained and terminated in one plan: its DrainNode carries the marks
  without `termination_started`, its Terminate with it.
- A `Cordon` carries the node's complete new marks with `cordoned_since` = now (written before the
  worker is cordoned, so that a restart knows), an `Uncordon` those with `cordoned_since` cleared
  (written after the worker is set running).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Action, Cordon, DrainNode, NodeUpdate, Terminate, Uncordon
from swarm_autoscaler.core.model import NodeMarks, Snapshot
from swarm_autoscaler.core.steps import Mark, MarkChanges


@dataclass(frozen=True, slots=True)
class Labels:
    """Labels a node lacks (the ones its instance was launched with), and why."""

    node_id: str
    labels: tuple[tuple[str, str], ...]
    why: str


def new_marks(snapshot: Snapshot, marks: Iterable[Mark], removed: frozenset[str]) -> dict[str, NodeMarks]:
    """Node id -> its complete new marks, for every node (not removed) whose marks the plan changes."""
    current: Mapping[str, NodeMarks] = {n.id: n.marks for n in snapshot.nodes}
    changes: dict[str, MarkChanges] = {}
    for m in marks:
        changes[m.node_id] = changes.get(m.node_id, MarkChanges()).then(m.changes)
    out = {}
    for node_id, change in changes.items():
        if node_id in removed:
            continue
        new = change.applied(current[node_id])
        if new != current[node_id]:
            out[node_id] = new
    return out


def node_updates(
    snapshot: Snapshot,
    marks: Sequence[Mark],
    labels: Sequence[Labels],
    removed: frozenset[str],
    actions: Sequence[Action],
) -> tuple[tuple[NodeUpdate, ...], tuple[Action, ...]]:
    """(the NodeUpdates, in node order; `actions` with the marks their node update carries filled in).
    Reasons are kept, in order, each once."""
    changed = new_marks(snapshot, marks, removed)
    ending = {a.node_ids[0] for a in actions if isinstance(a, Terminate) and len(a.node_ids) == 1} - removed
    waiting = {a.node_id for a in actions if isinstance(a, DrainNode)} | ending  # marks ride there
    why: dict[str, list[str]] = {}
    for m in marks:
        if m.node_id in changed:
            why.setdefault(m.node_id, []).append(m.why)
    lacking = {entry.node_id: entry for entry in labels}
    updates = []
    for node_id in sorted(set(changed) - waiting | set(lacking)):
        label = lacking.get(node_id)
        reasons = why.get(node_id, []) if node_id not in waiting else []
        reasons += [label.why] if label is not None else []
        updates.append(
            NodeUpdate(
                node_id,
                "; ".join(dict.fromkeys(reasons)),
                None if node_id in waiting else changed.get(node_id),
                label.labels if label is not None else (),
            )
        )
    current = {n.id: n.marks for n in snapshot.nodes}
    now = snapshot.now
    filled: list[Action] = []
    for action in actions:
        match action:
            case DrainNode(node_id=node_id) if node_id in changed:
                filled.append(dataclasses.replace(action, marks=changed[node_id]))
            case Terminate(node_ids=(node_id,)) if node_id in ending:
                base = changed.get(node_id, current[node_id])
                if base.termination_started is None:
                    base = dataclasses.replace(base, termination_started=now)
                filled.append(action if base == current[node_id] else dataclasses.replace(action, marks=base))
            case Cordon(node_id=node_id):
                base = changed.get(node_id, current[node_id])
                filled.append(
                    dataclasses.replace(action, marks=dataclasses.replace(base, cordoned_since=now))
                )
            case Uncordon(node_id=node_id):
                base = changed.get(node_id, current[node_id])
                filled.append(
                    dataclasses.replace(action, marks=dataclasses.replace(base, cordoned_since=None))
                )
            case _:
                filled.append(action)
    return tuple(updates), tuple(filled)
