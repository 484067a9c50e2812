"""The keeper over in-memory ports: get-or-create across replicas, heartbeats, ending, restarts and
takeover. Time for decisions is a settable clock; task scheduling runs on real (short) intervals."""

from __future__ import annotations

import asyncio

from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.model import ClusterKey, ClusterState
from swarm_autoscaler.keeper.service import Keeper

KEY = ClusterKey.parse("alice", "w1")
TIMING = KeeperTiming(idle_timeout=300.0, max_start_time=600.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def replica(
    name: str, hosts: FakeHosts, probe: FakeProbe, locks: SharedLocks, clock: Clock, interval: float = 0.05
) -> Keeper:
    return Keeper(hosts, probe, locks.for_replica(name), TIMING, interval=interval, clock=clock)


def world(create_delay: float = 0.0) -> tuple[FakeHosts, FakeProbe, SharedLocks, Clock]:
    clock = Clock()
    return FakeHosts(create_delay), FakeProbe(), SharedLocks(clock), clock


async def test_get_or_create_creates_once_then_returns_the_same_cluster() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock)
    first, created = await keeper.get_or_create(KEY)
    again, created_again = await keeper.get_or_create(KEY)
    assert created and not created_again
    assert again.cluster_id == first.cluster_id and hosts.created == 1
    await keeper.stop()


async def test_twenty_concurrent_requests_across_two_replicas_create_one_cluster() -> None:
    hosts, probe, locks, clock = world(create_delay=0.02)
    a, b = replica("a", hosts, probe, locks, clock), replica("b", hosts, probe, locks, clock)
    results = await asyncio.gather(*(r.get_or_create(KEY) for r in [a, b] * 10))
    assert hosts.created == 1
    assert sum(created for _, created in results) == 1
    assert len({c.cluster_id for c, _ in results}) == 1
    await a.stop()
    await b.stop()


async def test_a_cluster_runs_when_its_scheduler_answers_and_ends_when_unused() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock)
    cluster, _ = await keeper.get_or_create(KEY)
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await keeper.check(cluster.cluster_id)
    assert hosts.clusters[cluster.cluster_id].state == ClusterState.RUNNING
    clock.now += 200
    await keeper.heartbeat(KEY)  # a use: the idle timeout counts from here
    clock.now += 200
    assert not await keeper.check(cluster.cluster_id)
    assert hosts.live()
    clock.now += 100
    assert not await keeper.check(cluster.cluster_id)  # unused for 300 s, but a stored heartbeat may lag
    clock.now += keeper.write_every
    assert await keeper.check(cluster.cluster_id)  # unused for 300 s + that lag: ended and gone
    assert hosts.terminate_calls == [cluster.cluster_id] and not hosts.live()
    assert hosts.clusters[cluster.cluster_id].state == ClusterState.ENDING
    await keeper.stop()


async def test_a_primary_that_never_answers_fails_with_its_reason() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock)
    cluster, _ = await keeper.get_or_create(KEY)
    clock.now += 601
    assert await keeper.check(cluster.cluster_id)
    stored = hosts.clusters[cluster.cluster_id]
    assert stored.state == ClusterState.FAILED and "did not answer" in stored.reason
    assert not hosts.live()
    # The next request gets a new cluster rather than the failed one.
    fresh, created = await keeper.get_or_create(KEY)
    assert created and fresh.cluster_id != cluster.cluster_id
    await keeper.stop()


async def test_a_restarted_keeper_with_stale_heartbeats_keeps_a_busy_cluster() -> None:
    hosts, probe, locks, clock = world()
    first = replica("a", hosts, probe, locks, clock)
    cluster, _ = await first.get_or_create(KEY)
    probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=True)
    await first.check(cluster.cluster_id)
    await first.stop()  # the keeper goes away; the tags hold a heartbeat that goes stale
    clock.now += 3600
    restarted = replica("a2", hosts, probe, locks, clock)
    await restarted.discover()
    assert not await restarted.check(cluster.cluster_id)
    assert hosts.live() and hosts.clusters[cluster.cluster_id].last_heartbeat == clock.now
    probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=False)
    clock.now += 300 + restarted.write_every
    assert await restarted.check(cluster.cluster_id)  # idle now: ended after the timeout (and the lag)
    await restarted.stop()


async def test_each_cluster_is_checked_by_one_replica_and_taken_over_when_it_dies() -> None:
    hosts, probe, locks, clock = world()
    a, b = replica("a", hosts, probe, locks, clock), replica("b", hosts, probe, locks, clock)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    runs = [asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.run(stop_b))]
    cluster, _ = await a.get_or_create(KEY)
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await asyncio.sleep(0.4)
    assert a.checks > 0 and b.checks == 0  # b discovered it, but a holds its lease
    # a dies without releasing (kill -9): b takes over once the lease's TTL has passed.
    runs[0].cancel()
    await asyncio.gather(runs[0], return_exceptions=True)
    locks.leases[f"cluster:{cluster.cluster_id}"] = ("a", clock.now + a.lease_ttl)
    clock.now += a.lease_ttl + 0.01
    await asyncio.sleep(0.3)
    assert b.checks > 0
    stop_b.set()
    await runs[1]


async def test_delete_ends_the_cluster_now_through_its_task() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock)
    stop = asyncio.Event()
    run = asyncio.create_task(keeper.run(stop))
    await keeper.get_or_create(KEY)
    ending = await keeper.end(KEY)
    assert ending is not None and ending.state == ClusterState.ENDING
    for _ in range(100):
        if not hosts.live():
            break
        await asyncio.sleep(0.01)
    assert not hosts.live()
    assert await keeper.end(KEY) is None
    stop.set()
    await run


async def test_a_thousand_clusters_each_get_their_own_task_and_check() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock, interval=0.5)
    for i in range(1000):
        await hosts.create(ClusterKey.parse(f"u{i}", "none"), clock.now)
    await keeper.discover()
    for _ in range(300):
        if keeper.checks >= 1000:
            break
        await asyncio.sleep(0.01)
    assert keeper.checks >= 1000
    assert len(keeper._tasks) == 1000
    await keeper.stop()
    assert not keeper._tasks
