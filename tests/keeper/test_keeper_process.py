"""`swarm-autoscaler keeper` as a subprocess against a real moto server (over HTTP, instance-type
validation on) and a real redis-server: the token guards the API, a PUT launches a tagged primary, a
DELETE terminates it, the token never reaches the logs, SIGTERM ends the process promptly, and a
wrong setting is one line naming the variable."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from tests.startup import startup_events

from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.cloud import env_without_autoscaler
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

CLI = str(Path(sys.executable).with_name("swarm-autoscaler"))
TOKEN = "k33per-T0ken-that-must-never-leak"
REDIS_PASSWORD = "keeper-Redis-pw"
EC2_SECRET = "keeper/Ec2+Secret-never-logged"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer(seed=3) as server:
        yield server


@pytest.fixture(scope="module")
def network(moto: MotoServer) -> LocalNetwork:
    return provision_network(
        moto.endpoint, prefix=claim_loopback_prefix()
    )  # private IPs on loopback: probes stay local


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password=REDIS_PASSWORD) as server:
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


def keeper_env(moto: MotoServer, network: LocalNetwork, redis: RedisServer, port: int) -> dict[str, str]:
    """A keeper process's environment. Its name is unique in the whole run, not per module: moto's
    backends are process-wide, so a later module's fresh MotoServer still holds an earlier module's
    machines, and a repeated keeper name would count them as its own."""
    env = env_without_autoscaler()
    env.update(
        {
            "AUTOSCALER_KEEPER_TOKEN": TOKEN,
            "AUTOSCALER_KEEPER_PUBLIC_URL": f"http://127.0.0.1:{port}",
            # plain HTTP on loopback (the default, HTTPS, is tests/keeper/test_api_tls_default.py's)
            "AUTOSCALER_KEEPER_PLAIN_HTTP": "true",
            "AUTOSCALER_KEEPER_NAME": f"proc-keeper-{uuid.uuid4().hex[:8]}",
            "AUTOSCALER_KEEPER_PRIMARY_TYPE": "m5.large",
            "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": network.ami_id,
            "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps({"t3.micro": {"ami_id": network.ami_id}}),
            "AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER": "4",
            "AUTOSCALER_KEEPER_CHECK_INTERVAL": "0.5s",
            "AUTOSCALER_KEEPER_LOCK_TTL": "2s",
            "AUTOSCALER_KEEPER_HTTP_PORT": str(port),
            # the primaries' scheduler ports, not dask's 8786/8787: a scheduler listening on every address
            # beside this run (the README's stack in make test's dockerd lane) would answer the keeper's
            # probe at a primary's loopback address, and its cluster would look running unbooted
            "AUTOSCALER_KEEPER_SCHEDULER_PORT": str(free_port()),
            "AUTOSCALER_KEEPER_DASHBOARD_PORT": str(free_port()),
            "AUTOSCALER_HTTP_HOST": "127.0.0.1",
            "AUTOSCALER_EC2_ENDPOINT": moto.endpoint,
            "AUTOSCALER_EC2_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AUTOSCALER_EC2_SECRET_ACCESS_KEY": EC2_SECRET,  # moto takes any
            "AUTOSCALER_EC2_SUBNET_IDS": ",".join(network.subnet_ids),
            "AUTOSCALER_EC2_SECURITY_GROUP_IDS": network.security_group_id,
            "AUTOSCALER_REDIS_URL": redis.url,
            "AUTOSCALER_LOG_FORMAT": "json",
        }
    )
    return env


async def _healthy(base: str, proc: asyncio.subprocess.Process, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            assert proc.returncode is None, "the keeper exited during start-up"
            try:
                async with session.get(f"{base}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError("the keeper's /healthz never answered 200")


async def _primaries(raw_ec2: Any, cluster_id: str) -> list[dict[str, Any]]:
    result = await raw_ec2.describe_instances(
        Filters=[{"Name": "tag:swarm-autoscaler/keeper/cluster-id", "Values": [cluster_id]}]
    )
    return [raw for res in result["Reservations"] for raw in res["Instances"]]


async def _state_becomes(raw_ec2: Any, cluster_id: str, states: tuple[str, ...], within: float) -> str:
    deadline = time.monotonic() + within
    state = ""
    while time.monotonic() < deadline:
        (raw,) = await _primaries(raw_ec2, cluster_id)
        state = raw["State"]["Name"]
        if state in states:
            return state
        await asyncio.sleep(0.2)
    raise AssertionError(f"the primary stayed {state}")


async def test_keeper_process_serves_the_api_launches_and_ends_a_cluster_and_stops_on_sigterm(
    moto: MotoServer, network: LocalNetwork, redis_server: RedisServer, raw_ec2: Any
) -> None:
    port = free_port()
    env = keeper_env(moto, network, redis_server, port)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    proc = await asyncio.create_subprocess_exec(
        CLI, "keeper", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        await _healthy(base, proc)
        async with aiohttp.ClientSession() as session:
            async with session.put(f"{base}/v1/clusters/alice/w1") as response:
                assert response.status == 401
                assert "error" in await response.json()
            async with session.put(f"{base}/v1/clusters/alice/w1", headers=auth) as response:
                assert response.status == 201
                created = await response.json()
            async with session.put(f"{base}/v1/clusters/alice/w1", headers=auth) as response:
                assert response.status == 200
                assert (await response.json())["id"] == created["id"]

            (primary,) = await _primaries(raw_ec2, created["id"])
            tags = {t["Key"]: t["Value"] for t in primary["Tags"]}
            assert primary["InstanceType"] == "m5.large"
            assert tags["managed-by"] == "swarm-autoscaler"
            assert tags["swarm-autoscaler/keeper"] == env["AUTOSCALER_KEEPER_NAME"]
            assert (tags["swarm-autoscaler/keeper/user"], tags["swarm-autoscaler/keeper/wallet"]) == (
                "alice",
                "w1",
            )
            assert created["state"] == "starting"
            assert created["scheduler_url"] == (
                f"tls://{primary['PrivateIpAddress']}:{env['AUTOSCALER_KEEPER_SCHEDULER_PORT']}"
            )

            async with session.delete(f"{base}/v1/clusters/alice/w1", headers=auth) as response:
                assert response.status == 202
            await _state_becomes(raw_ec2, created["id"], ("shutting-down", "terminated"), within=20)
            async with session.get(f"{base}/metrics") as response:
                text = await response.text()
            assert 'keeper_lifecycle_actions_total{action="create"} 1.0' in text
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        stopped_in = time.monotonic() - started
    assert proc.returncode == 0, err.decode()
    assert stopped_in < 10.0
    logs = out.decode() + err.decode()
    assert (
        TOKEN not in logs
        and REDIS_PASSWORD not in logs
        and LOCAL_SECRET_KEY not in logs.replace("testing", "")
    )
    events = [json.loads(line)["event"] for line in logs.splitlines() if line.startswith("{")]
    assert "started: every endpoint answered" in events and events[-1] == "stopped"


async def _run_briefly(env: Mapping[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, "keeper", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(env)
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_wrong_setting_is_one_line_naming_it_and_the_token_is_never_echoed(
    moto: MotoServer, network: LocalNetwork, redis_server: RedisServer
) -> None:
    env = keeper_env(moto, network, redis_server, free_port())
    env["AUTOSCALER_KEEPER_TOKEN"] = "short-secret"

    code, out, err = await _run_briefly(env)

    assert (code, out) == (2, "")
    assert startup_events(err) == [
        "configuration error: AUTOSCALER_KEEPER_TOKEN: expected at least 16 characters"
    ]


async def test_an_unreachable_redis_is_one_line_naming_the_variable(
    moto: MotoServer, network: LocalNetwork, redis_server: RedisServer
) -> None:
    env = keeper_env(moto, network, redis_server, free_port())
    env["AUTOSCALER_REDIS_URL"] = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0"

    code, out, err = await _run_briefly(env)

    assert code == 3 and out == ""
    (line,) = startup_events(err)
    assert "(AUTOSCALER_REDIS_URL)" in line and REDIS_PASSWORD not in err


async def test_a_busy_api_port_is_one_line_naming_the_variable(
    moto: MotoServer, network: LocalNetwork, redis_server: RedisServer
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = keeper_env(moto, network, redis_server, busy.getsockname()[1])

        code, out, err = await _run_briefly(env)

    assert code == 2 and out == ""
    (line,) = startup_events(err)
    assert line.startswith("configuration error: AUTOSCALER_KEEPER_HTTP_PORT: cannot listen on 127.0.0.1:")
