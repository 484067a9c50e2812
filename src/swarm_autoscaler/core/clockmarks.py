"""Lifecycle marks stamped in the future: restart their delay from now. Pure; used by `plan()`.

A mark (`empty_since`, `drained_since`, `termination_started`, `down_since`, `cordoned_since`) is the
`Snapshot.now` of the tick that wrote it. Every replica takes `now` from the cloud's clock (EC2's, see
adapters/ec2_clock.py), so replicas agree to within a second or two. A mark further ahead than
`FUTURE_TOLERANCE` was nevertheless written by a clock ahead of ours: a daemon of an older version
that used its host's wall clock, or a host whose EC2 clock was not yet synced.

Counting from such a mark would freeze its delay until our clock catches up (an hour, for a clock an
hour ahead); treating it as expired would fire the delay early. Neither is safe, so the mark is
restamped with `now`: the delay restarts from the first tick that sees it. Whatever the skew, the
delay then fires no earlier than it would have from the real moment the mark was written (that moment
is not after `now`), and at most one delay later. The tick that restamps reads the old value, whose
elapsed time is negative, so nothing fires on it either.

A mark written by a clock *behind* ours cannot be told from an older mark; this is why every replica
must use the cloud's clock rather than its own.
"""

from __future__ import annotations

from collections.abc import Iterator

from swarm_autoscaler.core.model import Snapshot
from swarm_autoscaler.core.steps import KEEP, Keep, Mark, mark

# Marks at most this far ahead of now are left alone: two replicas' readings of EC2's clock differ by
# about a second (its Date header has whole seconds), and a delay a few seconds late is harmless.
FUTURE_TOLERANCE = 5.0

TIME_MARKS = ("empty_since", "drained_since", "termination_started", "down_since", "cordoned_since")


def future_marks(snapshot: Snapshot) -> Iterator[tuple[str, dict[str, float]]]:
    """(node id, {mark: now}) for every node of ours carrying time marks stamped beyond now +
    FUTURE_TOLERANCE, in node order. Managers, and nodes that are neither labelled ours nor matched by
    hostname to one of our instances, are never touched."""
    limit = snapshot.now + FUTURE_TOLERANCE
    owned_hosts = {i.hostname for i in snapshot.instances}
    for node in snapshot.nodes:
        if node.is_manager or not (node.ours or node.hostname in owned_hosts):
            continue
        ahead = {name: snapshot.now for name in TIME_MARKS if (getattr(node.marks, name) or 0.0) > limit}
        if ahead:
            yield node.id, ahead


RESTAMPED = "mark stamped in the future (a clock ahead): delay restarts now"


def restamps(snapshot: Snapshot) -> tuple[Mark, ...]:
    """The Mark restamping each node's future marks with now (`future_marks`), field by field."""
    out = []
    for node_id, ahead in future_marks(snapshot):

        def at(name: str, ahead: dict[str, float] = ahead) -> float | Keep:
            return ahead.get(name, KEEP)

        out.append(
            mark(
                node_id,
                RESTAMPED,
                empty_since=at("empty_since"),
                drained_since=at("drained_since"),
                termination_started=at("termination_started"),
                down_since=at("down_since"),
                cordoned_since=at("cordoned_since"),
            )
        )
    return tuple(out)
