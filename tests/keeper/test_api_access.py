"""Who may call what: every route of the keeper's API with no token (401), another user's token (403),
the owner's token and the admin token (both allowed), on user tokens and a usage ledger kept in a real
redis-server. The table must name every route the app serves, so a new route cannot skip this test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.access import TOKEN_PREFIX, token_digest
from swarm_autoscaler.keeper.adapters.redis_budgets import RedisBudgets
from swarm_autoscaler.keeper.adapters.redis_tokens import RedisTokens
from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import InProcessCredentials, listing_token, primary_token
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.limits import Limits
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.keeper.usage import Machine, readings
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

ADMIN_TOKEN = "admin-token-of-the-keeper"
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="pw-of-the-access-test") as server:
        yield server


@dataclass
class World:
    client: TestClient  # type: ignore[type-arg]
    tokens: RedisTokens
    alice: dict[str, str]
    bob: dict[str, str]
    admin: dict[str, str]
    alice_cluster: str
    routes: set[tuple[str, str]]
    hosts: FakeHosts


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def world(redis_server: RedisServer) -> AsyncIterator[World]:
    name = f"access-{id(object())}"
    tokens = RedisTokens(redis_server.url, name)
    usage = RedisUsage(redis_server.url, name)
    budgets = RedisBudgets(redis_server.url, name)
    await budgets.set("w1", 100.0)
    now = [NOW]
    hosts = FakeHosts()
    keeper = Keeper(
        hosts, FakeProbe(), SharedLocks(lambda: now[0]).for_replica("a"), KeeperTiming(),
        interval=0.05, clock=lambda: now[0], limits=Limits(5, usage=usage, store=budgets),
    )  # fmt: skip
    credentials = InProcessCredentials(make_credentials)
    app = build_keeper_app(
        keeper, ADMIN_TOKEN, KeeperMetrics(), usage=usage, credentials=credentials, tokens=tokens
    )
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    async with TestClient(TestServer(app)) as client:
        admin = bearer(ADMIN_TOKEN)
        alice = bearer((await (await client.post("/v1/users/alice/token", headers=admin)).json())["token"])
        bob = bearer((await (await client.post("/v1/users/bob/token", headers=admin)).json())["token"])
        cluster = await (await client.put("/v1/clusters/alice/w1", headers=admin)).json()
        await client.put("/v1/clusters/bob/w9", headers=admin)
        machines = [
            Machine("i-a", "alice", "w1", cluster["id"], "m5.large", NOW - 600),
            Machine("i-b", "bob", "w9", "kc-b", "m5.large", NOW - 600),
        ]
        await usage.record(readings(machines, NOW, {"m5.large": 0.096}), NOW)
        yield World(client, tokens, alice, bob, admin, cluster["id"], served, hosts)
    await keeper.stop()
    await tokens.close()
    await usage.close()
    await budgets.close()


# (method, route as the app names it, the path for alice's resource, status for its owner and admin)
ROUTES = [
    ("PUT", "/v1/clusters/{user_id}/{wallet_id}", "/v1/clusters/alice/w1", 200),
    ("POST", "/v1/clusters/{user_id}/{wallet_id}/heartbeat", "/v1/clusters/alice/w1/heartbeat", 204),
    ("GET", "/v1/clusters/{user_id}/{wallet_id}", "/v1/clusters/alice/w1", 200),
    ("DELETE", "/v1/clusters/{user_id}/{wallet_id}", "/v1/clusters/alice/w1", 202),
    ("GET", "/v1/clusters/{user_id}/{wallet_id}/credentials", "/v1/clusters/alice/w1/credentials", 200),
    ("GET", "/v1/usage", "/v1/usage?user_id=alice", 200),
]
ADMIN_ROUTES = [
    ("POST", "/v1/users/{user_id}/token", "/v1/users/alice/token", 201),
    ("DELETE", "/v1/users/{user_id}/token", "/v1/users/alice/token", 204),
    ("GET", "/v1/wallets/{wallet_id}/budget", "/v1/wallets/w1/budget", 200),
    ("PUT", "/v1/wallets/{wallet_id}/budget", "/v1/wallets/w1/budget", 200),
    ("DELETE", "/v1/wallets/{wallet_id}/budget", "/v1/wallets/w1/budget", 204),
]
BODY = {"budget_usd": 5}  # sent with every request: the budget's PUT reads it


def body_of(route: str) -> dict[str, object]:
    """The body sent with a request: a create's reads only `profile` (400 for anything else)."""
    return {"profile": "default"} if route == "/v1/clusters/{user_id}/{wallet_id}" else BODY


OWN_TOKEN_ROUTES = [
    ("GET", "/v1/primaries/{cluster_id}/credentials"),
    ("GET", "/v1/primaries/{cluster_id}/instances"),
    (
        "POST",
        "/v1/primaries/{cluster_id}/launches",
    ),  # the cluster's token: tests/adapters/ec2/test_keeper_launches.py
    ("POST", "/v1/primaries/{cluster_id}/starts"),  # the same token and test file
]
LISTING = [("GET", "/v1/clusters")]
OPEN = [("GET", "/healthz"), ("GET", "/metrics")]


def test_the_tables_name_every_route_the_app_serves(world: World) -> None:
    named = {(m, r) for m, r, _, _ in ROUTES + ADMIN_ROUTES} | set(OWN_TOKEN_ROUTES + LISTING + OPEN)
    served = {(m, r) for m, r in world.routes if m != "HEAD"}
    assert served == named


@pytest.mark.parametrize(("method", "route", "path", "ok"), ROUTES + ADMIN_ROUTES)
async def test_no_token_or_an_unknown_one_is_401(
    world: World, method: str, route: str, path: str, ok: int
) -> None:
    for headers in ({}, bearer("kut_not-a-token-anyone-holds"), {"Authorization": ADMIN_TOKEN}):
        response = await world.client.request(method, path, json=body_of(route), headers=headers)
        assert response.status == 401, (route, headers)
        assert await response.json() == {"error": "missing or wrong bearer token"}
    if method == "DELETE" and route.startswith("/v1/clusters"):
        assert (await world.client.get(path, headers=world.admin)).status == 200  # still there
        assert (await (await world.client.get(path, headers=world.admin)).json())["state"] == "starting"


@pytest.mark.parametrize(("method", "route", "path", "ok"), ROUTES)
async def test_another_user_s_token_is_403_and_changes_nothing(
    world: World, method: str, route: str, path: str, ok: int
) -> None:
    response = await world.client.request(method, path, json=body_of(route), headers=world.bob)
    assert response.status == 403, route
    assert "another user" in (await response.json())["error"]
    state = await (await world.client.get("/v1/clusters/alice/w1", headers=world.admin)).json()
    assert state["state"] == "starting" and state["last_heartbeat"] == NOW


@pytest.mark.parametrize(("method", "route", "path", "ok"), ROUTES)
async def test_the_owner_s_token_and_the_admin_s_are_allowed(
    world: World, method: str, route: str, path: str, ok: int
) -> None:
    for who in (world.alice, world.admin):
        response = await world.client.request(method, path, json=body_of(route), headers=who)
        expected = 404 if method == "DELETE" and who is world.admin else ok  # alice already ended it
        assert response.status == expected, (route, who is world.admin)


@pytest.mark.parametrize(("method", "route", "path", "ok"), ADMIN_ROUTES)
async def test_admin_routes_refuse_every_user_token(
    world: World, method: str, route: str, path: str, ok: int
) -> None:
    for who in (world.alice, world.bob):
        response = await world.client.request(method, path, json=body_of(route), headers=who)
        assert response.status == 403 and "admin token" in (await response.json())["error"]
    assert (await world.client.request(method, path, json=body_of(route), headers=world.admin)).status == ok


async def test_the_listing_shows_a_user_its_own_clusters_and_the_admin_all(world: World) -> None:
    mine = await (await world.client.get("/v1/clusters", headers=world.alice)).json()
    assert [c["user_id"] for c in mine] == ["alice"]
    assert [
        c["user_id"] for c in await (await world.client.get("/v1/clusters", headers=world.bob)).json()
    ] == ["bob"]
    every = await (await world.client.get("/v1/clusters", headers=world.admin)).json()
    assert sorted(c["user_id"] for c in every) == ["alice", "bob"]
    assert (await world.client.get("/v1/clusters")).status == 401


async def test_usage_a_user_reads_its_own_only(world: World) -> None:
    own = await (await world.client.get("/v1/usage", headers=world.alice)).json()
    assert [w["user_id"] for w in own["wallets"]] == ["alice"]
    refused = await world.client.get("/v1/usage?user_id=alice", headers=world.bob)
    assert refused.status == 403 and "another user" in (await refused.json())["error"]
    every = await (await world.client.get("/v1/usage", headers=world.admin)).json()
    assert sorted(w["user_id"] for w in every["wallets"]) == ["alice", "bob"]


async def test_the_primary_route_takes_only_its_one_time_token(world: World) -> None:
    path = f"/v1/primaries/{world.alice_cluster}/credentials"
    for who in ({}, world.alice, world.bob, world.admin):
        assert (await world.client.get(path, headers=who)).status == 401
    assert (
        await world.client.get(path, headers=bearer(primary_token(ADMIN_TOKEN, world.alice_cluster)))
    ).status == 200


async def test_the_listing_route_takes_only_its_cluster_s_listing_token(world: World) -> None:
    """A cluster's autoscaler reads its instances from the keeper (one DescribeInstances by the keeper
    for every cluster) with a read-only token of its own cluster: no other token opens it, and its token
    opens no other cluster's listing nor the credentials route."""
    path = f"/v1/primaries/{world.alice_cluster}/instances"
    own = bearer(listing_token(ADMIN_TOKEN, world.alice_cluster))
    others = (
        {},
        world.alice,
        world.admin,
        bearer(primary_token(ADMIN_TOKEN, world.alice_cluster)),
        bearer(listing_token(ADMIN_TOKEN, "kc-another")),
    )
    for who in others:
        assert (await world.client.get(path, headers=who)).status == 401
    credentials = f"/v1/primaries/{world.alice_cluster}/credentials"
    assert (await world.client.get(credentials, headers=own)).status == 401
    entry = {"InstanceId": "i-w1", "State": {"Name": "running"}}  # (as Ec2Primaries gives it)
    world.hosts.workers[world.alice_cluster] = [entry]
    await world.hosts.list_clusters()  # the keeper's listing: one read for every cluster
    response = await world.client.get(path, headers=own)
    assert response.status == 200
    body = await response.json()
    assert body["cluster_id"] == world.alice_cluster and body["instances"] == [entry]


async def test_healthz_and_metrics_need_no_token(world: World) -> None:
    for path in ("/healthz", "/metrics"):
        assert (await world.client.get(path)).status in (200, 503)


async def test_a_token_is_shown_once_kept_as_a_digest_and_replaced_or_revoked(
    world: World, redis_server: RedisServer
) -> None:
    issued = await world.client.post("/v1/users/carol/token", headers=world.admin)
    assert issued.status == 201 and issued.headers["Cache-Control"] == "no-store"
    token = (await issued.json())["token"]
    assert token.startswith(TOKEN_PREFIX) and len(token) > 40
    assert (await world.client.put("/v1/clusters/carol/w1", headers=bearer(token))).status == 201
    raw = redis.Redis.from_url(redis_server.url)
    stored = raw.keys("*")  # what a dump of redis shows: digests, never a token
    assert not any(token.encode() in key for key in stored)
    assert any(token_digest(token).encode() in key for key in stored)
    values = [raw.get(k) for k in stored if b":token:" in k or b"user-token" in k]
    assert values and all(token.encode() not in (v or b"") for v in values)
    raw.close()

    again = (await (await world.client.post("/v1/users/carol/token", headers=world.admin)).json())["token"]
    assert again != token
    assert (await world.client.get("/v1/clusters/carol/w1", headers=bearer(token))).status == 401
    assert (await world.client.get("/v1/clusters/carol/w1", headers=bearer(again))).status == 200
    assert (await world.client.delete("/v1/users/carol/token", headers=world.admin)).status == 204
    assert (await world.client.get("/v1/clusters/carol/w1", headers=bearer(again))).status == 401
    assert (await world.client.delete("/v1/users/carol/token", headers=world.admin)).status == 404
    assert (await world.client.post("/v1/users/bad%20id/token", headers=world.admin)).status == 422
