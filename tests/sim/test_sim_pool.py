"""The simulator's warm pool: stopped machines pay only their disk, a start joins faster than a launch,
refused starts fall through to launches, and the bundled gpu_pool scenario runs with and without a pool."""

from __future__ import annotations

import pytest

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import InstanceState, PoolPhase
from swarm_autoscaler_lab.sim import pooltable
from swarm_autoscaler_lab.sim.workloads import POOL_SCENARIOS
from swarm_autoscaler_lab.sim.world import EPOCH, Knobs, World


def _world() -> World:
    return World({"g4dn.xlarge": CATALOGUE["g4dn.xlarge"]}, {}, {}, Knobs(join_jitter_s=0.0))


def test_a_pool_machine_prepares_stops_and_starts_faster_than_a_launch() -> None:
    world = _world()
    [inst] = world.launch("g4dn.xlarge", 1, {}, pool=True).instances
    world.advance(EPOCH + 89)
    assert world.instances[inst.id].state is InstanceState.PENDING and not world.nodes
    world.advance(EPOCH + 91)  # prepared: stops itself, never joined
    assert world.instances[inst.id].state is InstanceState.STOPPED and not world.nodes
    started, refused = world.start([inst.id])
    assert [i.pool for i in started] == [PoolPhase.START] and refused == []
    world.advance(EPOCH + 91 + 30)  # pool_start_s
    assert world.instances[inst.id].state is InstanceState.RUNNING and len(world.nodes) == 1


def test_a_stopped_machine_pays_its_volume_only() -> None:
    world = _world()
    [_inst] = world.launch("g4dn.xlarge", 1, {}, pool=True).instances
    world.advance(EPOCH + 90)
    running = world.cost_usd
    assert running == pytest.approx(90 * CATALOGUE["g4dn.xlarge"].price_per_hour / 3600)  # type: ignore[operator]
    world.advance(EPOCH + 90 + 730 * 3600)  # a month stopped
    world.bill_open(world.now)
    assert world.disk_usd == pytest.approx(100 * 0.08)
    assert world.cost_usd == pytest.approx(running + 8.0)


def test_the_gpu_pool_scenario_with_and_without_a_pool(tmp_path: object) -> None:
    from pathlib import Path

    env = Path(str(tmp_path)) / "gpu_pool.env"
    # The launch counts compared last are the first seed's at a 2m termination delay (35 against 34). At the 1m
    # default the refused starts' launches and the refills they spare happen to balance on the first seed (34 and
    # 34; 36 against 34 over five seeds), so the delay this check was measured at is set here.
    # Idle learning (core/arrivals.py) shortens these delays on this trace's gaps: off, so that the check
    # stays on the delay it was measured at (it is about starts falling through, not idle time).
    settings = "AUTOSCALER_TERMINATION_DELAY=2m\nAUTOSCALER_IDLE_LEARNING=false\n"
    env.write_text(POOL_SCENARIOS["gpu_pool"][1] + settings, encoding="utf-8")
    pool = pooltable._run(str(env), True, 0, 0.0, 100.0)
    plain = pooltable._run(str(env), False, 0, 0.0, 100.0)
    refused = pooltable._run(str(env), True, 0, 0.3, 100.0)
    for run in (pool, plain, refused):
        assert (
            run["completed_jobs"] == run["jobs"] and not run["busy_terminations"] and not run["max_exceeded"]
        )
    assert pool["pool_starts"] > 0 and plain["pool_starts"] == 0 and pool["disk_usd"] > 0
    print(
        f"\np95 wait: pool {pool['wait_p95_s']} s, no pool {plain['wait_p95_s']} s, 30% starts refused {refused['wait_p95_s']} s"
    )
    assert pool["wait_p95_s"] < 0.6 * plain["wait_p95_s"]
    assert refused["launches"] > pool["launches"]  # refused starts fell through to launches
