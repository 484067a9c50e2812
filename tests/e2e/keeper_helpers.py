"""Helpers for the keeper's end-to-end tests: direct looks at moto and redis (never through the keeper),
a keeper replica as a real `swarm-autoscaler keeper` process, and a dask client's work."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from tests.e2e.helpers import wait_for

from swarm_autoscaler.adapters.ec2 import owner_tags
from swarm_autoscaler.keeper.adapters.redis_leases import KEY_PREFIX
from swarm_autoscaler.keeper.adapters.tags import CLUSTER_ID_TAG, HEARTBEAT_TAG
from swarm_autoscaler_lab.demo.clusters import KeeperApi
from swarm_autoscaler_lab.localcloud.keepercloud import KeeperCloud
from swarm_autoscaler_lab.localcloud.redis_server import free_port

CLI = Path(sys.executable).with_name("swarm-autoscaler")


def tags_of(inst: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def primaries_of(
    kc: KeeperCloud, cluster_id: str, states: tuple[str, ...] = ("pending", "running")
) -> list[Any]:
    """The cluster's primary instances in these states, straight from moto."""
    return [i for i in kc.instances(states).values() if tags_of(i).get(CLUSTER_ID_TAG) == cluster_id]


def workers_of(kc: KeeperCloud, cluster_id: str) -> dict[str, dict[str, Any]]:
    """The cluster's live worker instances (tagged by its own autoscaler), straight from moto."""
    owned = owner_tags(cluster_id).items()
    return {iid: i for iid, i in kc.instances().items() if owned <= tags_of(i).items()}


def heartbeat_tag(kc: KeeperCloud, cluster_id: str) -> float:
    (primary,) = primaries_of(kc, cluster_id)
    return float(tags_of(primary)[HEARTBEAT_TAG])


async def lease_holder(kc: KeeperCloud, cluster_id: str) -> str | None:
    """The token of the replica holding the cluster's lease in redis (None: nobody)."""
    from redis.asyncio import Redis

    assert kc.redis is not None
    client = Redis.from_url(kc.redis.url)
    try:
        value = await client.get(f"{KEY_PREFIX}{kc.keeper_name}:cluster:{cluster_id}")
    finally:
        await client.aclose()
    return None if value is None else value.decode()


async def wait_state(api: KeeperApi, path: str, state: str, within: float) -> dict[str, Any]:
    body: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal body
        status, got = await api.call("GET", path)
        body = got if status == 200 else {}
        return body.get("state") == state

    await wait_for(reached, within, f"{path} {state}", step=0.5)
    return body


async def wait_gone(api: KeeperApi, path: str, within: float) -> float:
    """Seconds until GET answers 404 (the cluster's primary is terminated)."""

    async def gone() -> bool:
        status, _ = await api.call("GET", path)
        return status == 404

    return await wait_for(gone, within, f"{path} gone (404)", step=0.5)


def sleep_task(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def tail(log: Path, chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-chars:]


@contextlib.asynccontextmanager
async def keeper_process(
    kc: KeeperCloud, idle_timeout_s: float, log: Path, extra: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[str, int]]:
    """`swarm-autoscaler keeper` as a real process on this cloud (`extra`: settings over the cloud's);
    yields its API's URL and its pid once /healthz answers. Killed (by its pid) on exit if still running."""
    port = free_port()
    env_file = kc.write_env(
        f"keeper-process-{port}.env",
        {**kc.keeper_env(idle_timeout_s=idle_timeout_s, http_port=port), **(extra or {})},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            str(CLI), "keeper", "--env-file", str(env_file), env=env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        api = KeeperApi(url, kc.token)
        try:

            async def healthy() -> bool:
                if proc.returncode is not None:
                    raise AssertionError(f"keeper exited {proc.returncode}: {tail(log)}")
                with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError):
                    status, _ = await api.call("GET", "/healthz")
                    return status == 200
                return False

            await wait_for(healthy, 60, "the keeper process answers /healthz", step=0.3)
        finally:
            await api.close()
        yield url, proc.pid
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
