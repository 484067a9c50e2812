"""Limits on what a user and a wallet may start, through the API on a real redis-server (usage ledger,
budgets set by the admin): clusters per user (429, exact under concurrent creates through two replicas)
and a wallet's budget (402; default, settings' override, the admin's override above both)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestClient, TestServer
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.adapters.redis_budgets import RedisBudgets
from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.limits import Limits
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.keeper.usage import Machine, readings
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

TOKEN = "admin-token-of-the-limits-test"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW = 1_800_000_000.0
PRICE = 0.096 / 3600  # m5.large, USD per second


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@dataclass
class World:
    a: TestClient  # type: ignore[type-arg]
    b: TestClient  # type: ignore[type-arg]  # a second replica over the same hosts and locks
    hosts: FakeHosts
    usage: RedisUsage
    limits: Limits

    async def spend(self, user: str, wallet: str, seconds: float, iid: str) -> None:
        machine = Machine(iid, user, wallet, f"kc-{iid}", "m5.large", NOW - seconds, NOW)
        await self.usage.record(readings([machine], NOW, {"m5.large": 0.096}), NOW)


@pytest.fixture
async def world(redis_server: RedisServer) -> AsyncIterator[World]:
    name = f"limits-{id(object())}"
    usage, budgets = RedisUsage(redis_server.url, name), RedisBudgets(redis_server.url, name)
    limits = Limits(2, default_budget=1.0, budgets={"w-small": 0.01}, store=budgets, usage=usage)
    hosts, locks = FakeHosts(create_delay=0.05), SharedLocks(lambda: NOW)
    keepers = [
        Keeper(
            hosts,
            FakeProbe(),
            locks.for_replica(r),
            KeeperTiming(),
            interval=0.05,
            clock=lambda: NOW,
            limits=limits,
        )
        for r in ("a", "b")
    ]
    async with (
        TestClient(TestServer(build_keeper_app(keepers[0], TOKEN, KeeperMetrics()))) as a,
        TestClient(TestServer(build_keeper_app(keepers[1], TOKEN, KeeperMetrics()))) as b,
    ):
        yield World(a, b, hosts, usage, limits)
    for keeper in keepers:
        await keeper.stop()
    await usage.close()
    await budgets.close()


async def test_a_user_over_its_cluster_count_gets_429_saying_so(world: World) -> None:
    assert (await world.a.put("/v1/clusters/alice/w1", headers=AUTH)).status == 201
    assert (await world.b.put("/v1/clusters/alice/w2", headers=AUTH)).status == 201
    refused = await world.a.put("/v1/clusters/alice/w3", headers=AUTH)
    assert refused.status == 429
    body = await refused.json()
    assert body["limit"] == "clusters_per_user" and body["live_clusters"] == 2
    assert body["max_clusters_per_user"] == 2 and "end one" in body["error"]
    assert (await world.a.put("/v1/clusters/alice/w1", headers=AUTH)).status == 200  # an existing one
    assert (await world.a.put("/v1/clusters/bob/w1", headers=AUTH)).status == 201  # another user
    assert world.hosts.created == 3
    assert (await world.b.delete("/v1/clusters/alice/w1", headers=AUTH)).status == 202  # ending: not live
    assert (await world.a.put("/v1/clusters/alice/w3", headers=AUTH)).status == 201


async def test_concurrent_creates_through_two_replicas_never_pass_the_count_together(world: World) -> None:
    clients = [world.a, world.b] * 3
    answers = await asyncio.gather(
        *(c.put(f"/v1/clusters/carol/w{i}", headers=AUTH) for i, c in enumerate(clients))
    )
    statuses = sorted(r.status for r in answers)
    assert statuses == [201, 201, 429, 429, 429, 429]
    assert len([c for c in world.hosts.live() if c.key.user_id == "carol"]) == 2


async def test_a_wallet_that_spent_its_budget_gets_402_with_the_figures(world: World) -> None:
    await world.spend("alice", "w-small", 600, "i-1")  # 0.016 USD of 0.01 (the settings' override)
    refused = await world.a.put("/v1/clusters/alice/w-small", headers=AUTH)
    assert refused.status == 402
    body = await refused.json()
    assert body["limit"] == "wallet_budget" and body["source"] == "settings" and body["exhausted"]
    assert body["spent_usd"] == pytest.approx(600 * PRICE) and body["remaining_usd"] == 0
    assert "raise it" in body["error"]
    assert world.hosts.created == 0
    assert (await world.a.put("/v1/clusters/alice/w-other", headers=AUTH)).status == 201  # default 1 USD


async def test_a_budget_counts_every_user_of_the_wallet(world: World) -> None:
    await world.spend("alice", "w-shared", 30_000, "i-a")  # 0.8 USD
    assert (await world.a.put("/v1/clusters/bob/w-shared", headers=AUTH)).status == 201
    await world.spend("bob", "w-shared", 10_000, "i-b")  # 0.27 USD more: over the default 1 USD
    assert (await world.a.put("/v1/clusters/carol/w-shared", headers=AUTH)).status == 402


async def test_the_admin_s_budget_comes_before_the_settings_and_can_be_removed(world: World) -> None:
    await world.spend("alice", "w-small", 600, "i-1")
    route = "/v1/wallets/w-small/budget"
    got = await (await world.a.get(route, headers=AUTH)).json()
    assert (got["budget_usd"], got["source"], got["exhausted"]) == (0.01, "settings", True)
    raised = await world.b.put(route, json={"budget_usd": 2.5}, headers=AUTH)  # through the other replica
    assert raised.status == 200
    assert (await raised.json())["source"] == "api" and (await raised.json())[
        "remaining_usd"
    ] == pytest.approx(2.5 - 600 * PRICE)
    assert (await world.a.put("/v1/clusters/alice/w-small", headers=AUTH)).status == 201
    assert (await world.a.delete(route, headers=AUTH)).status == 204
    assert (await (await world.a.get(route, headers=AUTH)).json())["source"] == "settings"
    assert (await world.a.delete(route, headers=AUTH)).status == 404
    for bad in ({"budget_usd": -1}, {"budget_usd": "x"}, {"budget": 1}, {"budget_usd": True}):
        assert (await world.a.put(route, json=bad, headers=AUTH)).status == 400, bad
    zero = await world.a.put("/v1/wallets/w-zero/budget", json={"budget_usd": 0}, headers=AUTH)
    assert (await zero.json())["exhausted"]  # a zero budget: nothing may start
    assert (await world.a.put("/v1/clusters/dave/w-zero", headers=AUTH)).status == 402
