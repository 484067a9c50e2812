"""End to end on the local cloud with real dockerd swarm nodes: the warm pool.

One daemon with a pool of two stopped m5.large: the pool fills (machines boot into it and stop
themselves, never joining); a burst starts the pool machines first (they join the real swarm and run
the work) and launches the rest; scale-down stops the surplus back into the pool (their nodes removed,
none left down) and terminates what the pool cannot hold; a pool machine lost outside the daemon is
replaced by a launch into the pool; an owned stopped machine outside the pool is terminated. Every machine
boots as EC2 boots it (the `real_boot` fixture): its own user data (the pool's MIME multipart, whose first
boot ends with `shutdown`) on its own dockerd node, and its dask worker is the worker service's task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from distributed import Client
from tests.e2e.helpers import REAL_BOOT, ec2_client, hostname_of, owned_instances, start, wait_for

from swarm_autoscaler.core.actions import Launch, Start, Stop, Terminate
from swarm_autoscaler.core.model import GIB, NodeStatus
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud

pytestmark = [*REAL_BOOT, pytest.mark.timeout(600)]

BOOT_S = 180.0  # a new machine loads the worker image into its dockerd node before its user data runs

POOL = 2


def _stopped(lc: LocalCloud) -> dict[str, dict[str, Any]]:
    return owned_instances(lc, ("stopped",))


def _pool_env(lc: LocalCloud) -> dict[str, str]:
    assert lc.network is not None
    ami = lc.network.ami_id
    types = {"m5.large": {"ami_id": ami, "warm_pool": POOL}, "m5.xlarge": {"ami_id": ami}}
    # At most 3 machines: the burst's two starts and one launch take the whole budget, so the pool is not
    # refilled by launches while the burst runs, and scale-down must stop the burst's machines back into it.
    return {"AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types), "AUTOSCALER_EC2_MAX_INSTANCES": "3"}


def _stray(lc: LocalCloud) -> str:
    """An m5.xlarge carrying our ownership tags, stopped behind the daemon's back (no pool for its type)."""
    assert lc.network is not None
    ec2 = ec2_client(lc)
    tags = [{"Key": k, "Value": v} for k, v in lc.owner_tags().items()]
    reply = ec2.run_instances(
        ImageId=lc.network.ami_id,
        InstanceType="m5.xlarge",
        MinCount=1,
        MaxCount=1,
        SubnetId=lc.network.subnet_ids[0],
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        UserData="#!/bin/bash\nshutdown -h now\n",  # the emulator stops it at boot: it never joins
    )
    return str(reply["Instances"][0]["InstanceId"])


async def test_warm_pool_fills_serves_a_burst_refills_and_ends_strays(cloud: LocalCloud) -> None:
    lc = cloud
    assert lc.emulator is not None and lc.orchestrator is not None
    emulator, orchestrator = lc.emulator, lc.orchestrator
    prepared_before, joined_before = emulator.prepared_total, emulator.joined_total
    try:
        async with lc.daemon(_pool_env(lc)) as daemon:
            running = await start(daemon)
            try:
                # 1. the pool fills: two machines boot, stop themselves, and never join
                await wait_for(
                    lambda: len(_stopped(lc)) == POOL and emulator.prepared_total - prepared_before == POOL,
                    BOOT_S,
                    f"{POOL} pool machines prepared and stopped",
                )
                pool = set(_stopped(lc))
                assert emulator.joined_total == joined_before
                hosts = {hostname_of(i) for i in _stopped(lc).values()}
                assert not hosts & {n.hostname for n in await orchestrator.list_nodes()}

                # 2. a burst of three 2-CPU tasks: the two pool machines are started, one more launched
                async with Client(lc.scheduler_address, asynchronous=True) as client:
                    futures = [
                        client.submit(
                            time.sleep,
                            3.0,
                            key=f"pool-burst-{i}",
                            resources={"CPU": 2, "RAM": GIB},
                            pure=False,
                        )
                        for i in range(3)
                    ]
                    await asyncio.wait_for(client.gather(futures), BOOT_S + 60)
                    assert all(f.status == "finished" for f in futures)
                rec = running.record
                started = {iid for a in rec.of(Start) for iid in a.instance_ids}
                assert started == pool, (started, pool)
                work_launches = [a for a in rec.of(Launch) if not a.pool]
                assert sum(a.count for a in work_launches) >= 1
                first_start = min(t for t, a in rec.actions if isinstance(a, Start))
                assert all(t >= first_start for t, a in rec.actions if isinstance(a, Launch) and not a.pool)

                # 3. scale-down stops the surplus back into the pool and terminates the rest; no down
                #    node of a stopped machine is left in the swarm
                def drained_ended() -> bool:  # (the tick that terminated records it once it finished)
                    return any("beyond the reserve" in a.reason for a in rec.of(Terminate))

                await wait_for(
                    lambda: len(_stopped(lc)) == POOL and not owned_instances(lc) and drained_ended(),
                    90,
                    "surplus stopped into the pool, the rest terminated",
                )
                stops = rec.of(Stop)
                assert stops and all(a.node_ids for a in stops), stops
                assert all("stopped into the warm pool" in a.reason for a in stops)
                stopped_hosts = {hostname_of(i) for i in _stopped(lc).values()}

                async def no_down_node() -> bool:
                    nodes = await orchestrator.list_nodes()
                    return not any(
                        n.hostname in stopped_hosts and n.status != NodeStatus.READY for n in nodes
                    )

                await wait_for(no_down_node, 30, "no down node left by a stopped pool machine")

                # 4. a pool machine lost behind the daemon's back is replaced by a launch into the pool
                lost = sorted(_stopped(lc))[0]
                ec2_client(lc).terminate_instances(InstanceIds=[lost])
                await wait_for(
                    lambda: any(a.pool for a in rec.of(Launch)) and len(_stopped(lc)) == POOL,
                    BOOT_S,
                    "the pool refilled by a launch",
                )

                # 5. an owned stopped machine of a type without a pool is terminated, with its reason
                stray = _stray(lc)
                await wait_for(
                    lambda: any(stray in a.instance_ids for a in rec.of(Terminate)),
                    BOOT_S,
                    "the stray terminated",
                )
                [ended] = [a for a in rec.of(Terminate) if stray in a.instance_ids]
                assert ended.reason.startswith("stopped outside the warm pool"), ended.reason
                assert not [a for a in rec.of(Terminate) if set(a.instance_ids) & set(_stopped(lc))]
            finally:
                await running.halt()
    finally:
        # leave the session's cloud as the other tests expect it: no owned instance left at all
        left = list(_stopped(lc)) + list(owned_instances(lc))
        if left:
            with contextlib.suppress(Exception):
                ec2_client(lc).terminate_instances(InstanceIds=left)
        await wait_for(lambda: not _stopped(lc) and not owned_instances(lc), 30, "the pool emptied")
