"""The safety stop: scale-down halts while too many of our nodes are down. Pure; used by plan().

A network partition between the swarm's managers and its workers (or a failing availability zone)
makes many nodes look down at once. Nothing on those machines need be wrong: their workers may run
tasks behind the partition. Acting on that view would terminate every one of them once
`node_down_timeout` passes, and scale-down would drain and retire what the planner cannot see busy.
So, like Cluster Autoscaler (`--max-total-unready-percentage`, 45%), while more than
`Policy.max_unready_share` of our nodes are not ready (and at least `MIN_UNREADY` of them: one dead
machine is a machine failure, not a partition), the plan holds every step that removes capacity for
idleness or for being down:

- scale-down (retire, drain, terminate or stop idle machines) and consolidation (cordons);
- the termination of a machine whose node stayed down past `node_down_timeout`;
- the termination of a broken machine whose node joined but is down (shrink._cut_off): the daemon had
  not yet seen it ready with a worker when the partition came, and no worker reaches a node its
  managers cannot reach, so "not up with a worker within max_start_time" is what a partition fakes.
  Terminated, it would also leave the count, and the stop could lift while the partition lasts.

Scale-up goes on (tasks still get machines), and so do the repairs that remove nothing a partition
can hide: machines that never joined (no node), a broken machine whose node is ready, stopped
machines outside the warm pool, nodes whose instance EC2 says is gone or shutting down, and the
machines EC2 takes back (interrupt.py). `Plan.halted` says why; the daemon logs one warning when the
stop begins and one line when it ends, and exposes `autoscaler_scale_down_halted`.
"""

from __future__ import annotations

from swarm_autoscaler.core.cluster import Bucket, Fleet
from swarm_autoscaler.core.model import NodeStatus

# A single node down never halts scale-down, whatever the fleet's size.
MIN_UNREADY = 2

# The buckets whose nodes count: every owned machine with a node, except those we are terminating
# (their nodes are expected to go down).
_COUNTED = (
    Bucket.JOINING,
    Bucket.ACTIVE,
    Bucket.RETIRING,
    Bucket.DRAINED,
    Bucket.RESERVE,
    Bucket.DISCONNECTED,
    Bucket.BROKEN,
    Bucket.INTERRUPTED,
)


def unready(cluster: Fleet) -> tuple[int, int]:
    """(our nodes not ready, our nodes), counting the members of `_COUNTED` that have a node."""
    nodes = [m.node for b in _COUNTED for m in cluster.bucket(b) if m.node is not None]
    return sum(1 for n in nodes if n.status != NodeStatus.READY), len(nodes)


def halt_reason(cluster: Fleet, max_share: float) -> str:
    """Why scale-down halts on this fleet ("" when it does not)."""
    down, total = unready(cluster)
    if down < MIN_UNREADY or down <= max_share * total:
        return ""
    return (
        f"{down} of {total} owned nodes are down or unreachable (more than {max_share:.0%}): "
        "scale-down halts until they are back (scale-up goes on)"
    )
