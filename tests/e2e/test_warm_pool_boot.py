"""The warm pool on the real boot path: a pool machine boots from its own user data on its own dockerd
node, prepares and stops itself; when work comes the daemon starts it, its rewritten user data joins the
swarm, and the dask worker that runs the work is the task swarm starts from the worker global service;
scale-down stops it back into the pool.

Phases (each one's duration is printed): the image, the worker service deployed, the pool filled (the
machine ran its first boot's user data: the type's worker env file written on its node, then `shutdown -h
now`, which stops the instance as InstanceInitiatedShutdownBehavior=stop would; it never joined), the start
(StartInstances, the user data the daemon rewrote before it run again on the same node: `docker swarm
join`), the task run on the swarm-started worker of that machine, and the stop back into the pool.

What stands in for AWS: as in `test_worker_service.py`. The machine's node folder (its `/etc/swarm-
autoscaler` and dockerd data) survives the stop, as an EBS root volume does; the user data's `shutdown`
is recorded by a shim and the instance stopped through EC2. The warm pool's bookkeeping in every detail
(strays, refills, the maximum) is `test_warm_pool.py`'s subject, on the emulator's shortcut.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any

import pytest
from distributed import Client
from tests.e2e.helpers import (
    WORKER_SERVICE,
    booting_from_user_data,
    ec2_client,
    hostname_of,
    owned_instances,
    phase,
    short_names,
    start,
    wait_for,
)

from swarm_autoscaler.core.actions import Launch, Start, Stop
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud
from swarm_autoscaler_lab.localcloud.redis_server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.timeout(900)]


def _stopped(lc: LocalCloud) -> dict[str, dict[str, Any]]:
    return owned_instances(lc, ("stopped",))


def _pool_env(lc: LocalCloud, tickets: bool) -> dict[str, str]:
    assert lc.network is not None
    # One m5.large in the pool and at most one machine: the work can only be served by starting it.
    types = {"m5.large": {"ami_id": lc.network.ami_id, "warm_pool": 1}}
    # With tickets: the start's rewritten user data fetches the join token with a fresh join ticket from
    # the daemon's join endpoint, from the machine's private IP (adapters.join_tickets).
    return {
        "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types),
        "AUTOSCALER_EC2_MAX_INSTANCES": "1",
        **(lc.join_ticket_env(free_port()) if tickets else {}),
    }


@pytest.mark.parametrize("tickets", [False, True], ids=["join-token", "join-ticket"])
async def test_a_pool_machine_boots_from_its_user_data_starts_into_the_worker_service_and_stops_back(
    cloud: LocalCloud, tickets: bool
) -> None:
    lc = cloud
    assert lc.emulator is not None and lc.scheduler is not None and lc.orchestrator is not None
    emulator, scheduler, orchestrator = lc.emulator, lc.scheduler, lc.orchestrator
    manager = lc.local_swarm.manager
    phases: dict[str, float] = {}
    t = time.monotonic()
    prepared_before, joined_before = emulator.prepared_total, emulator.joined_total
    try:
        async with booting_from_user_data(lc):  # the image loaded, the worker service deployed
            t = phase("image and worker service", t, phases)
            async with lc.daemon(_pool_env(lc, tickets)) as daemon:
                running = await start(daemon)
                try:
                    # 1. the pool fills: the machine runs its first boot's user data on its own node and stops
                    await wait_for(
                        lambda: len(_stopped(lc)) == 1 and emulator.prepared_total > prepared_before,
                        300,
                        "the pool machine prepared from its user data and stopped",
                    )
                    [(pool_id, pool_inst)] = _stopped(lc).items()
                    host = hostname_of(pool_inst)
                    node = lc.local_swarm.nodes[
                        emulator.os_hostnames[pool_id]
                    ]  # its dockerd node, never joined
                    worker_env = (node.etc / "worker.env").read_text()
                    assert "m5.large" in worker_env, worker_env  # written by its boot script, on its node
                    assert host not in {n.hostname for n in await orchestrator.list_nodes()}
                    assert emulator.joined_total == joined_before
                    t = phase("pool filled (first boot from user data, shutdown, stopped)", t, phases)

                    # 2. work: the pool machine is started (the maximum allows no launch), joins, and swarm
                    #    starts the worker service's task there, which runs the work
                    async with Client(lc.scheduler_address, asynchronous=True) as client:
                        future = client.submit(
                            time.sleep,  # the worker image can import it (not this test module)
                            1.0,
                            key="pool-boot",
                            pure=False,
                            resources={"CPU": 2, "RAM": GIB, "instance-type:m5.large": 1},
                        )
                        await wait_for(lambda: bool(scheduler.workers), 300, "the started machine's worker")
                        t = phase("start (user data rewritten and run again: join, worker task)", t, phases)
                        await asyncio.wait_for(future, 300)
                        ran_on = await client.who_has([future])
                        names = short_names(
                            scheduler.workers[a].name for addrs in ran_on.values() for a in addrs
                        )
                        t = phase("task run", t, phases)
                    rec = running.record
                    if tickets:  # what the started machine ran: a ticket, no join token
                        attr = ec2_client(lc).describe_instance_attribute(
                            InstanceId=pool_id, Attribute="userData"
                        )
                        stored = base64.b64decode(attr["UserData"]["Value"]).decode()
                        assert '"ticket": "' in stored and "SWMTKN" not in stored
                        assert "-k --pinnedpubkey sha256//" in stored  # fetched over TLS, its key pinned
                    assert {iid for a in rec.of(Start) for iid in a.instance_ids} == {pool_id}
                    assert not [a for a in rec.of(Launch) if not a.pool], rec.of(Launch)
                    assert names == {host}, (names, host)
                    assert all(m.worker is None for m in emulator.machines.values())  # not the emulator's
                    ps = await manager.docker(
                        "service",
                        "ps",
                        WORKER_SERVICE,
                        "--filter",
                        "desired-state=running",
                        "--format",
                        "{{.Node}}",
                    )
                    assert host in short_names(ps.split()), ps

                    # 3. idle: stopped back into the pool, its worker gone
                    await wait_for(
                        lambda: (
                            set(_stopped(lc)) == {pool_id} and not owned_instances(lc) and bool(rec.of(Stop))
                        ),
                        240,
                        "the machine stopped back into the pool",
                    )
                    assert all("stopped into the warm pool" in a.reason for a in rec.of(Stop)), rec.of(Stop)
                    await wait_for(lambda: not scheduler.workers, 60, "its dask worker gone")
                    phase("stop back into the pool", t, phases)
                finally:
                    await running.halt()
    finally:
        left = list(_stopped(lc)) + list(owned_instances(lc))
        if left:
            with contextlib.suppress(Exception):
                ec2_client(lc).terminate_instances(InstanceIds=left)
        await wait_for(lambda: not _stopped(lc) and not owned_instances(lc), 60, "the pool emptied")
    print("phases:", {k: round(v, 1) for k, v in phases.items()}, flush=True)
