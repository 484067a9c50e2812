"""`swarm-autoscaler demo --fast` as a real subprocess: the whole daemon on the embedded local cloud
(moto EC2, a dask scheduler, emulated machines with real dask workers, the in-memory swarm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.e2e.helpers import run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.no_dockerd, pytest.mark.timeout(300)]

TASKS = 30


def test_fast_demo_scales_up_runs_everything_placeable_and_settles(tmp_path: Path) -> None:
    done, result, context = run_demo(["--fast", "--tasks", str(TASKS), "--out-dir", str(tmp_path)], tmp_path)

    assert result["submitted_tasks"] == TASKS + 1, context  # the workload plus the impossible task
    assert result["peak_instances"] > 1, context
    assert result["launches"] >= result["peak_instances"], context
    assert result["completed_tasks"] == TASKS, context  # all but the impossible one
    assert result["unplaceable_keys"] == ["job-impossible"], context
    assert result["terminations"] >= 1, context
    assert result["final_instances"] == result["min_plus_reserve"], context
    assert result["settled"] is True, context
    png = Path(result["timeline_png"])
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", context
    assert done.returncode == 0, context
    # its scheduler runs as the README deploys one (docker/scheduler-stack.yml: the packing preload), so
    # the daemon's start-up warning about a scheduler without it is not the first thing a newcomer sees
    assert "runs without the packing preload" not in done.stdout + done.stderr, context
