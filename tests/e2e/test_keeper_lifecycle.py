"""The keeper end to end on its local cloud: a moto server over HTTP, a real redis-server, the keeper
built from settings (`open_keeper`), primaries booted into clusters with real dask schedulers, workers
and each cluster's own autoscaler. No dockerd: each primary's swarm is in memory.

A cluster's life: requested -> `running` -> work submitted to its scheduler -> its workers scale up and
down (launched through the keeper's launch route: the local EC2 refuses RunInstances signed with the
primaries' key, as their IAM policy does) -> heartbeats stop -> primary and workers terminated. And a keeper restarted with stale heartbeats
while a cluster is busy keeps it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.e2e.helpers import wait_for
from tests.e2e.keeper_helpers import (
    heartbeat_tag,
    primaries_of,
    sleep_task,
    tags_of,
    wait_gone,
    wait_state,
    workers_of,
)

from swarm_autoscaler.keeper.adapters.tags import USER_TAG, WALLET_TAG
from swarm_autoscaler_lab.demo.clusters import KeeperApi
from swarm_autoscaler_lab.localcloud.keepercloud import KeeperCloud, KeeperCloudOptions

pytestmark = [pytest.mark.e2e, pytest.mark.no_dockerd, pytest.mark.timeout(240)]

IDLE = 8.0  # seconds


async def test_a_cluster_is_requested_runs_scales_with_its_work_and_ends_once_unused(tmp_path: Path) -> None:
    async with (
        KeeperCloud(KeeperCloudOptions(fast=True, max_workers=3)) as kc,
        kc.keeper(idle_timeout_s=IDLE) as (
            url,
            _,
        ),
    ):
        api = KeeperApi(url, kc.token)
        try:
            await _life_of_one_cluster(kc, api, tmp_path)
        finally:
            await api.close()


async def _life_of_one_cluster(kc: KeeperCloud, api: KeeperApi, tmp_path: Path) -> None:
    from distributed import Client

    path = "/v1/clusters/alice/none"
    status, body = await api.call("PUT", path)
    assert status == 201 and body["state"] == "starting", body
    cid = body["id"]
    (primary,) = primaries_of(kc, cid)
    assert tags_of(primary)[USER_TAG] == "alice" and tags_of(primary)[WALLET_TAG] == "none"

    body = await wait_state(api, path, "running", 60)
    assert body["scheduler_url"] == f"tls://{primary['PrivateIpAddress']}:{kc.scheduler_port}"
    again, same = await api.call("PUT", path)
    assert again == 200 and same["id"] == cid

    peak = 0
    security = await api.security(path, tmp_path / "client")  # the client's TLS files, behind the token
    async with Client(body["scheduler_url"], asynchronous=True, security=security) as client:  # type: ignore[no-untyped-call]
        futures = [client.submit(sleep_task, 2.0, resources={"CPU": 1.0}, pure=False) for _ in range(6)]
        gathered = asyncio.ensure_future(client.gather(futures))
        while not gathered.done():
            peak = max(peak, len(workers_of(kc, cid)))
            status, _ = await api.call("POST", path + "/heartbeat")
            assert status == 204
            await asyncio.sleep(0.5)
        assert await gathered == [2.0] * 6
        del futures, gathered
    # Its own autoscaler scaled its workers up, within the keeper's per-cluster maximum...
    assert 1 <= peak <= 3

    async def scaled_down() -> bool:
        await api.call("POST", path + "/heartbeat")  # still in use: only the autoscaler acts here
        return not workers_of(kc, cid)

    # ...and down again once the work was done, while the cluster itself stayed.
    await wait_for(scaled_down, 60, "the cluster's workers retired and terminated", step=0.5)
    status, body = await api.call("GET", path)
    assert status == 200 and body["state"] == "running"

    # Heartbeats stop: after the idle timeout the keeper ends it, primary first and anything left.
    stopped = time.monotonic()
    await wait_gone(api, path, IDLE + 30)
    unused = time.monotonic() - stopped
    assert unused >= IDLE - 1.0, f"ended {unused:.1f}s after the last heartbeat (idle timeout {IDLE}s)"
    assert primaries_of(kc, cid) == [] and workers_of(kc, cid) == {}
    assert primaries_of(kc, cid, ("terminated", "shutting-down"))
    assert kc.instances() == {}


async def test_a_restarted_keeper_with_stale_heartbeats_keeps_a_cluster_whose_scheduler_has_work(
    tmp_path: Path,
) -> None:
    from distributed import Client

    path = "/v1/clusters/bob/w-1"
    async with KeeperCloud(KeeperCloudOptions(fast=True, max_workers=1)) as kc:
        async with kc.keeper(idle_timeout_s=IDLE) as (url, _):
            api = KeeperApi(url, kc.token)
            try:
                status, body = await api.call("PUT", path)
                cid = body["id"]
                body = await wait_state(api, path, "running", 60)
                security = await api.security(path, tmp_path / "client")
            finally:
                await api.close()
        # The keeper is down. Work arrives directly at the scheduler, and no client heartbeats. No
        # worker comes meanwhile: the keeper launches its clusters' workers (the primaries' role cannot),
        # so the cluster's autoscaler's launches fail, and are tried again, until it is back.
        async with Client(body["scheduler_url"], asynchronous=True, security=security) as client:  # type: ignore[no-untyped-call]
            long_task = client.submit(sleep_task, 3 * IDLE, resources={"CPU": 1.0}, pure=False)
            await asyncio.sleep(IDLE + 1.0)
            stale = time.time() - heartbeat_tag(kc, cid)
            assert stale > IDLE, f"the stored heartbeat is only {stale:.1f}s old"
            assert not workers_of(kc, cid)

            port = int(url.rsplit(":", 1)[1])  # the keeper's public URL: its clusters know it
            async with kc.keeper(idle_timeout_s=IDLE, http_port=port) as (url, restarted):
                api = KeeperApi(url, kc.token)
                try:
                    await wait_for(lambda: restarted.checks >= 3, 30, "the restarted keeper checked it")
                    await wait_for(lambda: bool(workers_of(kc, cid)), 60, "a worker launched by the keeper")
                    # Its scheduler's work counts as use: kept, and the stored heartbeat is fresh again.
                    status, now = await api.call("GET", path)
                    assert status == 200 and now["state"] == "running", now
                    assert primaries_of(kc, cid)
                    await wait_for(
                        lambda: time.time() - heartbeat_tag(kc, cid) < IDLE, 30, "a fresh heartbeat"
                    )
                    assert await long_task == 3 * IDLE
                    status, now = await api.call("GET", path)
                    assert status == 200 and now["state"] == "running", now
                    long_task.release()
                    del long_task
                    await client.close()
                    # Idle at last: it ends after the timeout, as any unused cluster.
                    await wait_gone(api, path, IDLE + 40)
                    assert kc.instances() == {}
                finally:
                    await api.close()
