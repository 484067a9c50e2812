"""The credentials routes: the primary's one-time token (answers once, then 410 Gone; never the API
token's holder without it), the client's files behind the API token, and the store on a real redis
shared by two replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.adapters.redis_credentials import RedisCredentials
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import InProcessCredentials, primary_token
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

TOKEN = "s3cret-token-of-the-keeper"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def api() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    now = [1_000_000.0]
    keeper = Keeper(
        FakeHosts(), FakeProbe(), SharedLocks(lambda: now[0]).for_replica("a"), KeeperTiming(),
        interval=0.05, clock=lambda: now[0],
    )  # fmt: skip
    app = build_keeper_app(keeper, TOKEN, KeeperMetrics(), credentials=InProcessCredentials(make_credentials))
    async with TestClient(TestServer(app)) as client:
        yield client
    await keeper.stop()


async def test_the_primary_gets_its_files_once_with_its_one_time_token(api) -> None:  # type: ignore[no-untyped-def]
    cluster = await (await api.put("/v1/clusters/alice/w1", headers=AUTH)).json()
    url = f"/v1/primaries/{cluster['id']}/credentials"
    assert (await api.get(url)).status == 401
    assert (await api.get(url, headers=AUTH)).status == 401  # the API token is not the primary's
    wrong = {"Authorization": f"Bearer {primary_token(TOKEN, 'kc-other')}"}
    assert (await api.get(url, headers=wrong)).status == 401
    mine = {"Authorization": f"Bearer {primary_token(TOKEN, cluster['id'])}"}
    first = await api.get(url, headers=mine)
    assert first.status == 200 and first.headers["Cache-Control"] == "no-store"
    files = (await first.json())["files"]
    assert set(files) == {"ca.pem", "scheduler.pem", "scheduler-key.pem", "worker.pem", "worker-key.pem"}
    again = await api.get(url, headers=mine)
    assert again.status == 410 and "already used" in (await again.json())["error"]

    client_files = await api.get("/v1/clusters/alice/w1/credentials", headers=AUTH)
    assert client_files.status == 200
    body = await client_files.json()
    assert set(body["files"]) == {"ca.pem", "client.pem", "client-key.pem"}
    assert body["files"]["ca.pem"] == files["ca.pem"]  # one CA per cluster, for both holders
    assert body["scheduler_url"] == cluster["scheduler_url"]


async def test_the_client_s_files_need_the_api_token_and_a_live_cluster(api) -> None:  # type: ignore[no-untyped-def]
    assert (await api.get("/v1/clusters/alice/w1/credentials", headers=AUTH)).status == 404
    await api.put("/v1/clusters/alice/w1", headers=AUTH)
    assert (await api.get("/v1/clusters/alice/w1/credentials")).status == 401
    other = await api.get("/v1/clusters/bob/w1/credentials", headers=AUTH)
    assert other.status == 404


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="pw-of-the-test") as server:
        yield server


async def test_two_replicas_share_one_set_and_one_spent_token(redis_server: RedisServer) -> None:
    a = RedisCredentials(redis_server.url, "keeper-t", make_credentials)
    b = RedisCredentials(redis_server.url, "keeper-t", make_credentials)
    try:
        first, second = await asyncio.gather(a.get_or_make("kc-9"), b.get_or_make("kc-9"))
        assert first == second
        assert [await a.use_once("kc-9"), await b.use_once("kc-9")] == [True, False]
        await a.forget("kc-9")
        assert (await b.get_or_make("kc-9")).ca_cert != first.ca_cert
    finally:
        await a.close()
        await b.close()
