"""A keeper cluster's TLS files on the local cloud's disk, as dask `Security` objects.

A primary booted by the emulator fetches its files from the keeper with its boot script's one-time token
(`GET /v1/primaries/{cluster_id}/credentials`, as the default boot script's curl does); a test's or the
demo's client fetches the client's with the API token (`GET /v1/clusters/{user}/{wallet}/credentials`).
The files are written 0600 in a folder of the caller's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from distributed.security import Security


def write_files(folder: Path, files: Mapping[str, str]) -> dict[str, str]:
    """`files` (name -> PEM text) written in `folder`, by name -> path."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    out = {}
    for name, text in files.items():
        path = folder / name
        path.write_text(text)
        os.chmod(path, 0o600)
        out[name] = str(path)
    return out


async def fetch(url: str, bearer: str, source: str | None = None) -> dict[str, Any]:
    """GET `url` with `bearer`, from the local address `source` when given (a primary's fetch comes from
    its private IP, as the boot script's `curl --interface`); the JSON body. Raises
    `aiohttp.ClientResponseError` on an error status."""
    headers = {"Authorization": f"Bearer {bearer}"}
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(local_addr=(source, 0)) if source else None
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        session.get(url, headers=headers) as response,
    ):
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
        return body


def primary_security(paths: Mapping[str, str]) -> tuple[Security, Security]:
    """(the scheduler's, the workers' and the cluster autoscaler's) `Security` from a primary's files."""
    ca = paths["ca.pem"]
    scheduler = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=ca, tls_scheduler_cert=paths["scheduler.pem"], tls_scheduler_key=paths["scheduler-key.pem"],
        require_encryption=True,
    )  # fmt: skip
    worker = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=ca, tls_worker_cert=paths["worker.pem"], tls_worker_key=paths["worker-key.pem"],
        require_encryption=True,
    )  # fmt: skip
    return scheduler, worker


def client_security_of(paths: Mapping[str, str]) -> Security:
    """A user's client `Security` from the client's files (`GET .../credentials`)."""
    return Security(  # type: ignore[no-untyped-call]
        tls_ca_file=paths["ca.pem"], tls_client_cert=paths["client.pem"], tls_client_key=paths["client-key.pem"],
        require_encryption=True,
    )  # fmt: skip
