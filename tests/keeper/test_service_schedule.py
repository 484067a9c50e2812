"""When the keeper checks a cluster (in-memory ports, a settable clock).

Discovery wakes only the clusters a listing shows new or changed (seed 001: never reschedule them all)."""

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
