"""What every planning step reads (`Facts`) and returns (`Step`), and how marks are typed. Pure.

plan() runs its steps as functions: each reads the same frozen facts plus, explicitly, what an earlier
step decided (which members received tasks, which types are launched), and returns its actions and
the mark changes it wants (`Mark`, typed field by field: mypy checks every name and value). No step
sees another's side effects; plan() alone assembles the output (`core.updates`: one update per node
per phase).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from swarm_autoscaler.core.actions import Action
from swarm_autoscaler.core.cluster import Fleet, Member
from swarm_autoscaler.core.demand import Demand
from swarm_autoscaler.core.model import NodeMarks, Policy, Snapshot


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


class Keep(enum.Enum):
    """A mark a change leaves as it is (distinct from None, which clears a time mark)."""

    KEEP = "keep"


KEEP = Keep.KEEP
T = TypeVar("T")


def _pick(new: T | Keep, old: T) -> T:
    return old if isinstance(new, Keep) else new


@dataclass(frozen=True, slots=True)
class MarkChanges:
    """The marks a step changes on one node, typed field by field like `NodeMarks` (KEEP: unchanged)."""

    ready: bool | Keep = KEEP
    empty_since: float | Keep | None = KEEP
    drained_since: float | Keep | None = KEEP
    termination_started: float | Keep | None = KEEP
    down_since: float | Keep | None = KEEP
    cordoned_since: float | Keep | None = KEEP

    def then(self, later: MarkChanges) -> MarkChanges:
        """These changes followed by `later` (a later value wins)."""
        return MarkChanges(
            _pick(later.ready, self.ready),
            _pick(later.empty_since, self.empty_since),
            _pick(later.drained_since, self.drained_since),
            _pick(later.termination_started, self.termination_started),
            _pick(later.down_since, self.down_since),
            _pick(later.cordoned_since, self.cordoned_since),
        )

    def applied(self, marks: NodeMarks) -> NodeMarks:
        """`marks` with these changes made."""
        return NodeMarks(
            _pick(self.ready, marks.ready),
            _pick(self.empty_since, marks.empty_since),
            _pick(self.drained_since, marks.drained_since),
            _pick(self.termination_started, marks.termination_started),
            _pick(self.down_since, marks.down_since),
            _pick(self.cordoned_since, marks.cordoned_since),
        )


@dataclass(frozen=True, slots=True)
class Mark:
    """A change a step wants in one node's marks, and why."""

    node_id: str
    why: str
    changes: MarkChanges


def mark(
    node_id: str,
    why: str,
    *,
    ready: bool | Keep = KEEP,
    empty_since: float | Keep | None = KEEP,
    drained_since: float | Keep | None = KEEP,
    termination_started: float | Keep | None = KEEP,
    down_since: float | Keep | None = KEEP,
    cordoned_since: float | Keep | None = KEEP,
) -> Mark:
    """A Mark changing the named marks of `node_id` (None clears a time mark)."""
    changes = MarkChanges(ready, empty_since, drained_since, termination_started, down_since, cordoned_since)
    return Mark(node_id, why, changes)


@dataclass(frozen=True, slots=True)
class Step:
    """What one step decided: its actions (in order), its mark changes, and the nodes it removes from
    the swarm (a removed node gets no marks)."""

    actions: tuple[Action, ...] = ()
    marks: tuple[Mark, ...] = ()
    removed: frozenset[str] = frozenset()


def node_of(member: Member) -> str:
    """The node id of a member known to have a node."""
    assert member.node is not None
    return member.node.id
