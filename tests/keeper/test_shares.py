"""A replica's share of the clusters (`keeper.shares`): at most ceil(clusters / replicas) each, a free
lease taken below it, others' left alone at it, a surplus given up above it."""

from __future__ import annotations

import pytest

from swarm_autoscaler.keeper.shares import LeaseStep, lease_step, share


@pytest.mark.parametrize(
    ("clusters", "replicas", "expected"),
    [(30, 3, 10), (31, 3, 11), (30, 2, 15), (2, 3, 1), (0, 3, 0), (5, 1, 5), (5, 0, 5)],
)
def test_the_share_is_the_clusters_over_the_replicas_rounded_up(
    clusters: int, replicas: int, expected: int
) -> None:
    assert share(clusters, replicas) == expected
    assert share(clusters, max(replicas, 1)) * max(replicas, 1) >= clusters  # every cluster has a place


def test_below_its_share_a_replica_claims_at_it_it_skips_above_it_it_releases() -> None:
    assert lease_step(holding=False, held=9, clusters=30, replicas=3) is LeaseStep.CLAIM
    assert lease_step(holding=False, held=10, clusters=30, replicas=3) is LeaseStep.SKIP
    assert lease_step(holding=True, held=10, clusters=30, replicas=3) is LeaseStep.CLAIM  # refresh
    assert lease_step(holding=True, held=15, clusters=30, replicas=3) is LeaseStep.RELEASE  # one joined
    assert lease_step(holding=False, held=10, clusters=30, replicas=2) is LeaseStep.CLAIM  # one died
