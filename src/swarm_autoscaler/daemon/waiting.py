"""Actions the planner asks for again tick after tick without their being carried out.

The plan is rebuilt every tick, so an action left to the next tick (the deadline, a failure, a skip)
comes back as a new, equal action. `Waiting` recognises it by what it is for (`key`: its kind and the
node, workers, instances or type it names) and counts the ticks and the time it has waited. `act` starts
the oldest first (`age`); the metrics publish the oldest wait; the loop logs ONE warning line in a tick
where some action has just waited more than `warn_after` ticks.

Process memory only, on purpose: it orders work and reports on it, it decides nothing. A restart
starts every count afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Action, Plan
from swarm_autoscaler.daemon.jobs import Outcome

# An action that waited more than this many ticks gets the warning line.
WARN_AFTER_TICKS = 5

Key = tuple[str, ...]


def key(action: Action) -> Key:
    """What an action is for, equal across ticks for the same intent (its reason and marks may differ)."""
    kind = type(action).__name__
    for name in ("node_id", "addresses", "instance_ids", "type_name"):
        value = getattr(action, name, None)
        if value is not None and value != ():
            return (kind, name, *((value,) if isinstance(value, str) else tuple(sorted(value))))
    return (kind,)


@dataclass(slots=True)
class _Wait:
    since: float  # `Snapshot.now` of the first tick that planned it and did not carry it out
    ticks: int


@dataclass(frozen=True, slots=True)
class Overdue:
    """Actions that have just waited more than `WARN_AFTER_TICKS` ticks (for the warning line)."""

    kinds: dict[str, int]
    oldest_ticks: int
    oldest_seconds: float


class Waiting:
    """Per action key, since when and for how many ticks it has been planned and not carried out."""

    def __init__(self, warn_after: int = WARN_AFTER_TICKS) -> None:
        self.warn_after = warn_after
        self._waits: dict[Key, _Wait] = {}

    def age(self, action: Action) -> int:
        """The ticks `action` (its key) has waited so far: 0 for one planned for the first time."""
        wait = self._waits.get(key(action))
        return 0 if wait is None else wait.ticks

    def oldest(self, now: float) -> float:
        """Seconds the oldest action still waiting has waited (0 when none waits)."""
        return max((now - w.since for w in self._waits.values()), default=0.0)

    def update(self, now: float, plan: Plan, outcomes: Sequence[Outcome]) -> Overdue | None:
        """Take one acted tick in: an action carried out, or no longer planned, stops waiting; one not
        carried out waits one tick more. Returns what has just passed `warn_after` ticks, if anything."""
        done = {key(o.action) for o in outcomes if o.ok}
        planned = {key(a) for a in plan.actions}
        waiting = planned - done
        self._waits = {k: w for k, w in self._waits.items() if k in waiting}
        overdue: dict[str, int] = {}
        for k in sorted(waiting):
            wait = self._waits.setdefault(k, _Wait(now, 0))
            wait.ticks += 1
            if wait.ticks == self.warn_after + 1:
                overdue[k[0]] = overdue.get(k[0], 0) + 1
        if not overdue:
            return None
        oldest = max(self._waits.values(), key=lambda w: (w.ticks, now - w.since))
        return Overdue(overdue, oldest.ticks, now - oldest.since)
