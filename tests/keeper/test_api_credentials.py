"""The credentials routes: the primary's one-time token (from its private IP only; answers once, then
410 Gone; never the API token's holder without it), the client's files behind the API token, and the store on a real redis
shared by two replicas."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.adapters.redis_credentials import RedisCredentials
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import InProcessCredentials, listing_token, primary_token
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterState
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

TOKEN = "s3cret-token-of-the-keeper"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def api() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    now = [1_000_000.0]
    keeper = Keeper(
        FakeHosts(), FakeProbe(), SharedLocks(lambda: now[0]).for_replica("a"), KeeperTiming(),
        interval=0.05, clock=lambda: now[0], bind_primaries=True,  # AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS
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
    answer = await first.json()
    files = answer["files"]
    assert set(files) == {"ca.pem", "scheduler.pem", "scheduler-key.pem", "worker.pem", "worker-key.pem"}
    # the cluster token of its autoscaler (listing and launches) comes here, not in user data
    assert answer["listing_token"] == listing_token(TOKEN, cluster["id"])
    listing_url = f"/v1/primaries/{cluster['id']}/instances"
    assert (await api.get(listing_url, headers=mine)).status == 401  # the one-time token lists nothing
    listed = await api.get(listing_url, headers={"Authorization": f"Bearer {answer['listing_token']}"})
    assert listed.status == 503  # accepted: the fake EC2 has no listing yet (the adapter tests list)
    again = await api.get(url, headers=mine)
    assert again.status == 410 and "already used" in (await again.json())["error"]

    client_files = await api.get("/v1/clusters/alice/w1/credentials", headers=AUTH)
    assert client_files.status == 200
    body = await client_files.json()
    assert set(body["files"]) == {"ca.pem", "client.pem", "client-key.pem"}
    assert body["files"]["ca.pem"] == files["ca.pem"]  # one CA per cluster, for both holders
    assert body["scheduler_url"] == cluster["scheduler_url"]


async def test_the_one_time_token_from_another_address_gets_nothing_and_is_not_spent(api) -> None:  # type: ignore[no-untyped-def]
    """The race before boot: someone who read the primary's user data (DescribeInstanceAttribute) uses
    its token first, from their own address: 403, and the primary, from its private IP (the fake EC2
    gives 127.0.0.1, the test client's source), still gets its files once. Another machine in the VPC
    stands in as a client bound to 127.0.0.2."""
    cluster = await (await api.put("/v1/clusters/alice/w1", headers=AUTH)).json()
    url = str(api.make_url(f"/v1/primaries/{cluster['id']}/credentials"))
    mine = {"Authorization": f"Bearer {primary_token(TOKEN, cluster['id'])}"}
    elsewhere = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), force_close=True)
    async with aiohttp.ClientSession(connector=elsewhere) as attacker:
        with capture_logs() as logs:
            for _ in range(3):
                async with attacker.get(url, headers=mine) as stolen:
                    assert stolen.status == 403 and "files" not in await stolen.json()
    # each refusal is a warning naming both addresses and what an operator behind a mesh or NAT must do
    # (every primary refused is how a keeper deployed behind swarm's routing mesh shows), never the token
    warned = [e for e in logs if e["event"].startswith("one-time token refused")]
    assert [(e["log_level"], e["source"], e["primary_ip"]) for e in warned] == [
        ("warning", "127.0.0.2", "127.0.0.1")
    ] * 3
    assert "host mode" in warned[0]["hint"] and "BIND_PRIMARY_TOKENS=false" in warned[0]["hint"]
    assert not [e for e in logs if mine["Authorization"].split()[1] in repr(e)]
    first = await api.get(f"/v1/primaries/{cluster['id']}/credentials", headers=mine)
    assert first.status == 200 and "ca.pem" in (await first.json())["files"]
    again = await api.get(f"/v1/primaries/{cluster['id']}/credentials", headers=mine)
    assert again.status == 410


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


async def test_after_redis_comes_back_empty_a_running_cluster_gets_no_new_ca_and_its_token_no_second_use(
    redis_server: RedisServer,
) -> None:
    """Redis flushed (or replaced) under a running cluster: its primary runs on the CA it fetched at
    boot, so the keeper mints no new one (the user's files would not match: 409 with what to do, and an
    error line), and the primary's one-time token, whose spent mark went with redis, is still refused."""
    now = [1_000_000.0]
    hosts = FakeHosts()
    keeper = Keeper(
        hosts, FakeProbe(), SharedLocks(lambda: now[0]).for_replica("a"), KeeperTiming(),
        interval=0.05, clock=lambda: now[0],
    )  # fmt: skip
    store = RedisCredentials(redis_server.url, "keeper-lost", make_credentials)
    app = build_keeper_app(keeper, TOKEN, KeeperMetrics(), credentials=store)
    try:
        async with TestClient(TestServer(app)) as api:
            cluster = await (await api.put("/v1/clusters/alice/w1", headers=AUTH)).json()
            cid = cluster["id"]
            mine = {"Authorization": f"Bearer {primary_token(TOKEN, cid)}"}
            assert (await api.get(f"/v1/primaries/{cid}/credentials", headers=mine)).status == 200
            running = dataclasses.replace(hosts.clusters[cid], state=ClusterState.RUNNING)
            hosts.clusters[cid] = keeper._known[cid] = running  # its scheduler answered
            first = await (await api.get("/v1/clusters/alice/w1/credentials", headers=AUTH)).json()

            flusher = redis.Redis.from_url(redis_server.url)
            flusher.flushall()
            flusher.close()
            with capture_logs() as logs:
                lost = await api.get("/v1/clusters/alice/w1/credentials", headers=AUTH)
                again = await api.get(f"/v1/primaries/{cid}/credentials", headers=mine)
            assert lost.status == 409 and "end the cluster" in (await lost.json())["error"]
            assert again.status == 410
            assert [e["cluster"] for e in logs if e["event"] == "credentials lost"] == [cid, cid]
            assert await store.get(cid) is None  # nothing new was made
            assert first["files"]["ca.pem"]  # what the user held before stays the only CA
    finally:
        await keeper.stop()
        await store.close()


async def test_the_one_time_token_cannot_be_raced_by_many_concurrent_uses_through_two_replicas(
    redis_server: RedisServer,
) -> None:
    """Twenty concurrent fetches with the same one-time token, through two replicas sharing a real
    redis (an attacker who read the user data racing the booting primary): exactly one gets the files;
    the spent mark is one atomic SET NX, so no interleaving hands them out twice."""
    now = [1_000_000.0]
    hosts = FakeHosts()
    locks = SharedLocks(lambda: now[0])
    keepers = [
        Keeper(
            hosts,
            FakeProbe(),
            locks.for_replica(name),
            KeeperTiming(),
            interval=0.05,
            clock=lambda: now[0],
            bind_primaries=True,
        )
        for name in ("a", "b")
    ]
    stores = [RedisCredentials(redis_server.url, "keeper-race", make_credentials) for _ in keepers]
    apps = [
        build_keeper_app(k, TOKEN, KeeperMetrics(), credentials=s)
        for k, s in zip(keepers, stores, strict=True)
    ]
    try:
        async with TestClient(TestServer(apps[0])) as a, TestClient(TestServer(apps[1])) as b:
            cluster = await (await a.put("/v1/clusters/alice/w1", headers=AUTH)).json()
            # replica b lists it (its primary's private IP, which the token's source must be) as its next
            # interval would; before that it refuses the token without spending it
            await keepers[1].discover()
            url = f"/v1/primaries/{cluster['id']}/credentials"
            mine = {"Authorization": f"Bearer {primary_token(TOKEN, cluster['id'])}"}
            answers = await asyncio.gather(*[(a if i % 2 else b).get(url, headers=mine) for i in range(20)])
            assert sorted(r.status for r in answers) == [200] + [410] * 19
    finally:
        for keeper in keepers:
            await keeper.stop()
        for store in stores:
            await store.close()
