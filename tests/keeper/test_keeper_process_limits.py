"""The keeper's limits and tokens as an operator meets them: `swarm-autoscaler keeper` as a subprocess on a
real moto server (over HTTP) and a real redis-server.

- per-user tokens: a user's token reaches its own clusters only (403 on every route of another user's);
- clusters per user: the create over the limit is 429 and launches nothing; once one ends, a create passes;
- a wallet's spent budget: the create is 402 and launches nothing;
- the cluster's TLS files: given to the token holder, never in the logs, the machine's tags or its user data.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from tests.keeper.test_keeper_process import (
    CLI,
    TOKEN,
    _healthy,
    _primaries,
    free_port,
    keeper_env,
    moto,
    network,
    raw_ec2,
    redis_server,
)

from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)
__all__ = ["moto", "network", "raw_ec2", "redis_server"]  # the fixtures this module reuses

ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, headers: Mapping[str, str], **kw: Any
) -> tuple[int, Any]:
    async with session.request(method, url, headers=dict(headers), **kw) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, body


async def _user_ids(raw_ec2: Any, keeper: str) -> list[tuple[str, str]]:
    """(user, wallet) of each live primary this keeper launched, read from EC2."""
    result = await raw_ec2.describe_instances(
        Filters=[
            {"Name": "tag:swarm-autoscaler/keeper", "Values": [keeper]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    out = []
    for reservation in result["Reservations"]:
        for raw in reservation["Instances"]:
            tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
            out.append((tags["swarm-autoscaler/keeper/user"], tags["swarm-autoscaler/keeper/wallet"]))
    return sorted(out)


async def test_user_tokens_limits_and_budgets_hold_in_a_keeper_process_on_moto(
    moto: MotoServer, network: LocalNetwork, redis_server: RedisServer, raw_ec2: Any
) -> None:
    port = free_port()
    env = keeper_env(moto, network, redis_server, port)
    env["AUTOSCALER_KEEPER_MAX_CLUSTERS_PER_USER"] = "2"
    env["AUTOSCALER_KEEPER_WALLET_BUDGETS"] = json.dumps({"w-spent": 0.0})
    keeper = env["AUTOSCALER_KEEPER_NAME"]
    base = f"http://127.0.0.1:{port}"
    proc = await asyncio.create_subprocess_exec(
        CLI, "keeper", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    user_tokens: list[str] = []
    pems: list[str] = []
    try:
        await _healthy(base, proc)
        async with aiohttp.ClientSession() as session:
            tokens = {}
            for user in ("alice", "bob"):
                status, body = await _call(session, "POST", f"{base}/v1/users/{user}/token", ADMIN)
                assert status == 201 and body["user_id"] == user
                tokens[user] = {"Authorization": f"Bearer {body['token']}"}
                user_tokens.append(body["token"])
            alice, bob = tokens["alice"], tokens["bob"]

            # alice's two clusters, then the third is over her limit: 429, no machine
            for wallet in ("w1", "w2"):
                status, body = await _call(session, "PUT", f"{base}/v1/clusters/alice/{wallet}", alice)
                assert status == 201, body
            status, body = await _call(session, "PUT", f"{base}/v1/clusters/alice/w3", alice)
            assert status == 429 and body["limit"] == "clusters_per_user", body
            assert await _user_ids(raw_ec2, keeper) == [("alice", "w1"), ("alice", "w2")]

            # bob reaches none of alice's routes, and sees none of her clusters or usage
            alice_w1 = f"{base}/v1/clusters/alice/w1"
            for method, url in [
                ("PUT", alice_w1),
                ("GET", alice_w1),
                ("POST", f"{alice_w1}/heartbeat"),
                ("GET", f"{alice_w1}/credentials"),
                ("DELETE", alice_w1),
                ("GET", f"{base}/v1/usage?user_id=alice"),
                ("POST", f"{base}/v1/users/bob/token"),
                ("PUT", f"{base}/v1/wallets/w1/budget"),
            ]:
                status, body = await _call(session, method, url, bob)
                assert status == 403, (method, url, status, body)
            status, body = await _call(session, "GET", f"{base}/v1/clusters", bob)
            assert status == 200 and body == []

            # a wallet whose budget is spent: 402, no machine
            status, body = await _call(session, "PUT", f"{base}/v1/clusters/bob/w-spent", bob)
            assert status == 402 and body["limit"] == "wallet_budget", body
            assert all(user != "bob" for user, _ in await _user_ids(raw_ec2, keeper))

            # alice's TLS files go to her token
            status, body = await _call(session, "GET", f"{alice_w1}/credentials", alice)
            assert status == 200 and set(body["files"]) == {"ca.pem", "client.pem", "client-key.pem"}
            pems = [body["files"]["client-key.pem"], body["files"]["client.pem"]]
            cluster_id = body["cluster_id"]

            # one of alice's ends: her next create passes the limit again
            status, _ = await _call(session, "DELETE", f"{base}/v1/clusters/alice/w2", alice)
            assert status == 202
            status, body = await _call(session, "PUT", f"{base}/v1/clusters/alice/w3", alice)
            assert status == 201, body
            assert ("alice", "w3") in await _user_ids(raw_ec2, keeper)

            # the files are nowhere on the machine's EC2 record: tags or user data
            (primary,) = await _primaries(raw_ec2, cluster_id)
            attribute = await raw_ec2.describe_instance_attribute(
                InstanceId=primary["InstanceId"], Attribute="userData"
            )
            user_data = base64.b64decode(attribute["UserData"].get("Value", "")).decode(errors="replace")
            record = json.dumps(primary["Tags"]) + user_data
            for pem in pems:
                body_lines = [line for line in pem.splitlines() if line and not line.startswith("-----")]
                assert body_lines and not any(line in record for line in body_lines)
            for wallet in ("w1", "w3"):
                await _call(session, "DELETE", f"{base}/v1/clusters/alice/{wallet}", ADMIN)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    logs = out.decode() + err.decode()
    assert proc.returncode == 0, err.decode()
    assert TOKEN not in logs and all(token not in logs for token in user_tokens)
    for pem in pems:
        assert all(line not in logs for line in pem.splitlines() if line and not line.startswith("-----"))
