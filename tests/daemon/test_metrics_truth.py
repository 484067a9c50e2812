"""After a failed tick the metrics say what is known: the leader gauge is 0 unless the lock was
confirmed, and `autoscaler_last_tick_ok` / `autoscaler_snapshot_age_seconds` tell dashboards the other
gauges are stale. With a fake lock that raises, and with the real redis lock against a redis-server
that is stopped."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from tests.adapters.redis.conftest import PASSWORD
from tests.fakes import CATALOGUE, FakeCloud, FakeLock, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.adapters.redis_lock import RedisLock
from swarm_autoscaler.core.model import GIB, Resources, Task
from swarm_autoscaler.core.ports import Lock
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import Metrics
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

CLUSTER = "truth"


class Watched:
    """A daemon over fakes with its metrics, read as a scrape would read them."""

    def __init__(self, lock: Lock) -> None:
        self.clock = SteppedClock()
        self.cloud = FakeCloud(self.clock, CATALOGUE)
        self.workload = FakeWorkload(unrunnable=[Task("t1", Resources(1, GIB))])
        self.metrics = Metrics(CLUSTER)
        self.daemon = Daemon(
            cluster_name=CLUSTER,
            ports=Ports(InFlightCloud(self.cloud), MemorySwarm(), self.workload),
            lock=lock,
            policy=small_policy(3),
            catalogue=CATALOGUE,
            poll_interval=5.0,
            lock_ttl=30.0,
            on_tick=self.metrics.observe_tick,
        )
        self.metrics.follow(self.daemon)

    def gauge(self, name: str) -> float:
        got = self.metrics.registry.get_sample_value(name, {"cluster": CLUSTER})
        assert got is not None, name
        return got

    def view(self) -> tuple[float, float, float, float]:
        """(is_leader, last_tick_ok, snapshot age, tick errors)"""
        return (
            self.gauge("autoscaler_is_leader"),
            self.gauge("autoscaler_last_tick_ok"),
            self.gauge("autoscaler_snapshot_age_seconds"),
            self.gauge("autoscaler_tick_errors_total"),
        )


async def test_a_lock_that_raises_turns_the_leader_gauge_off_and_marks_the_rest_stale() -> None:
    lock = FakeLock("a")
    w = Watched(lock)
    assert math.isnan(w.gauge("autoscaler_snapshot_age_seconds"))  # no snapshot yet
    assert w.gauge("autoscaler_is_leader") == 0
    assert await w.daemon.tick_once() is not None
    assert w.view() == (1.0, 1.0, 0.0, 0.0)
    pending = w.gauge("autoscaler_pending_tasks")

    lock.fail = True  # the lock's store is unreachable: leadership cannot be confirmed
    w.clock.step(5.0)
    assert await w.daemon.tick_once() is None
    assert w.view() == (0.0, 0.0, 5.0, 1.0)
    w.clock.step(7.0)  # the age keeps growing between scrapes, with no tick at all
    assert w.gauge("autoscaler_snapshot_age_seconds") == 12.0
    assert w.gauge("autoscaler_pending_tasks") == pending  # kept: the flags above say it is stale

    lock.fail = False
    w.clock.step(5.0)
    assert await w.daemon.tick_once() is not None
    assert w.view() == (1.0, 1.0, 0.0, 1.0)


async def test_leadership_lost_during_a_tick_shows_as_zero_though_the_tick_succeeded() -> None:
    lock = FakeLock("a", lose_on_extend=True)
    w = Watched(lock)
    w.daemon.lock_ttl = 0.15  # the keeper extends every ttl/3: the extension loses the lock mid-tick
    w.cloud.list_delay = 0.2
    assert await w.daemon.tick_once() is not None
    assert w.gauge("autoscaler_last_tick_ok") == 1
    assert w.gauge("autoscaler_is_leader") == 0


async def test_standby_reports_zero() -> None:
    w = Watched(FakeLock("b", {"holder": "a"}))
    assert await w.daemon.tick_once() is not None
    assert (w.gauge("autoscaler_is_leader"), w.gauge("autoscaler_last_tick_ok")) == (0.0, 1.0)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: the test stops it."""
    with RedisServer(password=PASSWORD) as server:
        yield server


async def test_a_replica_that_loses_redis_stops_claiming_leadership(own_redis: RedisServer) -> None:
    async with RedisLock(own_redis.url, CLUSTER, ttl=3.0) as lock:
        w = Watched(lock)
        assert await w.daemon.tick_once() is not None
        assert w.view()[:2] == (1.0, 1.0)

        own_redis.stop()
        w.clock.step(5.0)
        assert await w.daemon.tick_once() is None
        assert w.view() == (0.0, 0.0, 5.0, 1.0)
