"""`swarm-autoscaler demo --clusters 3 --fast --json` as a real subprocess: the keeper built from settings
(EC2 adapter on a moto server, redis locks on a real redis-server, its HTTP API), three users' clusters
booted by the keeper's local cloud, each with a real dask scheduler and its own autoscaler."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.e2e.helpers import run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.no_dockerd, pytest.mark.timeout(300)]


def test_three_users_clusters_are_created_scale_and_all_end(tmp_path: Path) -> None:
    done, result, context = run_demo(["--clusters", "3", "--fast"], tmp_path)

    assert result["clusters_created"] == 3 and result["clusters_ended"] == 3, context
    assert result["errors"] == {}, context
    assert result["tasks_done"] == result["tasks"] > 0, context
    # Each cluster's own autoscaler launched workers for its user's work (more work, more workers).
    peaks = result["peak_workers"]
    assert all(peaks[u] >= 1 for u in ("user1", "user2", "user3")), context
    assert peaks["user3"] >= peaks["user1"], context
    # Every instance launched (3 primaries and their workers) was terminated: nothing leaks.
    assert result["launches"] >= 3 + sum(peaks.values()), context
    assert result["terminations"] == result["launches"], context
    assert result["final_instances"] == 0, context
    # Each wallet's spend, as the keeper's usage counts it, is shown (at least its primary's minute).
    costs = result["wallet_cost_usd"]
    assert len(costs) == 3 and all(c is not None and c > 0 for c in costs.values()), context
    assert set(result) >= {
        "clusters_created",
        "clusters_ended",
        "launches",
        "terminations",
        "final_instances",
        "wall_s",
    }
    assert done.returncode == 0, context
