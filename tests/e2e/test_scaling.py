"""End to end on the local cloud with real dockerd swarm nodes: scale up and down, a machine that never joins,
and a capacity refusal. The daemon is the real one (`lc.daemon()` = `open_daemon` from settings), against
moto over HTTP, a real dask scheduler with real workers, and a real dockerd swarm manager.

Every machine boots as EC2 boots it (the `real_boot` fixture): it runs its own user data on its own
dockerd node, and its dask worker is the worker service's task."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from distributed import Client
from tests.e2e.helpers import (
    REAL_BOOT,
    Running,
    hostname_of,
    instance_state,
    owned_instances,
    short_names,
    start,
    wait_for,
)

from swarm_autoscaler.core.actions import DrainNode, Launch, Terminate
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud

pytestmark = [*REAL_BOOT, pytest.mark.timeout(400)]

SETTLE_S = 60.0
BURST = 2
# The never-joining machine is given up after this. Its replacement must boot within it too: it pulls the
# worker image from the local registry, about 6 s from launch to its worker quiet, 20 s with four machines
# pulling at once on a loaded host; 60 s was sized for loading a 250 MB tarball into each node.
NEVER_JOIN_START_S = 30.0


async def _swarm_hostnames(lc: LocalCloud, seen: set[str], stop: asyncio.Event) -> None:
    """Every hostname the swarm manager lists as a ready node, sampled until `stop`."""
    assert lc.orchestrator is not None
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a node half-way through joining can make the listing fail
            seen.update(n.hostname for n in await lc.orchestrator.list_nodes() if n.status == "ready")
        await asyncio.sleep(0.3)


async def _settled(lc: LocalCloud, running: Running) -> None:
    await wait_for(lambda: not owned_instances(lc), SETTLE_S, "the fleet back at min + reserve (0)")
    assert lc.scheduler is not None
    scheduler = lc.scheduler
    await wait_for(lambda: not scheduler.workers, 20, "every dask worker gone")
    # Stopping cancels a tick mid-act, so let the tick that terminated finish (and its outcomes be
    # recorded): wait for a later tick that has nothing left to do.
    results = running.record.results
    seen = len(results)
    await wait_for(
        lambda: len(results) > seen and not results[-1].plan.actions, 20, "a tick with nothing to do"
    )


def _all_ever(lc: LocalCloud) -> dict[str, dict[str, Any]]:
    return owned_instances(lc, ("pending", "running", "shutting-down", "terminated"))


async def test_burst_scales_up_joins_real_nodes_and_scales_back_down(
    cloud: LocalCloud, foreign_instance: str
) -> None:
    lc = cloud
    before = set(_all_ever(lc))
    runs_before = lc.moto.faults.calls().get("RunInstances", 0)
    joined_before = lc.emulator.joined_total if lc.emulator else 0
    seen_nodes: set[str] = set()
    sampling = asyncio.Event()
    sampler = asyncio.create_task(_swarm_hostnames(lc, seen_nodes, sampling))
    async with lc.daemon() as daemon:
        running = await start(daemon)
        try:
            async with Client(lc.scheduler_address, asynchronous=True) as client:
                # 2 tasks of 2 CPUs each: more than the (empty) cluster has, 2 machines' worth (the daemon
                # buys two m5.large). Two are enough for a burst of several real nodes; each more machine
                # only adds its image pull to the others' on this host (4 took 18 s to their workers, 1 took 5 s).
                futures = [
                    client.submit(
                        time.sleep, 2.0, key=f"burst-{i}", resources={"CPU": 2, "RAM": GIB}, pure=False
                    )
                    for i in range(BURST)
                ]
                await asyncio.wait_for(client.gather(futures), 240)
                assert all(f.status == "finished" for f in futures)
                ran_on = await client.who_has(futures)
                assert lc.scheduler is not None
                names = short_names(lc.scheduler.workers[a].name for addrs in ran_on.values() for a in addrs)
                assert lc.emulator is not None and all(
                    m.worker is None for m in lc.emulator.machines.values()
                )
            await _settled(lc, running)
        finally:
            await running.halt()
            sampling.set()
            await sampler

    launched = {iid: inst for iid, inst in _all_ever(lc).items() if iid not in before}
    assert launched, "no instance was launched for the burst"
    assert lc.moto.faults.calls().get("RunInstances", 0) > runs_before
    # each launched instance booted and joined the real swarm as a dockerd node with its own hostname,
    # and the tasks ran on the workers swarm started there (named after those hostnames)
    assert {hostname_of(i) for i in launched.values()} <= seen_nodes
    assert names and names <= {hostname_of(i) for i in launched.values()}, names
    assert lc.emulator is not None and lc.emulator.joined_total - joined_before == len(launched)
    # and each is now terminated (scale-down to min + reserve = 0)
    assert all(instance_state(lc, iid) in ("terminated", "shutting-down") for iid in launched)
    rec = running.record
    assert sum(a.count for a in rec.of(Launch)) == len(launched)
    terminated = {iid for a in rec.of(Terminate) for iid in a.instance_ids}
    assert terminated == set(launched)
    # retire -> drain -> terminate: every node terminated had been drained first
    drained_at = {a.node_id: t for t, a in rec.actions if isinstance(a, DrainNode)}
    for t, action in rec.actions:
        if isinstance(action, Terminate):
            for node_id in action.node_ids:
                assert node_id in drained_at and drained_at[node_id] <= t, f"{node_id} terminated undrained"
    assert any(a.node_ids for a in rec.of(Terminate)), "no terminated instance had a swarm node"
    # the instance without our tags was never touched
    assert instance_state(lc, foreign_instance) == "running"
    assert all(foreign_instance not in a.instance_ids for a in rec.of(Terminate))


async def test_instance_that_never_joins_is_terminated_and_replaced(
    cloud: LocalCloud, foreign_instance: str
) -> None:
    lc = cloud
    assert lc.emulator is not None
    emulator = lc.emulator
    before = set(_all_ever(lc))
    emulator.never_join_rate = 1.0  # the next machine to appear boots but never joins
    # long enough for the replacement to pull the worker image and join, short enough to give up on the
    # broken one quickly
    async with lc.daemon({"AUTOSCALER_MAX_START_TIME": f"{NEVER_JOIN_START_S:g}s"}) as daemon:
        running = await start(daemon)
        try:
            async with Client(lc.scheduler_address, asynchronous=True) as client:
                # one task pinned to m5.large: exactly one machine is needed
                future = client.submit(
                    time.sleep,
                    0.5,
                    key="lonely",
                    resources={"CPU": 1, "instance-type:m5.large": 1},
                    pure=False,
                )
                await wait_for(
                    lambda: any(m.never_joins for m in emulator.machines.values()),
                    30,
                    "a machine that never joins",
                )
                emulator.never_join_rate = 0.0
                broken = next(m.instance_id for m in emulator.machines.values() if m.never_joins)
                await asyncio.wait_for(future, 2 * NEVER_JOIN_START_S + 60)
                assert future.status == "finished"
            await _settled(lc, running)
        finally:
            emulator.never_join_rate = 0.0
            await running.halt()

    launched = set(_all_ever(lc)) - before
    assert broken in launched and len(launched) >= 2, f"no replacement for {broken}: launched {launched}"
    terminations = [a for a in running.record.of(Terminate) if broken in a.instance_ids]
    assert terminations, f"{broken} was never terminated"
    assert terminations[0].reason.startswith("broken"), terminations[0].reason
    assert terminations[0].node_ids == (), "a machine that never joined has no swarm node"
    # the replacement was launched after the broken one was given up (not before: one task, one machine)
    assert sum(a.count for a in running.record.of(Launch)) == len(launched)
    assert instance_state(lc, foreign_instance) == "running"


async def test_capacity_refusal_falls_back_to_the_next_type(cloud: LocalCloud, foreign_instance: str) -> None:
    lc = cloud
    before = set(_all_ever(lc))
    refusals_before = lc.moto.faults.capacity_refusals
    lc.moto.faults.refuse("m5.large")  # the cheapest type that fits
    try:
        async with lc.daemon() as daemon:
            running = await start(daemon)
            try:
                async with Client(lc.scheduler_address, asynchronous=True) as client:
                    future = client.submit(
                        time.sleep, 0.5, key="squeezed", resources={"CPU": 2, "RAM": 2 * GIB}, pure=False
                    )
                    await asyncio.wait_for(future, 240)
                    assert future.status == "finished"
                await _settled(lc, running)
            finally:
                await running.halt()
    finally:
        lc.moto.faults.allow("m5.large")

    assert lc.moto.faults.capacity_refusals > refusals_before
    launched = {iid: inst for iid, inst in _all_ever(lc).items() if iid not in before}
    types = {inst["InstanceType"] for inst in launched.values()}
    assert launched and "m5.large" not in types, types
    assert types <= {"m5.xlarge", "r5.large"}
    launches = running.record.of(Launch)
    assert {a.type_name for a in launches} >= types
    assert instance_state(lc, foreign_instance) == "running"
