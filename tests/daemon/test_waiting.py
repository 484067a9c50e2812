"""Actions planned again tick after tick: counted, oldest first in act, one warning line, the metrics."""

from __future__ import annotations

import pytest
from tests.fakes import CATALOGUE, FakeCloud, FakeLock, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.core.actions import DrainNode, NodeUpdate, Plan, RetireWorkers
from swarm_autoscaler.core.model import GIB, NodeMarks, Resources, Task
from swarm_autoscaler.daemon.jobs import Outcome
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import Metrics
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler.daemon.waiting import WARN_AFTER_TICKS, Waiting, key
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

DRAIN = DrainNode("n1", "h1", "empty")
MARK = NodeUpdate("n2", "empty", NodeMarks(empty_since=1.0))


def left(action: DrainNode | NodeUpdate | RetireWorkers) -> Outcome:
    return Outcome(action, False, "left to the next tick", kind="deadline")


def test_an_action_planned_again_with_another_reason_is_the_same_wait() -> None:
    assert key(DRAIN) == key(DrainNode("n1", "h1", "another reason"))
    assert key(MARK) == key(NodeUpdate("n2", "later", NodeMarks(empty_since=9.0)))
    assert key(DRAIN) != key(DrainNode("n2", "h2", "empty"))
    assert key(RetireWorkers(("b", "a"), "idle")) == key(RetireWorkers(("a", "b"), "idle"))


def test_waits_grow_until_done_or_no_longer_planned_and_warn_once() -> None:
    waiting = Waiting(warn_after=3)
    plan = Plan((DRAIN, MARK))
    overdue = [waiting.update(100.0 + t, plan, (left(DRAIN), Outcome(MARK, True))) for t in range(5)]
    assert waiting.age(DRAIN) == 5 and waiting.age(MARK) == 0  # the mark was done every time
    assert waiting.oldest(104.0) == 4.0
    # one warning, in the tick where the drain passed 3 ticks; not again in the next
    assert [o is not None for o in overdue] == [False, False, False, True, False]
    assert overdue[3] is not None and overdue[3].kinds == {"DrainNode": 1} and overdue[3].oldest_ticks == 4
    waiting.update(105.0, plan, (Outcome(DRAIN, True), Outcome(MARK, True)))
    assert waiting.age(DRAIN) == 0 and waiting.oldest(105.0) == 0.0
    waiting.update(106.0, plan, (left(DRAIN), left(MARK)))
    waiting.update(107.0, Plan(()), ())  # no longer planned: no longer waiting
    assert waiting.age(DRAIN) == 0 and waiting.oldest(107.0) == 0.0


async def test_a_launch_that_keeps_failing_grows_the_gauge_and_warns_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = SteppedClock()
    cloud = FakeCloud(clock, CATALOGUE, fail_launch=RuntimeError("EC2 says no"))
    metrics = Metrics("w")
    daemon = Daemon(
        cluster_name="w",
        ports=Ports(
            InFlightCloud(cloud), MemorySwarm(), FakeWorkload(unrunnable=[Task("t1", Resources(1, GIB))])
        ),
        lock=FakeLock("a"),
        policy=small_policy(3),
        catalogue=CATALOGUE,
        poll_interval=5.0,
        on_tick=metrics.observe_tick,
    )
    for _ in range(WARN_AFTER_TICKS + 3):
        assert await daemon.tick_once() is not None
        clock.step(5.0)
    gauge = metrics.registry.get_sample_value("autoscaler_oldest_waiting_action_seconds", {"cluster": "w"})
    assert gauge == 5.0 * (WARN_AFTER_TICKS + 2)
    lines = [line for line in capsys.readouterr().out.splitlines() if "actions keep waiting" in line]
    assert len(lines) == 1 and "Launch" in lines[0]
