"""The keeper's API is HTTPS by default: with no certificate from the operator, the keeper makes a CA and
a server certificate for the host of AUTOSCALER_KEEPER_PUBLIC_URL, keeps them sealed in redis, and puts
the CA's certificate into each primary's user data, whose fetch verifies the keeper with it.

Real pieces: two keeper replicas built from settings by `open_keeper` (as `swarm-autoscaler keeper`
builds them) in this process, on one real redis-server and one moto server over HTTP (moto stands in
for EC2: the primary's user data is read back from it, as a primary's cloud-init gets it); the clients
are aiohttp and, for the primary's fetch, the default boot script's own lines run by bash and curl."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiobotocore.session import get_session
from cryptography import x509
from structlog.testing import capture_logs
from tests.keeper.test_api_tls import _fetch_lines
from tests.keeper.test_keeper_process import free_port

from swarm_autoscaler.config.keeper import KeeperConfig, load_keeper_settings
from swarm_autoscaler.config.settings import InvalidSettingsError
from swarm_autoscaler.keeper.adapters.api_tls import RedisApiPki, make_api_pki
from swarm_autoscaler.keeper.adapters.sealing import Sealer, key_from_text
from swarm_autoscaler.keeper.app import open_keeper, user_data_of
from swarm_autoscaler.keeper.credentials import primary_token
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
from swarm_autoscaler_lab.localcloud.metadata import MetadataService, hostname_of
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = pytest.mark.timeout(180)

TOKEN = "tls-by-default-keeper-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRETS_KEY = base64.b64encode(b"k" * 32).decode()
ALICE = ClusterKey("alice", "w1")


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer(seed=11) as server:
        yield server


@pytest.fixture(scope="module")
def network(moto: MotoServer) -> LocalNetwork:
    return provision_network(moto.endpoint, prefix=claim_loopback_prefix())


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="tls-Redis-pw") as server:
        yield server


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)


def _config(
    tmp: Path, moto: MotoServer, network: LocalNetwork, redis: RedisServer | None, **extra: str
) -> KeeperConfig:
    """A keeper's settings with no TLS setting at all (the default), listening on a port of its own."""
    port = extra.pop("port", str(free_port()))
    env = {
        "AUTOSCALER_KEEPER_TOKEN": TOKEN,
        "AUTOSCALER_KEEPER_NAME": extra.pop("name", "tls-default"),
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": network.ami_id,
        "AUTOSCALER_KEEPER_PRIMARY_PRICE_PER_HOUR": "0.1",
        "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps({"t3.micro": {"ami_id": network.ami_id, "price_per_hour": 0.01}}),
        "AUTOSCALER_KEEPER_HTTP_PORT": port,
        # not dask's 8786/8787 (see test_keeper_process.keeper_env): nothing but this test answers the probe
        "AUTOSCALER_KEEPER_SCHEDULER_PORT": str(free_port()),
        "AUTOSCALER_KEEPER_DASHBOARD_PORT": str(free_port()),
        "AUTOSCALER_KEEPER_SECRETS_KEY": SECRETS_KEY,
        "AUTOSCALER_HTTP_HOST": "127.0.0.1",
        "AUTOSCALER_EC2_ENDPOINT": moto.endpoint,
        "AUTOSCALER_EC2_REGION": network.region,
        "AUTOSCALER_EC2_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
        "AUTOSCALER_EC2_SUBNET_IDS": ",".join(network.subnet_ids),
        "AUTOSCALER_EC2_SECURITY_GROUP_IDS": network.security_group_id,
        **({"AUTOSCALER_REDIS_URL": redis.url} if redis is not None else {}),
        **extra,
    }  # fmt: skip
    path = tmp / f"keeper-{port}.env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    return load_keeper_settings(path)


async def _served_pem(port: int) -> str:
    """The certificate the port serves, as it comes (no verification: that is what is compared); in a
    thread, while this loop serves the keeper."""
    return await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port), timeout=10)


async def _user_data(moto: MotoServer, network: LocalNetwork, cluster_id: str) -> str:
    """The primary's user data as EC2 hands it to the machine."""
    async with get_session().create_client(
        "ec2", region_name=network.region, endpoint_url=moto.endpoint,
        aws_access_key_id=LOCAL_ACCESS_KEY, aws_secret_access_key=LOCAL_SECRET_KEY,
    ) as ec2:  # fmt: skip
        found = await ec2.describe_instances(
            Filters=[{"Name": "tag:swarm-autoscaler/keeper/cluster-id", "Values": [cluster_id]}]
        )
        (raw,) = [i for r in found["Reservations"] for i in r["Instances"]]
        attr = await ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


async def _private_ip(moto: MotoServer, network: LocalNetwork, cluster_id: str) -> str:
    """The primary's PrivateIpAddress, as EC2 lists it."""
    async with get_session().create_client(
        "ec2", region_name=network.region, endpoint_url=moto.endpoint,
        aws_access_key_id=LOCAL_ACCESS_KEY, aws_secret_access_key=LOCAL_SECRET_KEY,
    ) as ec2:  # fmt: skip
        found = await ec2.describe_instances(
            Filters=[{"Name": "tag:swarm-autoscaler/keeper/cluster-id", "Values": [cluster_id]}]
        )
    (raw,) = [i for r in found["Reservations"] for i in r["Instances"]]
    return str(raw["PrivateIpAddress"])


def _ca_of(script: str) -> str:
    start = script.index("<<'KEEPER_CA'\n") + len("<<'KEEPER_CA'\n")
    return script[start : script.index("\nKEEPER_CA\n", start)]


async def _redis_values(redis: RedisServer) -> list[bytes]:
    import redis.asyncio as aioredis

    client: Any = aioredis.from_url(redis.url)
    try:
        return [await client.get(k) for k in await client.keys("*api-tls")]
    finally:
        await client.aclose()


async def _ca(config: KeeperConfig, redis: RedisServer) -> str:
    """The keeper's CA certificate, read from its store as an operator would (same name, same key)."""
    store = RedisApiPki(redis.url, config.keeper.name, sealer=Sealer(key_from_text(SECRETS_KEY)))
    try:
        return (await store.get_or_make(())).ca_pem
    finally:
        await store.close()


async def test_the_default_start_serves_https_two_replicas_share_it_and_a_restart_keeps_it(
    clean_env: None, tmp_path: Path, moto: MotoServer, network: LocalNetwork, redis_server: RedisServer
) -> None:
    name = f"tls-{uuid.uuid4().hex[:8]}"
    port_a, port_b = free_port(), free_port()
    public = f"https://127.0.0.1:{port_a}"  # what the primaries use (the service's address on AWS)
    config_a, config_b = (
        _config(tmp_path, moto, network, redis_server, name=name, port=str(port), AUTOSCALER_KEEPER_PUBLIC_URL=public)
        for port in (port_a, port_b)
    )  # fmt: skip
    with capture_logs() as logs:
        async with open_keeper(config_a), open_keeper(config_b):
            served = await _served_pem(port_a)
            assert await _served_pem(port_b) == served, (
                "two replicas on one redis serve different certificates"
            )
            async with aiohttp.ClientSession() as http:
                # A client that does not trust the keeper's CA (the system's CAs only) stops at the
                # handshake: the admin token in its header is never sent.
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await http.get(f"{public}/v1/clusters", headers=AUTH)
                with pytest.raises(aiohttp.ClientError):  # plain HTTP to the port gets nothing
                    await http.get(f"http://127.0.0.1:{port_a}/healthz")
                trusting = ssl.create_default_context(cadata=await _ca(config_a, redis_server))
                async with http.get(f"{public}/v1/clusters", headers=AUTH, ssl=trusting) as listed:
                    assert listed.status == 200
    said = [e for e in logs if e["event"] == "the keeper's API serves HTTPS"]
    assert len(said) == 2 and "CA sha256" in said[0]["tls"] and "kept in redis" in said[0]["tls"]
    assert not [e for e in logs if "PLAIN HTTP" in e["event"]]

    async with open_keeper(config_a):  # restarted: the same certificate, so the primaries still trust it
        assert await _served_pem(port_a) == served
    stored = await _redis_values(redis_server)
    assert len(stored) == 1 and b"PRIVATE KEY" not in stored[0]  # sealed at rest, like the clusters' keys


async def test_the_primary_s_user_data_carries_the_ca_and_its_fetch_verifies_the_keeper_with_it(
    clean_env: None, tmp_path: Path, moto: MotoServer, network: LocalNetwork, redis_server: RedisServer
) -> None:
    port = free_port()
    public = f"https://127.0.0.1:{port}"
    config = _config(tmp_path, moto, network, redis_server, name=f"tls-{uuid.uuid4().hex[:8]}",
                     port=str(port), AUTOSCALER_KEEPER_PUBLIC_URL=public)  # fmt: skip
    # AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS at its default (on): the fetches below come from 127.0.0.1
    async with open_keeper(config):
        ca = await _ca(config, redis_server)
        async with aiohttp.ClientSession() as http:
            made = await http.put(
                f"{public}/v1/clusters/alice/w1", headers=AUTH, ssl=ssl.create_default_context(cadata=ca)
            )
            assert made.status == 201, await made.text()
            cluster_id = (await made.json())["id"]
            script = await _user_data(moto, network, cluster_id)
            assert _ca_of(script).strip() == ca.strip() and "PRIVATE KEY" not in script
            # The one-time token offered to a keeper the client does not trust: never sent, so not spent.
            token = {"Authorization": f"Bearer {primary_token(TOKEN, cluster_id)}"}
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.get(f"{public}/v1/primaries/{cluster_id}/credentials", headers=token)
        boot = tmp_path / "primary"
        boot.mkdir()
        # the boot script's own fetch lines, as the primary's cloud-init runs them, while this loop serves;
        # its metadata service gives the private IP (a loopback VPC's) its fetch comes from
        metadata = await MetadataService().start()
        where = metadata.endpoint(hostname_of(await _private_ip(moto, network, cluster_id)))
        bash = await asyncio.create_subprocess_exec(
            "bash", "-c", f"set -euo pipefail\nD={boot}\n{_fetch_lines(script)}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "AWS_EC2_METADATA_SERVICE_ENDPOINT": where},
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(bash.communicate(), 60)
        await metadata.close()
        assert bash.returncode == 0, stderr.decode()
        got = json.loads((boot / "credentials.json").read_text())
        assert {"ca.pem", "scheduler.pem", "scheduler-key.pem"} <= set(got["files"])


async def test_plain_http_only_by_the_explicit_opt_out_and_then_loudly(
    clean_env: None, tmp_path: Path, moto: MotoServer, network: LocalNetwork
) -> None:
    with pytest.raises(InvalidSettingsError) as refused:
        _config(tmp_path, moto, network, None, AUTOSCALER_KEEPER_PUBLIC_URL="http://10.0.0.5:8080")
    assert any("must be https://" in p and "PLAIN_HTTP=true" in p for p in refused.value.problems)
    port = free_port()
    plain = _config(tmp_path, moto, network, None, port=str(port), name=f"tls-{uuid.uuid4().hex[:8]}",
                    AUTOSCALER_KEEPER_PUBLIC_URL=f"http://127.0.0.1:{port}", AUTOSCALER_KEEPER_PLAIN_HTTP="true")  # fmt: skip
    with capture_logs() as logs:
        async with (
            open_keeper(plain),
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as answered,
        ):
            assert answered.status in (200, 503)  # served in the clear, as asked
    (warned,) = [e for e in logs if "PLAIN HTTP" in e["event"]]
    assert warned["log_level"] == "warning"
    # the one-time tokens are bound by default, and a proxy that terminates TLS hides the primaries' IPs
    assert "AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS=false" in warned["primary_tokens"]


async def test_a_changed_public_url_gets_a_new_certificate_from_the_same_ca(
    clean_env: None, redis_server: RedisServer
) -> None:
    """The primaries trust the CA, not the certificate: a keeper moved to another address re-issues its
    server certificate from the stored CA, so the running primaries keep trusting it."""
    store = RedisApiPki(redis_server.url, f"tls-{uuid.uuid4().hex[:8]}")
    try:
        first = await store.get_or_make(("10.0.0.5", "localhost"))
        again = await store.get_or_make(("10.0.0.5",))
        moved = await store.get_or_make(("keeper.example.internal", "localhost"))
    finally:
        await store.close()
    assert again == first
    assert moved.ca_pem == first.ca_pem and moved.cert_pem != first.cert_pem
    assert {"keeper.example.internal", "10.0.0.5"} <= set(moved.hosts)
    context = ssl.create_default_context(cadata=first.ca_pem)  # verifies the new one with the old CA
    leaf = x509.load_pem_x509_certificate(moved.cert_pem.encode())
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(first.ca_pem.encode()))
    assert context.cert_store_stats()["x509_ca"] == 1


def test_the_operator_s_ca_file_wins_over_the_keeper_s_own_ca_in_the_user_data(
    clean_env: None, tmp_path: Path, moto: MotoServer, network: LocalNetwork
) -> None:
    """A TLS proxy in front of the keeper with a CA of its own: the primaries must trust that CA, not the
    one the keeper made for its own certificate (which they never see)."""
    proxy_ca = make_api_pki("proxy", ("keeper.example.internal",)).ca_pem
    ca_file = tmp_path / "proxy-ca.pem"
    ca_file.write_text(proxy_ca)
    own = make_api_pki("k", ("10.0.0.5",)).ca_pem
    base = {"AUTOSCALER_KEEPER_PUBLIC_URL": "https://keeper.example.internal:443"}
    named = _config(tmp_path, moto, network, None, AUTOSCALER_KEEPER_TLS_CA_FILE=str(ca_file), **base)
    plain = _config(tmp_path, moto, network, None, **base)
    script = user_data_of(named, own)(ALICE, "kc-0123456789abcdef")
    assert _ca_of(script).strip() == proxy_ca.strip()
    assert _ca_of(user_data_of(plain, own)(ALICE, "kc-0123456789abcdef")).strip() == own.strip()
