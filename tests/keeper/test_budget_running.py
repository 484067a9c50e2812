"""A running cluster whose wallet runs out of budget (real redis: the usage ledger, the budgets and the
time the wallet ran out): it stops growing (its launches are held) and says so, lives on for the grace
period, a second replica taking it over keeps the same grace, and it is ended once the grace is over;
raising the budget lifts the hold."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.adapters.redis_budgets import RedisBudgets
from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.api import cluster_json
from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.limits import Limits
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.keeper.usage import Machine, readings
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

T0 = 1_800_000_000.0
GRACE = 600.0
KEY = ClusterKey("alice", "w1")


class RecordingClients:
    """`SchedulerClients` that records the holds it is asked for (our own port)."""

    def __init__(self) -> None:
        self.holds: list[tuple[str, str]] = []

    async def clients(self, cluster: Cluster) -> int | None:
        return None

    async def hold_launches(self, cluster: Cluster, reason: str) -> bool:
        self.holds.append((cluster.cluster_id, reason))
        return True


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@dataclass
class World:
    now: list[float]
    hosts: FakeHosts
    probe: FakeProbe
    usage: RedisUsage
    budgets: RedisBudgets
    clients: RecordingClients
    locks: SharedLocks

    def keeper(self, replica: str) -> Keeper:
        return Keeper(
            self.hosts, self.probe, self.locks.for_replica(replica),
            KeeperTiming(idle_timeout=10_000.0, budget_grace=GRACE), interval=1000.0,
            clock=lambda: self.now[0], limits=Limits(default_budget=0.01, store=self.budgets, usage=self.usage),
            clients=self.clients,
        )  # fmt: skip

    async def spend(self, seconds: float) -> None:
        m = Machine("i-w", "alice", "w1", "kc-0001", "m5.large", T0 - seconds, T0)
        await self.usage.record(readings([m], T0, {"m5.large": 0.096}), T0)


@pytest.fixture
async def world(redis_server: RedisServer) -> AsyncIterator[World]:
    name = f"budget-{uuid.uuid4().hex[:8]}"  # unique: an id() can repeat, and redis would keep the spending
    now = [T0]
    usage, budgets = RedisUsage(redis_server.url, name), RedisBudgets(redis_server.url, name)
    yield World(
        now,
        FakeHosts(),
        FakeProbe(),
        usage,
        budgets,
        RecordingClients(),
        SharedLocks(lambda: now[0]),
    )
    await usage.close()
    await budgets.close()


async def running(world: World, keeper: Keeper) -> str:
    cluster, _ = await keeper.get_or_create(KEY)
    world.probe.answers[cluster.dashboard_url] = Probe(answered=True)
    await keeper.check(cluster.cluster_id)
    assert world.hosts.clusters[cluster.cluster_id].state == ClusterState.RUNNING
    return cluster.cluster_id


async def test_out_of_budget_it_stops_growing_says_so_and_ends_only_after_the_grace(world: World) -> None:
    a = world.keeper("a")
    try:
        cid = await running(world, a)
        await world.spend(600)  # 0.016 USD of 0.01
        world.now[0] += 30
        await a.read_budgets()
        assert a.over_budget == {"w1": T0 + 30}
        await a.check(cid)
        tagged = world.hosts.clusters[cid]
        assert tagged.state == ClusterState.RUNNING and "no new workers" in tagged.reason
        assert world.clients.holds[-1][0] == cid and "spent its budget" in world.clients.holds[-1][1]
        view = cluster_json(a._known[cid], world.now[0], 120.0, a.budget_ends_at(a._known[cid]))
        assert view["state"] == "running" and view["budget_ends_at"] == T0 + 30 + GRACE
        assert "no new workers" in view["reason"]

        world.now[0] = T0 + 30 + GRACE - 1  # a second before the grace ends
        await a.check(cid)
        assert world.hosts.clusters[cid].state == ClusterState.RUNNING and not world.hosts.terminate_calls

        await a.stop()  # its lease released: b may act on the cluster (it refreshes the lease to terminate)
        b = world.keeper("b")  # a takeover: the grace counts from the same time, kept in redis
        await b.read_budgets()  # it knows no cluster yet: no wallet to read
        b._known[cid] = world.hosts.clusters[cid]
        await b.read_budgets()
        assert b.over_budget == {"w1": T0 + 30}
        world.now[0] = T0 + 30 + GRACE
        await b.check(cid)
        ended = world.hosts.clusters[cid]
        assert ended.state == ClusterState.ENDING and world.hosts.terminate_calls == [cid]
        assert ended.reason == "its wallet w1 spent its budget; ended after the 600s grace"
        await b.stop()
    finally:
        await a.stop()


async def test_raising_the_budget_lifts_the_hold(world: World) -> None:
    a = world.keeper("a")
    try:
        cid = await running(world, a)
        await world.spend(600)
        await a.read_budgets()
        await a.check(cid)
        assert "no new workers" in world.hosts.clusters[cid].reason
        await world.budgets.set("w1", 5.0)  # the admin's PUT /v1/wallets/w1/budget
        await a.read_budgets()
        assert a.over_budget == {}
        await a.check(cid)
        assert world.clients.holds[-1] == (cid, "")
        assert world.hosts.clusters[cid].reason == "" and a.budget_ends_at(a._known[cid]) is None
        world.now[0] += 10 * GRACE
        await a.check(cid)
        assert world.hosts.clusters[cid].state == ClusterState.RUNNING
        # spent again later: the grace counts from then, not from the first time
        await world.budgets.set("w1", 0.001)
        await a.read_budgets()
        assert a.over_budget == {"w1": world.now[0]}
    finally:
        await a.stop()


async def test_a_budget_raised_since_the_last_read_does_not_end_the_cluster(world: World) -> None:
    """The budget view is read on its own interval; an end that rests on it re-reads the wallet first."""
    a = world.keeper("a")
    try:
        cid = await running(world, a)
        await world.spend(600)
        await a.read_budgets()
        assert a.over_budget == {"w1": T0}
        await world.budgets.set("w1", 5.0)  # raised after the last read
        world.now[0] = T0 + GRACE + 1  # the stale view says the grace is over
        await a.check(cid)
        assert world.hosts.clusters[cid].state == ClusterState.RUNNING and not world.hosts.terminate_calls
    finally:
        await a.stop()


async def test_a_replica_taking_over_a_held_cluster_lifts_the_hold_once_the_budget_is_raised(
    world: World,
) -> None:
    """The hold is in the cluster's tags (its reason), not only in the memory of the replica that held
    it: a replica that takes the cluster over after the budget was raised lifts it."""
    a = world.keeper("a")
    try:
        cid = await running(world, a)
        await world.spend(600)
        await a.read_budgets()
        await a.check(cid)
        assert "no new workers" in world.hosts.clusters[cid].reason
    finally:
        await a.stop()
    await world.budgets.set("w1", 5.0)
    b = world.keeper("b")
    try:
        b._known[cid] = world.hosts.clusters[cid]
        await b.read_budgets()
        assert b.over_budget == {}
        await b.check(cid)
        assert world.clients.holds[-1] == (cid, "")
        assert world.hosts.clusters[cid].reason == ""
    finally:
        await b.stop()


async def test_the_held_clusters_and_the_wallets_over_budget_are_metrics(world: World) -> None:
    """`keeper_clusters_budget_held` counts the clusters this replica holds the launches of (until the
    hold is lifted), `keeper_wallets_over_budget` the wallets over their budget; a cluster of a wallet
    within its budget counts in neither."""
    from prometheus_client.parser import text_string_to_metric_families

    from swarm_autoscaler.keeper.metrics import KeeperMetrics

    def gauges(keeper: Keeper) -> dict[str, float]:
        body, _ = KeeperMetrics().exposition(
            keeper.clusters,
            budget_held=keeper.budget_held,
            wallets_over_budget=len(keeper.over_budget),
        )
        wanted = ("keeper_clusters_budget_held", "keeper_wallets_over_budget")
        return {
            s.name: s.value
            for f in text_string_to_metric_families(body.decode())
            for s in f.samples
            if s.name in wanted
        }

    a = world.keeper("a")
    try:
        cid = await running(world, a)
        other, _ = await a.get_or_create(ClusterKey("bob", "w2"))  # w2 spends nothing
        world.probe.answers[other.dashboard_url] = Probe(answered=True)
        await a.check(other.cluster_id)
        assert gauges(a) == {"keeper_clusters_budget_held": 0, "keeper_wallets_over_budget": 0}
        await world.spend(600)  # w1 only
        await a.read_budgets()
        await a.check(cid)
        await a.check(other.cluster_id)
        assert gauges(a) == {"keeper_clusters_budget_held": 1, "keeper_wallets_over_budget": 1}
        await world.budgets.set("w1", 5.0)
        await a.read_budgets()
        await a.check(cid)
        assert gauges(a) == {"keeper_clusters_budget_held": 0, "keeper_wallets_over_budget": 0}
    finally:
        await a.stop()
