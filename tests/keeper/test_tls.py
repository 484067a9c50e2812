"""Clusters are private: a real dask scheduler with a cluster's credentials (`adapters.tls`) serves a
client holding that cluster's client certificate and refuses one without it (plain tcp, TLS without a
certificate, or another cluster's certificate), before any function is run."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, Scheduler, Worker
from distributed.comm import connect
from distributed.security import Security

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.credentials import Credentials


def _files(tmp: Path, files: dict[str, str]) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, text in files.items():
        (tmp / name).write_text(text)
        out[name] = str(tmp / name)
    return out


def _client_security(tmp: Path, creds: Credentials) -> Security:
    f = _files(tmp, creds.for_client())
    return Security(  # type: ignore[no-untyped-call]
        tls_ca_file=f["ca.pem"], tls_client_cert=f["client.pem"], tls_client_key=f["client-key.pem"],
        require_encryption=True,
    )  # fmt: skip


def _primary_security(tmp: Path, creds: Credentials) -> tuple[Security, Security]:
    f = _files(tmp, creds.for_primary())
    scheduler = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=f["ca.pem"], tls_scheduler_cert=f["scheduler.pem"], tls_scheduler_key=f["scheduler-key.pem"],
        require_encryption=True,
    )  # fmt: skip
    worker = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=f["ca.pem"], tls_worker_cert=f["worker.pem"], tls_worker_key=f["worker-key.pem"],
        require_encryption=True,
    )  # fmt: skip
    return scheduler, worker


async def _refused(address: str, security: Security | None, args: dict[str, Any] | None = None) -> None:
    """The scheduler answers no request from this peer: the handshake or the first read fails."""
    args = security.get_connection_args("client") if security is not None else (args or {})
    with pytest.raises(OSError):  # distributed's CommClosedError and ssl errors are OSErrors
        comm = await connect(address, timeout=3, **args)
        try:
            await comm.write({"op": "identity"})
            await comm.read()
        finally:
            await comm.close()


def test_credentials_round_trip_through_json_and_keep_the_ca_key_to_the_keeper() -> None:
    creds = make_credentials("kc-1")
    assert Credentials.from_json(creds.to_json()) == creds
    handed = {**creds.for_client(), **creds.for_primary()}
    assert creds.ca_key not in handed.values()
    assert all(text.startswith("-----BEGIN") for text in handed.values())


async def test_only_the_cluster_s_credentials_reach_its_scheduler(tmp_path: Path) -> None:
    creds, other = make_credentials("kc-1"), make_credentials("kc-2")
    scheduler_sec, worker_sec = _primary_security(tmp_path / "primary", creds)
    async with Scheduler(
        host="127.0.0.1", port=0, protocol="tls", security=scheduler_sec, dashboard_address=":0"
    ) as s:  # type: ignore[no-untyped-call]
        assert s.address.startswith("tls://")
        async with Worker(s.address, security=worker_sec, nthreads=1):  # type: ignore[no-untyped-call]
            owner = _client_security(tmp_path / "owner", creds)
            async with Client(s.address, security=owner, asynchronous=True) as client:  # type: ignore[no-untyped-call]
                assert await client.submit(sum, [1, 2, 3]) == 6

            # Another cluster's client certificate: its CA did not sign it.
            await _refused(s.address, _client_security(tmp_path / "stranger", other))
            # TLS that trusts the scheduler but presents no certificate.
            ca_only = _files(tmp_path / "ca-only", {"ca.pem": creds.ca_cert})
            context = ssl.create_default_context(cafile=ca_only["ca.pem"])
            context.check_hostname = False
            await _refused(s.address, None, {"ssl_context": context})
            # Plain tcp to the TLS port.
            await _refused(s.address.replace("tls://", "tcp://"), None)
            assert list(s.clients) == ["fire-and-forget"]  # none of the refused ones got in


async def test_the_autoscaler_s_dask_adapter_reads_a_tls_scheduler(tmp_path: Path) -> None:
    creds = make_credentials("kc-1")
    scheduler_sec, _ = _primary_security(tmp_path / "primary", creds)
    f = _files(tmp_path / "autoscaler", creds.for_primary())
    async with Scheduler(
        host="127.0.0.1", port=0, protocol="tls", security=scheduler_sec, dashboard_address=":0"
    ) as s:  # type: ignore[no-untyped-call]
        workload = DaskWorkload(s.address, tls_files=(f["ca.pem"], f["worker.pem"], f["worker-key.pem"]))
        try:
            check = await workload.check_scheduler()
            assert check is not None
        finally:
            await workload.close()
