"""`swarm-autoscaler demo --mode dynamic --fast` as a real subprocess: the daemon in the dynamic mode on the
embedded local cloud (moto EC2, emulated machines, the in-memory swarm), its swarm services adapter reading
the services and tasks through the Docker Engine API imitation. The demo's phases wait for the fleet to
settle, not for a time; the outcome is asserted, not how long it took."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tests.e2e.helpers import CLI, run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.no_dockerd, pytest.mark.timeout(300)]


def test_dynamic_demo_places_services_on_launched_machines_and_settles(tmp_path: Path) -> None:
    done, result, context = run_demo(["--mode", "dynamic", "--fast"], tmp_path)

    assert result["mode"] == "dynamic" and result["phases_settled"] == ["up", "down", "end"], context
    # 3 notebooks + 2 solvers placed, the solvers on the type their constraint names
    assert result["placements"] >= 5 and "m5.xlarge" in result["placed_on_types"], context
    assert "placed solver." in done.stdout and "(m5.xlarge)" in done.stdout, context
    assert result["unplaceable_tasks"] == ["legacy.0001"], context
    assert "node.labels.zone==onprem" in result["unplaceable_reasons"][0], context
    # machines bought for the tasks, then given back. Swarm places by its own spread, not by the planner's
    # assignment: a notebook may take the room of a machine launched for a solver, which then costs one
    # more launch (docs/dynamic-mode.md): at most two per task, plus the reserve
    assert 3 <= result["launches"] <= 2 * 5 + result["min_plus_reserve"], context
    assert result["terminations"] == result["launches"] - result["final_instances"], context
    assert result["final_instances"] == result["min_plus_reserve"], context
    assert result["busy_disruptions"] == 0 and result["disruptions"] == [], context
    assert done.returncode == 0, context


def test_dynamic_demo_refuses_a_real_swarm() -> None:
    done = subprocess.run(
        [str(CLI), "demo", "--mode", "dynamic", "--swarm"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--mode dynamic runs on the in-memory swarm" in done.stderr
