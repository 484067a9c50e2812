"""How many clusters one keeper replica may hold: its share. Pure: no I/O, no clock.

Every replica lists every cluster and counts the live replicas (each heartbeats its presence with the
lease's TTL), so each computes the same share, `ceil(clusters / replicas)`. A replica below its share
may take a free lease; one at its share leaves the others' alone; one above it (a replica joined, or
clusters ended) gives up its surplus, one cluster at a time and only between two checks of that cluster,
never in the middle of an action. With every replica at most at its share and `replicas * share >=
clusters`, every cluster has a holder once the replicas agree on both counts (one listing and one
heartbeat apart).
"""

from __future__ import annotations

import enum
import math


class LeaseStep(enum.Enum):
    CLAIM = "claim"  # take (or refresh) the cluster's lease, then check it
    SKIP = "skip"  # leave it to the other replicas
    RELEASE = "release"  # give the lease up: this replica holds more than its share


def share(clusters: int, replicas: int) -> int:
    """The most clusters one replica may hold: `ceil(clusters / replicas)` (all of them alone)."""
    return math.ceil(max(clusters, 0) / max(replicas, 1))


def lease_step(*, holding: bool, held: int, clusters: int, replicas: int) -> LeaseStep:
    """What a replica holding `held` leases (this cluster's included when `holding`) does about one
    cluster before its check."""
    limit = share(clusters, replicas)
    if holding:
        return LeaseStep.RELEASE if held > limit else LeaseStep.CLAIM
    return LeaseStep.CLAIM if held < limit else LeaseStep.SKIP
