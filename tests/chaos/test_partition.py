"""The safety stop in the chaos world (core/safety.py, docs/planning.md rule 11): the real
`swarm-autoscaler run` against the chaos world (`localcloud/cloudhost.py`: moto EC2 over HTTP, a real
dask scheduler and workers, the in-memory swarm behind the Docker Engine API imitation). Mid-backlog a
network partition between the swarm's managers and its workers makes 60% of the nodes look down for
twice `AUTOSCALER_NODE_DOWN_TIMEOUT`, while their machines and dask workers run on. The world records
every retirement's drain, removal and termination of a partitioned host while the partition lasts:
there must be none. Without the stop (AUTOSCALER_MAX_UNREADY_SHARE=1, seed 184640, run by hand on
2026-12-05) all 4 partitioned machines were terminated and their nodes removed; with it, none. The
daemon logs a `scale-down halted` warning; after the partition heals, the fleet settles as usual.
The partition comes once the fleet is full (8 workers): in a growing fleet the share is diluted."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from swarm_autoscaler_lab.localcloud.chaos import ChaosConfig, ChaosReport, run_chaos
from swarm_autoscaler_lab.localcloud.cloudhost import WorldOptions

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]


# A world whose fleet is not full when the partition is due tests nothing (the premise of 45% is not
# reached): it is run again under the next seed, at most this many worlds in all, and each is printed. A
# fresh-clone run once met a world whose fleet never filled (seed 183211: 6 launches, 0 of 8 workers).
WORLDS = 3


def _world(seed: int, tmp_path: Path) -> ChaosReport:
    print(f"\npartition seed: {seed} (replay with CHAOS_SEED={seed})")
    config = ChaosConfig(
        seed=seed,
        world=WorldOptions(seed=seed, max_instances=8, keep_rate=0.0, strict_ec2=True),
        backlog=300,
        task_seconds=(0.5, 2.0),
        kill_at=None,
        cancel_at=60.0,
        partition=(20.0, 20.0, 0.6),  # node_down_timeout is 10 s in the chaos timing
    )
    report = run_chaos(config, tmp_path)
    print(report.summary())
    print(
        f"  partitioned: {report.partitioned} of {report.partition_fleet} worker node(s); "
        f"their disruptions: {report.partition_disruptions}"
    )
    return report


def test_a_partition_that_makes_most_nodes_look_down_disrupts_none_of_them(tmp_path: Path) -> None:
    raw = os.environ.get("CHAOS_SEED")
    seed = int(raw) if raw else random.SystemRandom().randrange(1_000_000)
    for attempt in range(WORLDS):
        world_path = tmp_path / f"world{attempt}"
        world_path.mkdir()
        report = _world(seed + attempt, world_path)
        if report.partitioned >= 2 and report.partition_fleet >= 8:
            break
        # Not tested: whatever it did is printed above, and nothing of it is counted.
        print(f"  world {attempt + 1} of {WORLDS}: the fleet was not full at the partition; another world")
    tmp_path = world_path
    assert report.partitioned >= 2, "the fleet was too small at the partition: nothing was tested"
    # Partitioned before the fleet was full, scale-up (which goes on) would add ready nodes until the
    # down share fell under 45%: then the stop lifts by its own rule (docs/planning.md rule 11) and the
    # long-down machines are terminated, which this test is not about (seed 531134 did so at 3 of 7).
    assert report.partition_fleet >= 8, f"the fleet never filled ({report.partition_fleet} of 8 workers)"
    assert report.partition_disruptions == {}, report.partition_disruptions
    assert report.hits == [], report.hits
    log = (tmp_path / "daemon.log").read_text()
    assert log.count("scale-down halted") >= 1 and "scale-down resumed" in log
    assert report.settled, report.leak
