"""Keeper replicas sharing clusters on the local cloud (moto over HTTP, a real redis-server, primaries
booted with real dask schedulers): concurrent get-or-create through two replicas creates one cluster,
and a replica killed with SIGKILL hands the cluster it held over to another within the lock's TTL."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from tests.e2e.helpers import ALL_STATES, wait_for
from tests.e2e.keeper_helpers import (
    keeper_process,
    lease_holder,
    primaries_of,
    tags_of,
    tail,
    wait_gone,
    wait_state,
)

from swarm_autoscaler.keeper.adapters.redis_leases import RedisLocks
from swarm_autoscaler_lab.demo.clusters import KeeperApi
from swarm_autoscaler_lab.localcloud.keepercloud import KeeperCloud, KeeperCloudOptions

pytestmark = [pytest.mark.e2e, pytest.mark.no_dockerd, pytest.mark.timeout(240)]

IDLE = 60.0  # long: these tests end their clusters on request
CHECK = 1.0  # the keeper cloud's fast AUTOSCALER_KEEPER_CHECK_INTERVAL
# The hand-over test's lease TTL: longer than the fast cloud's 3 s, which lapsed in a loaded fresh-clone
# run (the fast lane runs chaos tests beside it) while A was the only replica, before B even started.
LOCK_TTL = 6.0
LEASE = {"AUTOSCALER_KEEPER_LOCK_TTL": f"{LOCK_TTL:g}s"}


async def test_twenty_concurrent_get_or_create_calls_through_two_replicas_create_one_cluster() -> None:
    path = "/v1/clusters/carol/w-7"
    async with (
        KeeperCloud(KeeperCloudOptions(fast=True)) as kc,
        kc.keeper(idle_timeout_s=IDLE) as (url_a, replica_a),
        kc.keeper(idle_timeout_s=IDLE) as (url_b, replica_b),
    ):
        a, b = KeeperApi(url_a, kc.token), KeeperApi(url_b, kc.token)
        try:
            replies = await asyncio.gather(*(api.call("PUT", path) for api in [a, b] * 10))
            statuses = sorted(status for status, _ in replies)
            assert statuses == [200] * 19 + [201], replies
            (cid,) = {body["id"] for _, body in replies}
            assert len(primaries_of(kc, cid)) == 1
            every = kc.instances()
            assert len(every) == 1, every  # one primary in all of EC2: nothing else was launched
            status, _ = await b.call("DELETE", path)
            assert status == 202
            try:
                await wait_gone(a, path, 30)
            except BaseException:
                print(
                    "replica a knows",
                    replica_a.clusters,
                    "tasks",
                    list(replica_a._tasks),
                    "checks",
                    replica_a.checks,
                )
                print(
                    "replica b knows",
                    replica_b.clusters,
                    "tasks",
                    list(replica_b._tasks),
                    "checks",
                    replica_b.checks,
                )
                print(
                    "lease",
                    await lease_holder(kc, cid),
                    "a",
                    getattr(replica_a.locks, "token", "?"),
                    "b",
                    getattr(replica_b.locks, "token", "?"),
                )
                print("primary tags", [tags_of(p) for p in primaries_of(kc, cid, ALL_STATES)])
                raise
            assert kc.instances() == {}
        finally:
            await a.close()
            await b.close()


async def test_a_replica_killed_with_sigkill_hands_its_cluster_over_within_the_lock_ttl(
    tmp_path: Path,
) -> None:
    path = "/v1/clusters/dave/none"
    async with KeeperCloud(KeeperCloudOptions(fast=True)) as kc:
        kc.boot_keeper_primaries()
        log = tmp_path / "keeper-a.log"
        async with keeper_process(kc, IDLE, log, LEASE) as (url_a, pid_a):
            a = KeeperApi(url_a, kc.token)
            try:
                status, body = await a.call("PUT", path)
                assert status == 201, body
                cid = body["id"]
                await wait_state(a, path, "running", 60)
            finally:
                await a.close()

            async def someone_holds() -> bool:  # A, the only replica (its first check may be pending)
                return await lease_holder(kc, cid) is not None

            await wait_for(someone_holds, 2 * LOCK_TTL, "A holds the cluster's lease")
            held_by_a = await lease_holder(kc, cid)
            assert held_by_a is not None
            async with kc.keeper(idle_timeout_s=IDLE, extra=LEASE) as (url_b, replica_b):
                assert isinstance(replica_b.locks, RedisLocks)
                token_b = replica_b.locks.token
                # B knows the cluster and checks it in its own task, but A holds it: B does nothing.
                await wait_for(
                    lambda: cid in {c.cluster_id for c in replica_b.clusters}, 30, "B discovered it"
                )
                await asyncio.sleep(2 * CHECK)
                assert await lease_holder(kc, cid) == held_by_a != token_b

                os.kill(pid_a, signal.SIGKILL)
                killed = time.monotonic()

                async def b_holds() -> bool:
                    return await lease_holder(kc, cid) == token_b

                await wait_for(b_holds, 30, "B took the cluster over", step=0.1)
                takeover = time.monotonic() - killed
                print(f"takeover after SIGKILL: {takeover:.2f}s (lock TTL {LOCK_TTL}s, check every {CHECK}s)")
                # The lease expires within its TTL of the last refresh; B claims it at its next check of the cluster.
                assert takeover <= LOCK_TTL + CHECK + 2.0, tail(log)

                # B now handles it: it answers for it, and ends it on request.
                b = KeeperApi(url_b, kc.token)
                try:
                    status, body = await b.call("GET", path)
                    assert status == 200 and body["state"] == "running" and body["id"] == cid
                    status, _ = await b.call("DELETE", path)
                    assert status == 202
                    await wait_gone(b, path, 30)
                    assert kc.instances() == {}
                finally:
                    await b.close()
