"""Usage per wallet, never lost: `swarm-autoscaler keeper` processes against a real moto server (over
HTTP) and a real redis-server count every machine of every cluster (primaries and a worker), one keeper
is killed with SIGKILL mid-run and a new one started, machines end while no keeper runs, and the ledger
still matches, within one second per machine, the bill recomputed from moto's launch and termination
times (per-second billing, 60-second minimum, list prices)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from tests.keeper.test_keeper_process import CLI, TOKEN, _healthy, free_port, keeper_env

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = pytest.mark.timeout(240)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer(seed=5) as server:
        yield server


@pytest.fixture(scope="module")
def network(moto: MotoServer) -> LocalNetwork:
    return provision_network(
        moto.endpoint, prefix=claim_loopback_prefix()
    )  # private IPs on loopback: probes stay local


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="usage-Redis-pw") as server:
        yield server


@pytest.fixture
async def raw_ec2(moto: MotoServer) -> AsyncIterator[Any]:
    async with get_session().create_client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=moto.endpoint,
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
        config=AioConfig(retries={"total_max_attempts": 1, "mode": "standard"}),
    ) as client:
        yield client


async def _start(env: dict[str, str], base: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        CLI, "keeper", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env
    )
    await _healthy(base, proc)
    return proc


async def _ours(raw_ec2: Any, keeper: str) -> list[dict[str, Any]]:
    out = []
    for tag in ("swarm-autoscaler/keeper", "swarm-autoscaler-keeper"):
        result = await raw_ec2.describe_instances(Filters=[{"Name": f"tag:{tag}", "Values": [keeper]}])
        out += [raw for res in result["Reservations"] for raw in res["Instances"]]
    return out


def _bill(raw: dict[str, Any]) -> float:
    """Seconds billed, recomputed from moto alone: launch to the time in the termination reason."""
    text = raw["StateTransitionReason"].rsplit("(", 1)[1].rstrip(")").replace(" UTC", "").replace(" GMT", "")
    end = datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return max(60.0, end - raw["LaunchTime"].timestamp())


def _counted_key(keeper: str, instance_id: str) -> str:
    return f"swarm-autoscaler:keeper:{keeper}:usage:machine:{instance_id}"


async def _closed_usage(
    session: aiohttp.ClientSession, base: str, redis_url: str, keeper: str, machines: list[dict[str, Any]]
) -> dict[str, Any]:
    """The usage once the keeper's readings saw every machine ended: each machine's counted seconds in
    redis reached its bill from moto (a reading of an ended machine bills it to its end; the ledger only
    adds, so a running reading taken past that end stays above it). A reading that listed the machine
    before its end may still be in flight: two more seconds let it land."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 30
        while True:
            counted = [await client.hget(_counted_key(keeper, m["InstanceId"]), "s") for m in machines]
            closed = [
                c is not None and float(c) >= _bill(m) - 0.01 for c, m in zip(counted, machines, strict=True)
            ]
            if all(closed) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await client.aclose()
    assert all(closed), list(zip(counted, [_bill(m) for m in machines], strict=True))
    await asyncio.sleep(2.0)
    async with session.get(f"{base}/v1/usage", headers=AUTH) as response:
        usage: dict[str, Any] = await response.json()
    return usage


async def test_usage_survives_a_sigkill_and_matches_the_bill_from_moto(
    moto: MotoServer, network: LocalNetwork, redis_server: RedisServer, raw_ec2: Any
) -> None:
    port = free_port()
    env = keeper_env(moto, network, redis_server, port)
    env["AUTOSCALER_KEEPER_USAGE_INTERVAL"] = "0.5s"
    name = env["AUTOSCALER_KEEPER_NAME"]
    base = f"http://127.0.0.1:{port}"
    proc = await _start(env, base)
    second: asyncio.subprocess.Process | None = None
    try:
        async with aiohttp.ClientSession() as session:
            clusters = {}
            for user, wallet in (("alice", "w1"), ("bob", "w2")):
                async with session.put(f"{base}/v1/clusters/{user}/{wallet}", headers=AUTH) as response:
                    assert response.status == 201
                    clusters[user] = (await response.json())["id"]
            # A worker of alice's cluster, tagged as its own autoscaler tags them.
            launched = await raw_ec2.run_instances(
                ImageId=network.ami_id,
                InstanceType="t3.micro",
                MinCount=1,
                MaxCount=1,
                SubnetId=network.subnet_ids[0],
                TagSpecifications=[
                    {
                        "ResourceType": "instance",
                        "Tags": [
                            {"Key": "managed-by", "Value": "swarm-autoscaler"},
                            {"Key": "swarm-autoscaler/cluster", "Value": clusters["alice"]},
                            {"Key": "swarm-autoscaler-keeper", "Value": name},
                            {"Key": "swarm-autoscaler-keeper-user", "Value": "alice"},
                            {"Key": "swarm-autoscaler-keeper-wallet", "Value": "w1"},
                        ],
                    }
                ],
            )
            worker = launched["Instances"][0]["InstanceId"]
            await asyncio.sleep(3)
            async with session.get(f"{base}/v1/usage") as response:
                assert response.status == 401
            deadline = time.monotonic() + 20  # a reading or two, however loaded the machine
            while True:
                async with session.get(f"{base}/v1/usage?user_id=alice", headers=AUTH) as response:
                    assert response.status == 200
                    early = await response.json()
                if early["instance_seconds"] >= 120.0 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            assert early["instance_seconds"] >= 120.0  # two machines, each at least the minute
            assert {c["cluster_id"] for c in early["clusters"]} == {clusters["alice"]}

            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            # The worker ends while no keeper runs; its seconds must still be counted once.
            await raw_ec2.terminate_instances(InstanceIds=[worker])
            await asyncio.sleep(1.5)
            second = await _start(env, base)
            await asyncio.sleep(62)  # past the minimum: the primaries' bills grow by the second
            for user, wallet in (("alice", "w1"), ("bob", "w2")):
                async with session.delete(f"{base}/v1/clusters/{user}/{wallet}", headers=AUTH) as response:
                    assert response.status == 202
                await asyncio.sleep(2)

            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                machines = await _ours(raw_ec2, name)
                if all(m["State"]["Name"] == "terminated" for m in machines):
                    break
                await asyncio.sleep(0.5)
            assert all(m["State"]["Name"] == "terminated" for m in machines), machines
            usage = await _closed_usage(session, base, redis_server.url, name, machines)
            await asyncio.sleep(3.0)  # six more readings at 0.5 s
            async with session.get(f"{base}/v1/usage", headers=AUTH) as response:
                assert await response.json() == usage, "a terminated machine's bill kept growing"
    finally:
        for p in (proc, second):
            if p is not None and p.returncode is None:
                p.send_signal(signal.SIGTERM)
                await asyncio.wait_for(p.wait(), 30)

    assert len(machines) == 3 and all(m["State"]["Name"] == "terminated" for m in machines)
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        for raw in machines:
            counted = await client.hget(_counted_key(name, raw["InstanceId"]), "s")
            assert counted is not None
            assert abs(float(counted) - _bill(raw)) <= 1.0, raw["InstanceId"]
    finally:
        await client.aclose()
    by_cluster = {c["cluster_id"]: c for c in usage["clusters"]}
    assert set(by_cluster) == set(clusters.values())
    for cid in clusters.values():
        mine = [m for m in machines if cid in {t["Value"] for t in m["Tags"]}]
        seconds = sum(_bill(m) for m in mine)
        cost = sum(_bill(m) * CATALOGUE[m["InstanceType"]].price_per_hour / 3600 for m in mine)  # type: ignore[operator]
        assert abs(by_cluster[cid]["instance_seconds"] - seconds) <= len(mine)
        assert abs(by_cluster[cid]["cost_usd"] - cost) <= len(mine) * 0.2 / 3600 + 1e-6
    alice_primary = [
        m for m in machines if m["InstanceType"] == "m5.large" and clusters["alice"] in str(m["Tags"])
    ]
    assert _bill(alice_primary[0]) > 65.0  # the test measured past the minimum
    wallets = {(w["user_id"], w["wallet_id"]) for w in usage["wallets"]}
    assert wallets == {("alice", "w1"), ("bob", "w2")}
    print(
        "usage after a SIGKILL, per cluster (ledger vs moto):",
        {cid: (round(by_cluster[cid]["instance_seconds"], 1)) for cid in clusters.values()},
    )
