"""Races between keeper replicas over one cluster's tags (in-memory ports, a settable clock).

Found by the end-to-end test of two replicas: a DELETE through one replica while the replica holding
the cluster marks it `running` must not be lost (the holder's write of `running` would otherwise
overwrite the `ending` just written, and the cluster would live on until its idle timeout)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.keeper.fakes import FakeHosts, FakeProbe, ReplicaLocks
from tests.keeper.test_service import KEY, TIMING, replica, world

from swarm_autoscaler.keeper.lifecycle import Probe
from swarm_autoscaler.keeper.model import ClusterState
from swarm_autoscaler.keeper.service import Keeper


class EndDuringProbe(FakeProbe):
    """Answers, but first lets another replica end the cluster (a DELETE arriving mid-check)."""

    def __init__(self) -> None:
        super().__init__()
        self.other: Keeper | None = None

    async def probe(self, url: str) -> Probe:
        if self.other is not None:
            other, self.other = self.other, None
            assert await other.end(KEY) is not None
        return await super().probe(url)


async def test_an_end_requested_through_another_replica_while_the_holder_marks_it_running_is_kept() -> None:
    hosts, _, locks, clock = world()
    probe = EndDuringProbe()
    holder, other = replica("a", hosts, probe, locks, clock), replica("b", hosts, probe, locks, clock)
    cluster, _ = await holder.get_or_create(KEY)
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    probe.other = other
    assert not await holder.check(cluster.cluster_id)  # starting -> would be running, but ended meanwhile
    assert probe.other is None  # the end did happen during the check
    assert hosts.clusters[cluster.cluster_id].state == ClusterState.ENDING
    assert await holder.check(cluster.cluster_id)  # the next check terminates it
    assert hosts.terminate_calls == [cluster.cluster_id] and not hosts.live()
    await holder.stop()
    await other.stop()


class EndDuringRunningWrite(FakeHosts):
    """EC2 that, while the holder's write of `running` is on its way, lets another replica's DELETE in:
    the end reaches its own tag write before the holder's write lands, unless something orders them."""

    def __init__(self) -> None:
        super().__init__()
        self.other: Keeper | None = None
        self.ending: asyncio.Task[object] | None = None

    async def update(self, cluster_id: str, **fields: Any) -> None:
        if fields.get("state") == ClusterState.RUNNING and self.other is not None:
            other, self.other = self.other, None
            self.ending = asyncio.create_task(other.end(KEY))
            await asyncio.sleep(0.05)  # the write is slow; the DELETE runs meanwhile
        await super().update(cluster_id, **fields)


async def test_an_end_requested_while_the_holder_writes_running_lands_after_it() -> None:
    _, probe, locks, clock = world()
    hosts = EndDuringRunningWrite()
    holder, other = replica("a", hosts, probe, locks, clock), replica("b", hosts, probe, locks, clock)
    cluster, _ = await holder.get_or_create(KEY)
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    hosts.other = other
    assert not await holder.check(cluster.cluster_id)
    assert hosts.ending is not None
    assert await hosts.ending is not None  # the DELETE was accepted...
    assert hosts.clusters[cluster.cluster_id].state == ClusterState.ENDING  # ...and not overwritten
    await holder.discover()  # the holder's next listing brings the end in
    assert await holder.check(cluster.cluster_id)
    assert not hosts.live()
    await holder.stop()
    await other.stop()


class SwallowingLocks(ReplicaLocks):
    """Replica locks whose `claim` swallows a cancellation once, as a client library may (seen in the
    end-to-end tests: a stopped keeper went on checking its cluster until it ended it)."""

    swallowed = 0

    async def claim(self, name: str, ttl: float) -> bool:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            SwallowingLocks.swallowed += 1
        return await super().claim(name, ttl)


async def test_a_stopped_keeper_stops_checking_even_when_a_cancellation_is_swallowed() -> None:
    hosts, probe, locks, clock = world()
    keeper = Keeper(hosts, probe, SwallowingLocks(locks, "a"), TIMING, interval=0.01, clock=clock)
    cluster, _ = await keeper.get_or_create(KEY)
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await asyncio.sleep(0.2)
    assert keeper.checks > 0
    await asyncio.wait_for(keeper.stop(), 2.0)
    checks = keeper.checks
    await asyncio.sleep(0.2)
    assert keeper.checks == checks  # no check after stop
    print(f"cancellations swallowed: {SwallowingLocks.swallowed}")


async def test_a_stopped_keeper_releases_its_leases_so_another_replica_takes_over_at_once() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock)
    cluster, _ = await keeper.get_or_create(KEY)
    await asyncio.sleep(0.2)
    assert locks.leases[f"cluster:{cluster.cluster_id}"][0] == "a"
    await keeper.stop()
    assert f"cluster:{cluster.cluster_id}" not in locks.leases


async def test_gets_of_a_live_cluster_answer_while_its_creation_lock_is_held() -> None:
    """A client's repeated get of a live cluster does not queue behind the creation lock (each holder
    read EC2 once under it: twenty concurrent gets through two replicas passed the 30 s wait under load
    and got 503 in the fast lane). In-memory ports stand in for EC2 and redis; the lock is held here by
    hand, as a slow creation elsewhere would hold it."""
    hosts, _, locks, clock = world()
    a = replica("a", hosts, FakeProbe(), locks, clock)
    cluster, created = await a.get_or_create(KEY)
    assert created
    locks.held.add(KEY.lock_name)  # another request holds the creation lock, for longer than any wait
    b = replica("b", hosts, FakeProbe(), locks, clock)
    a.create_wait = b.create_wait = 0.05
    answers = await asyncio.gather(*(r.get_or_create(KEY) for r in [a, b] * 5))
    assert {(c.cluster_id, made) for c, made in answers} == {(cluster.cluster_id, False)}
    assert len(hosts.clusters) == 1
    locks.held.discard(KEY.lock_name)
    await a.stop()
    await b.stop()


async def test_a_get_whose_wait_for_the_creation_lock_ends_answers_the_cluster_created_meanwhile() -> None:
    """A get that found no cluster and then waited out `create_wait` behind a creation answers the
    cluster that creation made, not 503 (in-memory ports stand in for EC2 and redis; the lock is held
    by hand while the cluster appears, as a slow creation through another replica would)."""
    hosts, _, locks, clock = world()
    a, b = replica("a", hosts, FakeProbe(), locks, clock), replica("b", hosts, FakeProbe(), locks, clock)
    locks.held.add(KEY.lock_name)  # a's creation is under way
    b.create_wait = 0.05
    waiting = asyncio.create_task(b.get_or_create(KEY))
    await asyncio.sleep(0)
    locks.held.discard(KEY.lock_name)
    cluster, created = await a.get_or_create(KEY)  # a creates it; b's wait is still going
    locks.held.add(KEY.lock_name)  # and a slow request holds the lock again past b's wait
    got, made = await waiting
    assert created and not made and got.cluster_id == cluster.cluster_id
    locks.held.discard(KEY.lock_name)
    await a.stop()
    await b.stop()
