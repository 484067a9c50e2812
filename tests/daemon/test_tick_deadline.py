"""run_tick hands act the tick's deadline: what observing and planning left of it, never less than
half, and the rest of act's configuration as given. The mutation run on daemon/tick.py found every
part of that computation without a test (act's own deadline handling is in test_act_bounds.py)."""

from __future__ import annotations

import time

import pytest
from tests.daemon.test_act_ports import World
from tests.fakes import CATALOGUE, small_policy

from swarm_autoscaler.core.actions import Plan
from swarm_autoscaler.core.model import Policy, Snapshot
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.daemon import tick
from swarm_autoscaler.daemon.act import ActConfig, Outcome, Ports, StillLeader
from swarm_autoscaler.daemon.tick import run_tick

GIVEN = ActConfig("test", concurrency=3)


async def deadline_act_got(monkeypatch: pytest.MonkeyPatch, deadline: float, planning: float) -> ActConfig:
    """The configuration act is called with when observing and planning take at least `planning` s."""
    seen: list[ActConfig] = []

    async def recording_act(
        p: Plan, s: Snapshot, ports: Ports, still_leader: StillLeader, config: ActConfig = GIVEN, *_: object
    ) -> tuple[Outcome, ...]:
        seen.append(config)
        return ()

    def slow_plan(snapshot: Snapshot, policy: Policy) -> Plan:
        time.sleep(planning)  # a slow observe or plan: the tick's clock runs on
        return plan(snapshot, policy)

    monkeypatch.setattr(tick, "act", recording_act)
    world = World()
    await run_tick(
        world.ports,
        small_policy(3),
        CATALOGUE,
        world.clock(),
        planner=slow_plan,
        config=GIVEN,
        deadline=deadline,
    )
    (config,) = seen
    assert (config.cluster_name, config.concurrency) == ("test", 3)  # the rest as given
    assert config.deadline is not None
    return config


async def test_act_gets_what_observing_and_planning_left_of_the_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    config = await deadline_act_got(monkeypatch, deadline=10.0, planning=0.1)
    assert config.deadline is not None and 5.0 < config.deadline <= 9.9


async def test_act_gets_at_least_half_of_the_tick_however_long_observing_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = await deadline_act_got(monkeypatch, deadline=0.4, planning=0.3)
    assert config.deadline == 0.2
