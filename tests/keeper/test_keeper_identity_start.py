"""`swarm-autoscaler keeper` refuses to start beside another keeper deployment under its name, in one line,
and starts beside its own (a second replica, a restart): as subprocesses against a real moto server over
HTTP (moto stands in for EC2) and a real redis-server. The first keeper's primary is launched by its own
process through its API; the second keeper is deployed by hand under the same AUTOSCALER_KEEPER_NAME with
another token, so another deployment id (`credentials.deployment_id`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import aiohttp
import pytest
from tests.keeper.test_keeper_process import CLI, TOKEN, _healthy, _run_briefly, free_port, keeper_env
from tests.startup import startup_events

from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer(seed=13) as server:
        yield server


@pytest.fixture(scope="module")
def network(moto: MotoServer) -> LocalNetwork:
    return provision_network(moto.endpoint, prefix=claim_loopback_prefix())


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="identity-Redis-pw") as server:
        yield server


async def test_a_second_keeper_deployment_under_the_same_name_is_refused_in_one_line(
    moto: MotoServer, network: LocalNetwork, redis_server: RedisServer
) -> None:
    port = free_port()
    first = keeper_env(moto, network, redis_server, port)
    name = first["AUTOSCALER_KEEPER_NAME"]
    proc = await asyncio.create_subprocess_exec(
        CLI, "keeper", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=first
    )
    try:
        base = f"http://127.0.0.1:{port}"
        await _healthy(base, proc)
        async with aiohttp.ClientSession() as http:
            made = await http.put(
                f"{base}/v1/clusters/alice/w1", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert made.status == 201, await made.text()
            primary_cluster = (await made.json())["id"]

        # Deployed by hand under the same name: another token, another redis database.
        other = keeper_env(moto, network, redis_server, free_port())
        other.update(
            AUTOSCALER_KEEPER_NAME=name,
            AUTOSCALER_KEEPER_TOKEN=f"another-keeper-token-{uuid.uuid4().hex}",
            AUTOSCALER_REDIS_URL=other["AUTOSCALER_REDIS_URL"].rsplit("/", 1)[0] + "/1",
        )
        code, out, err = await _run_briefly(other)
        assert (code, out) == (2, "")
        (line,) = startup_events(err)
        assert line.startswith(f"configuration error: AUTOSCALER_KEEPER_NAME: {name!r} is already used"), line
        assert "nothing of the other was touched" in line and other["AUTOSCALER_KEEPER_TOKEN"] not in err

        # A second replica of the first (same token, same redis) starts: it is the same deployment.
        replica = dict(first, AUTOSCALER_KEEPER_HTTP_PORT=str(free_port()))
        replica["AUTOSCALER_KEEPER_PUBLIC_URL"] = f"http://127.0.0.1:{replica['AUTOSCALER_KEEPER_HTTP_PORT']}"
        second = await asyncio.create_subprocess_exec(
            CLI, "keeper", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=replica
        )
        try:
            await _healthy(replica["AUTOSCALER_KEEPER_PUBLIC_URL"], second)
        finally:
            second.terminate()
            await second.wait()
        assert primary_cluster.startswith("kc-")
    finally:
        proc.terminate()
        await proc.wait()
