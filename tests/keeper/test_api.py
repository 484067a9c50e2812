"""The keeper's HTTP API contract: every route, every error, through aiohttp's test client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.service import Keeper

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FIELDS = {"id", "user_id", "wallet_id", "state", "scheduler_url", "dashboard_url", "created_at"}
FIELDS |= {"last_heartbeat", "eta_s", "reason", "budget_ends_at", "profile"}


class World:
    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.hosts = FakeHosts()
        self.probe = FakeProbe()
        self.keeper = Keeper(
            self.hosts,
            self.probe,
            SharedLocks(lambda: self.now).for_replica("a"),
            KeeperTiming(),
            interval=0.05,
            clock=lambda: self.now,
        )


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestClient, World]]:  # type: ignore[type-arg]
    world = World()
    app = build_keeper_app(world.keeper, TOKEN, KeeperMetrics())
    async with TestClient(TestServer(app)) as client:
        yield client, world
    await world.keeper.stop()


async def test_put_creates_then_returns_the_same_cluster(api) -> None:  # type: ignore[no-untyped-def]
    client, world = api
    first = await client.put("/v1/clusters/alice/w1", headers=AUTH)
    assert first.status == 201
    body = await first.json()
    assert set(body) == FIELDS
    assert (body["user_id"], body["wallet_id"], body["state"]) == ("alice", "w1", "starting")
    again = await client.put("/v1/clusters/alice/w1", headers=AUTH)
    assert again.status == 200 and (await again.json())["id"] == body["id"]
    assert world.hosts.created == 1


async def test_wallet_none_is_a_wallet_id(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    response = await client.put("/v1/clusters/bob/none", headers=AUTH)
    assert response.status == 201 and (await response.json())["wallet_id"] == "none"


async def test_heartbeat_get_list_and_delete(api) -> None:  # type: ignore[no-untyped-def]
    client, world = api
    assert (await client.post("/v1/clusters/alice/w1/heartbeat", headers=AUTH)).status == 404
    created = await (await client.put("/v1/clusters/alice/w1", headers=AUTH)).json()
    world.now += 10
    assert (await client.post("/v1/clusters/alice/w1/heartbeat", headers=AUTH)).status == 204
    got = await client.get("/v1/clusters/alice/w1", headers=AUTH)
    assert got.status == 200 and (await got.json())["last_heartbeat"] == world.now
    listed = await client.get("/v1/clusters", headers=AUTH)
    assert listed.status == 200 and [c["id"] for c in await listed.json()] == [created["id"]]
    deleted = await client.delete("/v1/clusters/alice/w1", headers=AUTH)
    assert deleted.status == 202 and (await deleted.json())["state"] == "ending"
    assert (await client.delete("/v1/clusters/alice/w1", headers=AUTH)).status == 404


async def test_unknown_cluster_is_404(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    response = await client.get("/v1/clusters/nobody/none", headers=AUTH)
    assert response.status == 404 and "error" in await response.json()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/clusters/alice/w1"),
        ("POST", "/v1/clusters/alice/w1/heartbeat"),
        ("GET", "/v1/clusters"),
        ("GET", "/v1/clusters/alice/w1"),
        ("DELETE", "/v1/clusters/alice/w1"),
    ],
)
async def test_every_route_needs_the_token(api, headers, method, path) -> None:  # type: ignore[no-untyped-def]
    client, world = api
    response = await client.request(method, path, headers=headers)
    assert response.status == 401
    assert (await response.json()) == {"error": "missing or wrong bearer token"}
    assert world.hosts.created == 0


@pytest.mark.parametrize(
    "path", ["/v1/clusters/a%20b/w1", "/v1/clusters/alice/-w", "/v1/clusters/" + "x" * 65 + "/w"]
)
async def test_malformed_ids_are_422_with_the_rule(api, path) -> None:  # type: ignore[no-untyped-def]
    client, world = api
    response = await client.put(path, headers=AUTH)
    assert response.status == 422
    assert "1 to 64 characters" in (await response.json())["error"]
    assert world.hosts.created == 0


async def test_cloud_unreachable_is_503_json(api) -> None:  # type: ignore[no-untyped-def]
    client, world = api
    world.hosts.fail = True
    response = await client.put("/v1/clusters/alice/w1", headers=AUTH)
    assert response.status == 503 and "cloud unavailable" in (await response.json())["error"]


async def test_unknown_route_is_json_404(api) -> None:  # type: ignore[no-untyped-def]
    client, _ = api
    response = await client.get("/v1/nothing", headers=AUTH)
    assert response.status == 404 and "error" in await response.json()


async def test_healthz_and_metrics_need_no_token_and_count_requests(api) -> None:  # type: ignore[no-untyped-def]
    client, world = api
    await client.put("/v1/clusters/alice/w1", headers=AUTH)
    await client.get("/v1/clusters", headers={})
    world.probe.answers["http://kc-0001:8787"] = Probe(answered=True)
    health = await client.get("/healthz")
    assert health.status == 200
    text = await (await client.get("/metrics")).text()
    assert 'keeper_clusters{state="starting"} 1.0' in text
    assert (
        'keeper_requests_total{method="PUT",route="/v1/clusters/{user_id}/{wallet_id}",status="201"} 1.0'
        in text
    )
    assert 'keeper_requests_total{method="GET",route="/v1/clusters",status="401"} 1.0' in text
    assert TOKEN not in text
