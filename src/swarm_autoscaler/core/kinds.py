"""The one table of action kinds that the planner and `act` both read. Pure data.

For every kind of action: the phase it runs in (the order), the lane it takes (its concurrency),
whether it is re-checked on a fresh read right before it runs, whether it is batched into one cloud
call behind a fence, whether it runs to its end past the hard stop, and whether it disrupts a machine
(the actions a disruption budget and do-not-disrupt hold back). `act` is a generic executor of this
table: it never decides what an action means, only when and how it runs.

Phases, in order (a node has at most one update per phase, `core.updates`):

- GENTLE: nothing it does can hurt a busy machine (launches, starts, uncordons, a drained node
  activated for pending work, node bookkeeping); it makes the world more like the plan assumes.
- RETIRE: retirements, each re-checked on a fresh read taken after the gentle phase.
- DISRUPT: drains, cordons, removals, terminations and stops, and the take-in of a node that joined
  paused, each re-checked on the latest read (taken again if a retirement ran); terminations and stops
  are fenced and batched.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from swarm_autoscaler.core.actions import (
    Action,
    ActivateNode,
    Cordon,
    DrainNode,
    Launch,
    NodeUpdate,
    RemoveNode,
    RetireWorkers,
    Start,
    Stop,
    Terminate,
    Uncordon,
)


class Phase(enum.IntEnum):
    GENTLE = 1
    RETIRE = 2
    DISRUPT = 3


class Lane(enum.Enum):
    """SAFETY: the bounded lane every action with an effect on a machine takes; BOOKKEEPING: a node's
    marks and labels when it has nothing else in the plan (half the slots, beside the phases: it never
    holds a slot a retirement or a drain waits for)."""

    SAFETY = "safety"
    BOOKKEEPING = "bookkeeping"


@dataclass(frozen=True, slots=True)
class Kind:
    """How one kind of action is carried out (see the module docstring)."""

    phase: Phase
    recheck: bool = False
    batched: bool = False
    finish_past_deadline: bool = False
    disruptive: bool = False


GENTLE = Kind(Phase.GENTLE)
# A cancelled RunInstances or StartInstances may still start machines: they run to their end.
STARTS_MACHINES = Kind(Phase.GENTLE, finish_past_deadline=True)
# Once TerminateInstances (StopInstances) went out the step runs to its end: it was re-checked, and cut
# short it would leave nodes behind and report as undone what was done.
ENDS_MACHINES = Kind(Phase.DISRUPT, recheck=True, batched=True, finish_past_deadline=True, disruptive=True)
DISRUPTS_NODE = Kind(Phase.DISRUPT, recheck=True, disruptive=True)
# A node that joined paused, taken in: re-checked after the gentle phase wrote its labels (the ownership
# label is what its re-check wants to see). Not disruptive: it gives the node work, takes none away.
TAKE_IN = Kind(Phase.DISRUPT, recheck=True)

KINDS: dict[type[Action], Kind] = {
    NodeUpdate: GENTLE,
    Uncordon: GENTLE,
    ActivateNode: GENTLE,
    Launch: STARTS_MACHINES,
    Start: STARTS_MACHINES,
    RetireWorkers: Kind(Phase.RETIRE, recheck=True, disruptive=True),
    DrainNode: DISRUPTS_NODE,
    Cordon: DISRUPTS_NODE,
    RemoveNode: DISRUPTS_NODE,
    Terminate: ENDS_MACHINES,
    Stop: ENDS_MACHINES,
}


def kind_of(action: Action) -> Kind:
    """The kind of `action`: its type's row, except an activation carrying checks (a take-in). An object
    of no known kind is taken as gentle: act runs it first, where performing it fails as an error
    outcome (no port is called)."""
    if isinstance(action, ActivateNode) and action.expect:
        return TAKE_IN
    return KINDS.get(type(action), GENTLE)
