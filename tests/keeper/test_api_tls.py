"""The keeper's API over TLS (`AUTOSCALER_KEEPER_TLS_CERT_FILE`/`_KEY_FILE`), and the primary's
credentials fetch verifying the keeper (`AUTOSCALER_KEEPER_TLS_CA_FILE`, written into its boot script).

The keeper here is the real API app served by the keeper's own HTTP starter with a certificate for
127.0.0.1 signed by a test CA (standing in for the operator's CA). The fetch is the default boot
script's own lines, cut from the script the keeper renders and run by bash and curl (what a primary's
cloud-init runs, less the rest of the boot)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import re
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.adapters.keeper_listing import KeeperListedCloud
from swarm_autoscaler.config.keeper import load_keeper_settings
from swarm_autoscaler.config.settings import InvalidSettingsError
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.app import user_data_of
from swarm_autoscaler.keeper.credentials import InProcessCredentials, primary_token
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.runtime.http import server_context, start_http
from swarm_autoscaler_lab.localcloud.metadata import MetadataService, hostname_of

TOKEN = "s3cret-token-of-the-keeper"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AMI = "ami-0123456789abcdef0"


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _pki(tmp: Path) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1 it signed: {"ca", "cert", "key"} file paths."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "keeper")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    return {
        "ca": _write(tmp / "ca.pem", ca.public_bytes(pem)),
        "cert": _write(tmp / "cert.pem", cert.public_bytes(pem)),
        "key": _write(
            tmp / "key.pem",
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        ),
    }


@dataclass
class TlsKeeper:
    url: str
    files: dict[str, str]
    keeper: Keeper


@pytest.fixture
async def tls_keeper(tmp_path: Path) -> AsyncIterator[TlsKeeper]:
    files = _pki(tmp_path)
    now = [1_000_000.0]
    keeper = Keeper(
        FakeHosts(), FakeProbe(), SharedLocks(lambda: now[0]).for_replica("a"), KeeperTiming(),
        interval=0.05, clock=lambda: now[0], bind_primaries=True,
    )  # fmt: skip
    app = build_keeper_app(keeper, TOKEN, KeeperMetrics(), credentials=InProcessCredentials(make_credentials))
    runner = await start_http(app, "127.0.0.1", 0, server_context(files["cert"], files["key"]))
    port = runner.addresses[0][1]
    try:
        yield TlsKeeper(f"https://127.0.0.1:{port}", files, keeper)
    finally:
        await runner.cleanup()
        await keeper.stop()


def _settings(tmp: Path, url: str, **extra: str) -> Path:
    env = {
        "AUTOSCALER_KEEPER_TOKEN": TOKEN,
        "AUTOSCALER_KEEPER_NAME": "keeper",
        "AUTOSCALER_KEEPER_PUBLIC_URL": url,
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": AMI,
        "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps({"m5.large": {"ami_id": AMI}}),
        "AUTOSCALER_EC2_REGION": "eu-west-1",
        **extra,
    }
    path = tmp / "keeper.env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    return path


def _fetch_lines(script: str) -> str:
    """The default boot script's credentials fetch: from the CA file it writes to its curl."""
    start = script.index('cat > "$D/keeper-ca.pem"')
    end = script.index('/credentials"\n', start) + len('/credentials"\n')
    return script[start:end]


async def test_the_primary_s_boot_lines_fetch_its_files_over_tls_verifying_the_keeper(
    tls_keeper: TlsKeeper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    files = tls_keeper.files
    settings = _settings(
        tmp_path, tls_keeper.url, AUTOSCALER_KEEPER_TLS_CERT_FILE=files["cert"],
        AUTOSCALER_KEEPER_TLS_KEY_FILE=files["key"], AUTOSCALER_KEEPER_TLS_CA_FILE=files["ca"],
    )  # fmt: skip
    config = load_keeper_settings(settings)
    async with aiohttp.ClientSession() as http:
        made = await http.put(
            f"{tls_keeper.url}/v1/clusters/alice/w1", headers=AUTH, ssl=_trusting(files["ca"])
        )
        cluster = await made.json()
        script = user_data_of(config)(ClusterKey("alice", "w1"), cluster["id"])
        assert (
            "-----BEGIN CERTIFICATE-----" in script and "PRIVATE KEY" not in script
        )  # the CA's certificate only
        token = {"Authorization": f"Bearer {primary_token(TOKEN, cluster['id'])}"}
        url = f"{tls_keeper.url}/v1/primaries/{cluster['id']}/credentials"
        # A fetch that does not trust the keeper's CA stops at the handshake: the one-time token is
        # never sent, so it is not spent.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await http.get(url, headers=token)
        with pytest.raises(aiohttp.ClientError):  # plain HTTP to the TLS port gets nothing
            await http.get(url.replace("https://", "http://"), headers=token)

    boot = tmp_path / "primary"
    boot.mkdir()
    # run as the primary runs it, while this loop serves the keeper; its metadata service gives the
    # private IP its fetch comes from (the fake EC2's primaries are at 127.0.0.1)
    metadata = await MetadataService().start()
    bash = await asyncio.create_subprocess_exec(
        "bash", "-c", f"set -euo pipefail\nD={boot}\n{_fetch_lines(script)}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "AWS_EC2_METADATA_SERVICE_ENDPOINT": metadata.endpoint(hostname_of("127.0.0.1"))},
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(bash.communicate(), 60)
    await metadata.close()
    assert bash.returncode == 0, stderr.decode()
    got = json.loads((boot / "credentials.json").read_text())
    assert {"ca.pem", "scheduler.pem", "scheduler-key.pem"} <= set(got["files"])
    assert re.search(r"curl -fsS \$KEEPER_CA ", script)


def _trusting(ca: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca)


def test_the_tls_settings_are_checked_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    files = _pki(tmp_path)
    cases = {
        "set both or neither": {"AUTOSCALER_KEEPER_TLS_CERT_FILE": files["cert"]},
        "must be https://": {
            "AUTOSCALER_KEEPER_TLS_CERT_FILE": files["cert"], "AUTOSCALER_KEEPER_TLS_KEY_FILE": files["key"],
        },
        "cannot serve with": {
            "AUTOSCALER_KEEPER_TLS_CERT_FILE": files["cert"], "AUTOSCALER_KEEPER_TLS_KEY_FILE": files["ca"],
        },
        "holds no PEM certificate": {"AUTOSCALER_KEEPER_TLS_CA_FILE": files["key"]},
    }  # fmt: skip
    for expected, extra in cases.items():
        with pytest.raises(InvalidSettingsError) as caught:
            load_keeper_settings(_settings(tmp_path, "http://10.0.0.5:8080", **extra))
        assert any(expected in problem for problem in caught.value.problems), caught.value.problems
    plain = load_keeper_settings(
        _settings(tmp_path, "http://10.0.0.5:8080", AUTOSCALER_KEEPER_PLAIN_HTTP="true")
    )  # TLS terminated in front of the keeper, by the operator's explicit choice
    script = user_data_of(plain)(ClusterKey("alice", "w1"), "kc-0123456789abcdef")
    assert "-----BEGIN CERTIFICATE-----" not in _fetch_lines(script)  # no CA named: the AMI's trusted CAs
    with pytest.raises(InvalidSettingsError) as caught:  # http:// without the opt-out: refused
        load_keeper_settings(_settings(tmp_path, "http://10.0.0.5:8080"))
    assert any("PLAIN_HTTP=true" in problem for problem in caught.value.problems)


async def test_the_cluster_s_autoscaler_reads_its_listing_verifying_the_keeper_s_ca(tmp_path: Path) -> None:
    """The primary's autoscaler (`KeeperListedCloud`, as `AUTOSCALER_EC2_LISTING_CA_FILE` configures it)
    reads its listing over https:// with the keeper's CA; without the CA the keeper is not trusted, no
    listing token is sent, and the adapter falls back to EC2 (here unreachable: an EndpointError). The
    listing route is a stand-in serving an empty listing, over the keeper's own HTTP starter and TLS."""
    files = _pki(tmp_path)
    sent: list[str] = []

    async def listing(request: web.Request) -> web.Response:
        sent.append(request.headers.get("Authorization", ""))
        return web.json_response({"listed_at": time.time(), "instances": []})

    app = web.Application()
    app.router.add_get("/v1/primaries/kc-0123456789abcdef/instances", listing)
    runner = await start_http(app, "127.0.0.1", 0, server_context(files["cert"], files["key"]))
    url = f"https://127.0.0.1:{runner.addresses[0][1]}/v1/primaries/kc-0123456789abcdef/instances"
    common: dict[str, Any] = {
        "listing_url": url, "listing_token": "listing-token", "cluster_name": "kc-0123456789abcdef",
        "region": "eu-west-1", "endpoint": "http://127.0.0.1:9", "access_key_id": "k", "secret_access_key": "s",
        "allowed_types": {}, "subnet_ids": ["subnet-1"], "security_group_ids": ["sg-1"],
        "join_command": lambda: None, "retry_attempts": 1,
    }  # fmt: skip
    try:
        async with KeeperListedCloud(listing_ca_file=files["ca"], **common) as trusting:
            assert await trusting.list_instances() == () and trusting.listings == 1
        assert sent == ["Bearer listing-token"]
        async with KeeperListedCloud(**common) as untrusting:
            with pytest.raises(EndpointError):
                await untrusting.list_instances()
            assert untrusting.lost is not None and "certificate" in untrusting.lost.lower()
        assert sent == ["Bearer listing-token"]  # the untrusted keeper never saw the token
    finally:
        await runner.cleanup()
