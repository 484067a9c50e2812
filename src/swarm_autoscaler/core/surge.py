"""Per-type queue thresholds: "surge only when more than N tasks wait". Pure; used by scale-up.

A type may carry `TypePolicy.surge_above` = N > 0: while a worker of that type is up and takes tasks
(an active, uncordoned member with a connected worker), new machines of the type are launched only when
more than N pending tasks would go on them; N or fewer wait for the machines already there (dask runs
them as room frees up). A drained or reserve machine of the type counts as such a worker: it is the
base, drained or not, and scale-up activates it for the queue (before, a drained base launched surge
machines for a queue an active one held back). With no such worker (none up yet, or all cordoned or drained) the threshold does
not apply: a task no worker can start would otherwise wait for ever. This is the always-on base plus
queue-length surge of a GPU fleet (scale-out only past a queue length): base capacity from `min_instances` or a
`reserve`, surge machines only for a real queue. `tolerated_wait` is the other knob of the same trade:
it holds back tasks dask's estimates say start soon; the threshold holds back a short queue whatever
the estimates say.
"""

from __future__ import annotations

from collections.abc import Sequence

from swarm_autoscaler.core.cluster import Fleet
from swarm_autoscaler.core.model import Policy
from swarm_autoscaler.core.placement import NewBins

BELOW_SURGE = "below-surge"  # `Plan.placed`: tasks left to the workers of a type, at or below its threshold


def below_threshold(
    new_bins: Sequence[NewBins], cluster: Fleet, policy: Policy, unplaced: int = 0
) -> dict[str, int]:
    """Type name -> the number of pending tasks `new_bins` put on new machines of that type, for each
    type whose launches the threshold holds back (N or fewer tasks, and a worker of the type up).
    `unplaced`: pending tasks left without capacity (the launch budget or max_instances ran out): they
    count as waiting for every type, so a queue longer than the budget is never held back."""
    tasks: dict[str, int] = {}
    for b in new_bins:
        tasks[b.type_name] = tasks.get(b.type_name, 0) + b.count * b.tasks_each
    up = {m.type_name for m in cluster.active if m.workers and not m.cordoned}
    # A drained or reserve machine of the type is base capacity too (scale-up activates it for the
    # queue): counted as up, so a drained base holds a short queue as an active one does.
    up |= {m.type_name for m in (*cluster.drained, *cluster.reserve)}
    held = {}
    for type_name, n in tasks.items():
        tp = policy.type_policy(type_name)
        if tp is not None and tp.surge_above > 0 and n + unplaced <= tp.surge_above and type_name in up:
            held[type_name] = n
    return held
