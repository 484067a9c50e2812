"""A machine EC2 gave notice it takes back, over a real dask scheduler and workers: real ticks (observe,
plan, act through `DaskWorkload`, an in-memory swarm and a fake cloud) retire its busy worker through
the scheduler, so the results it held move to a worker that stays and its running tasks run again
elsewhere; its node is drained and its machine terminated, and a replacement is launched. No task is
lost: every future the user's client holds finishes with the right value."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from distributed import Client, Scheduler, Worker
from tests.fakes import CATALOGUE, FakeCloud, SteppedClock, small_policy

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.core.model import GIB, OWNERSHIP_LABEL, Instance, InstanceState
from swarm_autoscaler.daemon.act import ActConfig, Ports
from swarm_autoscaler.daemon.tick import run_tick
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

CLUSTER = "test"
HOSTS = ("ip-10-0-0-1", "ip-10-0-0-2")
POLICY = dataclasses.replace(small_policy(4), consolidate_below=0)


def slow_square(x: int) -> int:
    time.sleep(1.5)
    return x * x


@pytest.fixture
async def world() -> AsyncIterator[tuple[Scheduler, Client, Ports, FakeCloud, MemorySwarm, dict[str, str]]]:
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as sched:
        workers = []
        for host in HOSTS:
            worker = Worker(sched.address, name=host, nthreads=2, resources={"CPU": 2, "RAM": 8 * GIB})
            await worker
            workers.append(worker)
        clock = SteppedClock()
        cloud = FakeCloud(clock, CATALOGUE, cluster_name=CLUSTER)
        swarm = MemorySwarm(cluster_name=CLUSTER)
        nodes = {}
        for n, host in enumerate(HOSTS, start=1):
            inst = Instance(f"i-{n:04d}", "m5.large", InstanceState.RUNNING, clock.now - 600, host)
            cloud.instances[inst.id] = inst
            nodes[host] = swarm.join(host, swarm.join_token, {OWNERSHIP_LABEL: CLUSTER}).id
        workload = DaskWorkload(sched.address, timeout=5.0, retire_timeout=20.0)
        try:
            async with Client(sched.address, asynchronous=True, set_as_default=False) as client:
                yield sched, client, Ports(cloud, swarm, workload), cloud, swarm, nodes
        finally:
            await workload.close()
            for worker in workers:
                await worker.close()


async def test_an_interrupted_busy_worker_is_retired_with_its_results_kept_and_no_task_lost(
    world: tuple[Scheduler, Client, Ports, FakeCloud, MemorySwarm, dict[str, str]],
) -> None:
    sched, client, ports, cloud, swarm, nodes = world
    doomed = next(ws.address for ws in sched.workers.values() if ws.name == HOSTS[0])
    held = [client.submit(lambda x: x + 100, k, key=f"held-{k}", workers=[doomed]) for k in range(6)]
    await client.gather(held)  # results held only on the doomed worker
    running = [
        client.submit(slow_square, k, key=f"slow-{k}", workers=[doomed], allow_other_workers=True)
        for k in range(4)
    ]
    for _ in range(500):  # until the scheduler has given the doomed worker its tasks
        if sched.workers[doomed].processing:
            break
        await asyncio.sleep(0.02)
    assert sched.workers[doomed].processing
    unique_before = {ts.key for ts in sched.workers[doomed].has_what if len(ts.who_has) == 1}
    assert len(unique_before) >= 6  # the held results are the only copies

    inst = cloud.instances["i-0001"]
    cloud.instances["i-0001"] = dataclasses.replace(inst, spot=True, interrupted_at=cloud.clock.now)
    plans: list[dict[str, int]] = []
    for _ in range(6):
        cloud.clock.step(5)
        result = await run_tick(ports, POLICY, CATALOGUE, cloud.clock.now, config=ActConfig(CLUSTER))
        plans.append(result.plan.summary())
        if "i-0001" not in cloud.instances:
            break
        await asyncio.sleep(0.5)

    print(f"\nplans: {plans}")
    assert doomed not in sched.workers, plans  # retired through the scheduler
    assert ("terminate", ("i-0001",)) in cloud.calls, plans
    assert any(kind == "launch" for kind, _ in cloud.calls), plans  # the replacement, at once
    assert nodes[HOSTS[0]] not in {n.id for n in await swarm.list_nodes()}  # removed with its machine
    assert plans[0] == {"NodeUpdate": 1, "Launch": 1, "RetireWorkers": 1, "DrainNode": 1, "Terminate": 1}
    # No task lost: the held results were moved, the running tasks ran again elsewhere.
    assert await client.gather(held) == [k + 100 for k in range(6)]
    assert await client.gather(running) == [k * k for k in range(4)]
    states: dict[str, Any] = {f.key: f.status for f in (*held, *running)}
    assert set(states.values()) == {"finished"}
