"""When the keeper checks a cluster and when it writes its tags (in-memory ports, a settable clock).

Discovery wakes only the clusters a listing shows new or changed (never reschedule them all);
tags are written only when a restarted or other replica needs them (EC2 throttles mutating calls), and
the idle and silence decisions allow for what the tags may not hold yet, so no cluster ends early."""

from __future__ import annotations

import asyncio

from tests.keeper.fakes import FakeProbe
from tests.keeper.test_service import KEY, replica, world

from swarm_autoscaler.keeper.lifecycle import Probe
from swarm_autoscaler.keeper.model import ClusterKey, ClusterState
from swarm_autoscaler.keeper.service import LISTING_GRACE


class RecordingProbe(FakeProbe):
    """Records which schedulers were probed (one probe per check of a live cluster)."""

    def __init__(self) -> None:
        super().__init__()
        self.probed: list[str] = []

    async def probe(self, url: str) -> Probe:
        self.probed.append(url)
        return await super().probe(url)


async def settle() -> None:
    """Let every woken task run its check (the fakes never block)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_listing_wakes_only_new_or_changed_clusters_and_ends_the_tasks_of_gone_ones() -> None:
    hosts, _, locks, clock = world()
    probe = RecordingProbe()
    # Checks on the interval would take a minute: any check seen below is a wake.
    keeper = replica("a", hosts, probe, locks, clock, interval=60.0)
    made = [await hosts.create(ClusterKey.parse(f"u{i}", "none"), clock.now) for i in range(3)]
    for cluster in made:
        probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await keeper.discover()  # all new: each gets its task, checked at once
    await settle()
    assert sorted(probe.probed) == sorted(c.dashboard_url for c in made)
    assert len(keeper._tasks) == 3

    probe.probed.clear()
    for _ in range(5):  # listings with no change (their heartbeats are newer, as another replica wrote)
        clock.now += 1
        await hosts.update(made[0].cluster_id, heartbeat=clock.now)
        await keeper.discover()
        await settle()
    assert probe.probed == [] and keeper.checks == 3

    # Another replica ended one (a DELETE there): that cluster's task alone is woken, and ends it.
    await hosts.update(made[1].cluster_id, state=ClusterState.ENDING, reason="ended on request")
    await keeper.discover()
    await settle()
    assert keeper.checks == 4 and probe.probed == []  # an ending cluster is not probed, only terminated
    assert hosts.terminate_calls == [made[1].cluster_id]
    assert made[1].cluster_id not in keeper._tasks

    # A primary terminated by hand: it is no longer listed, and its task ends without a check.
    clock.now += LISTING_GRACE
    hosts.alive[made[2].cluster_id] = 0
    await keeper.discover()
    await settle()
    assert set(keeper._tasks) == {made[0].cluster_id} and keeper.checks == 4
    await keeper.stop()


async def test_a_cluster_just_created_and_not_yet_listed_keeps_its_task() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock, interval=60.0)
    cluster, _ = await keeper.get_or_create(KEY)
    hosts.alive[cluster.cluster_id] = 0  # EC2's listing does not show it yet (eventual consistency)
    await keeper.discover()
    await settle()
    assert cluster.cluster_id in keeper._tasks
    await keeper.stop()


async def test_an_idle_cluster_costs_no_tag_write_and_a_busy_one_one_per_write_interval() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock)
    cluster, _ = await keeper.get_or_create(KEY)
    cid = cluster.cluster_id
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await keeper.check(cid)  # starting -> running: one write (the state)
    assert hosts.updates == 1
    for _ in range(250):  # 250 s idle, checked every second, still within the idle timeout
        clock.now += 1
        assert not await keeper.check(cid)
    assert hosts.updates == 1
    probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=True)
    checks, lags = 600, []
    for _ in range(checks):  # 600 s busy: each check is a use
        clock.now += 1
        await keeper.check(cid)
        lags.append(clock.now - hosts.clusters[cid].last_heartbeat)
    writes = hosts.updates - 1
    print(f"busy for {checks} s, write interval {keeper.write_every:g} s: {writes} heartbeat writes")
    assert writes == checks // keeper.write_every
    assert max(lags) < keeper.write_every  # the stored heartbeat never lags the last use by more
    await keeper.stop()


async def test_a_replica_reading_a_lagging_heartbeat_does_not_end_the_cluster_early() -> None:
    hosts, probe, locks, clock = world()
    first = replica("a", hosts, probe, locks, clock)
    cluster, _ = await first.get_or_create(KEY)
    cid = cluster.cluster_id
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await first.check(cid)
    clock.now += first.write_every - 1
    await first.heartbeat(KEY)  # the last use: too soon after the last write to be written
    last_use = clock.now
    assert last_use - hosts.clusters[cid].last_heartbeat == first.write_every - 1
    await first.stop()  # this replica dies; its newer heartbeat was only in memory

    second = replica("b", hosts, probe, locks, clock)
    await second.discover()
    clock.now = last_use + 300 - 1  # just within the idle timeout of the last use
    assert not await second.check(cid)
    clock.now = last_use + 300 + second.write_every
    assert await second.check(cid)  # unused for the idle timeout, whatever the lag: ended
    assert hosts.clusters[cid].state == ClusterState.ENDING
    await second.stop()


async def test_a_scheduler_silent_after_a_takeover_ends_an_idle_timeout_after_the_takeover() -> None:
    hosts, probe, locks, clock = world()
    first = replica("a", hosts, probe, locks, clock)
    cluster, _ = await first.get_or_create(KEY)
    cid = cluster.cluster_id
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await first.check(cid)
    answered_at = hosts.clusters[cid].last_answered
    for _ in range(10):  # 10 x 100 s of heartbeats and answers: the answer time is not rewritten...
        clock.now += 100
        await first.heartbeat(KEY)
        await first.check(cid)
    writes = hosts.updates
    await first.stop()

    # ... so a replica taking over a scheduler that stopped answering finds an old answer time in the
    # tags, and counts the silence from when it took over: not ended at once.
    del probe.answers[cluster.dashboard_url]
    second = replica("b", hosts, probe, locks, clock)
    await second.discover()
    assert hosts.clusters[cid].last_answered is not None and answered_at is not None
    taken = clock.now
    assert not await second.check(cid)
    clock.now = taken + 299
    assert not await second.check(cid)
    clock.now = taken + 300
    assert await second.check(cid)
    assert "not answered" in hosts.clusters[cid].reason
    assert hosts.updates == writes + 1  # the end; no answer time written by the silent checks here
    await second.stop()


async def test_the_holder_writes_the_last_answer_time_once_when_its_scheduler_stops_answering() -> None:
    hosts, probe, locks, clock = world()
    keeper = replica("a", hosts, probe, locks, clock)
    cluster, _ = await keeper.get_or_create(KEY)
    cid = cluster.cluster_id
    probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await keeper.check(cid)
    for _ in range(5):
        clock.now += 10
        await keeper.check(cid)
    last_answer = clock.now
    assert hosts.clusters[cid].last_answered != last_answer  # idle and answering: not written
    writes = hosts.updates
    del probe.answers[cluster.dashboard_url]
    for _ in range(5):
        clock.now += 10
        assert not await keeper.check(cid)
    assert hosts.updates == writes + 1 and hosts.clusters[cid].last_answered == last_answer
    await keeper.stop()
