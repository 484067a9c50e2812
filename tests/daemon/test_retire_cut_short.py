"""A retirement cut short, over the real dask scheduler: the fleet leaves `retiring` within a few ticks
and no result is lost, wherever the cut falls.

The retirement is a real `RetireWorkers` carried out by `act` through `DaskWorkload` (dask's own
`Scheduler.retire_workers`), cut short by the tick's deadline at each point this side can reach:
before the call reaches the scheduler, while the scheduler's handler runs (the workers already
`closing_gracefully`; dask's handler runs on after the client gives up), and after it ended but before
act could set the workers it kept running again. A fourth cut is the one that needs the core rule
(`marks.STRAY_RETIREMENT`): a cordoned worker whose retirement, cut short, gives up after a later plan
uncordoned it, and so restores the status it had when it started, `closing_gracefully`, without a cordon
mark; the test sends the worker the very message dask's `_track_retire_worker` sends then. Then real
ticks (observe, plan, act over the real scheduler, an in-memory swarm and a fake cloud) run until no
member is `retiring`, and every result the user's client holds is gathered intact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from distributed import Client, Scheduler, Worker
from tests.fakes import CATALOGUE, FakeCloud, SteppedClock, small_policy

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.core.actions import Cordon, Plan, RetireWorkers, Uncordon
from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.marks import STRAY_RETIREMENT
from swarm_autoscaler.core.model import GIB, OWNERSHIP_LABEL, Instance, InstanceState, NodeMarks
from swarm_autoscaler.daemon.act import ActConfig, Ports, act
from swarm_autoscaler.daemon.tick import observe, run_tick
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

CLUSTER = "test"
HOSTS = ("ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-0-3")
DEADLINE = 1.0  # the tick's deadline in these tests (seconds)
# No consolidation: it would cordon these idle workers (with a mark, as it should), which is not the point here.
POLICY = dataclasses.replace(small_policy(3), consolidate_below=0)
REACHED: dict[str, int] = {}  # cut -> ticks whose snapshot had a member retiring (printed)


class CutWorkload(DaskWorkload):
    """DaskWorkload whose `retire` hangs at `cut` until the tick's deadline cancels it: "before" (no
    scheduler call yet), "during" (the scheduler set the workers closing_gracefully; the real client
    call is then cancelled, as act's deadline cancels it), "after" (dask's retire_workers returned)."""

    cut = ""

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        cut, self.cut = self.cut, ""  # one cut; later ticks retire normally
        if not cut:
            return await super().retire(addresses)
        inner = asyncio.ensure_future(super().retire(addresses))
        try:
            if cut == "before":
                inner.cancel()
            elif cut == "during":
                await _until(lambda: self._closing(addresses), "the scheduler to start the retirement")
            else:
                await asyncio.shield(inner)
            await asyncio.Future()  # the deadline cancels us here
        finally:
            inner.cancel()
        raise AssertionError("unreachable")  # pragma: no cover

    def _closing(self, addresses: Sequence[str]) -> bool:
        scheduler: Scheduler = self.scheduler_object
        states = [scheduler.workers.get(a) for a in addresses]
        return all(ws is None or ws.status.name != "running" for ws in states)

    scheduler_object: Any = None


async def _until(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Fleet:
    """Three machines (instance, our node, a real dask worker holding results the client keeps)."""

    def __init__(self, scheduler: Scheduler, workers: list[Worker], workload: CutWorkload) -> None:
        self.scheduler = scheduler
        self.workers = workers
        self.clock = SteppedClock()
        self.cloud = FakeCloud(self.clock, CATALOGUE)
        self.swarm = MemorySwarm(cluster_name=CLUSTER)
        self.workload = workload
        self.ports = Ports(self.cloud, self.swarm, workload)
        self.node_of: dict[str, str] = {}
        self.actions: list[list[str]] = []  # each tick's plan, for the failure messages
        for n, host in enumerate(HOSTS, start=1):
            inst = Instance(f"i-{n:04d}", "m5.large", InstanceState.RUNNING, self.clock.now - 600, host)
            self.cloud.instances[inst.id] = inst
            self.node_of[host] = self.swarm.join(host, self.swarm.join_token, {OWNERSHIP_LABEL: CLUSTER}).id

    def address(self, host: str) -> str:
        return next(w.address for w in self.workers if w.name == host)

    async def ready(self) -> None:
        for node_id in self.node_of.values():
            await self.swarm.mark(node_id, NodeMarks(ready=True))

    async def act_once(self, *actions: Any) -> None:
        snapshot = await observe(self.ports, CATALOGUE, self.clock.now)
        config = ActConfig(cluster_name=CLUSTER, deadline=DEADLINE)
        await act(Plan(actions=actions), snapshot, self.ports, config=config)

    async def ticks_until_none_retiring(self, cut: str, most: int) -> int:
        """Real ticks (observe, plan, act) until a snapshot has no member retiring; returns how many."""
        for tick in range(1, most + 1):
            self.clock.step(5)
            result = await run_tick(
                self.ports, POLICY, CATALOGUE, self.clock.now, config=ActConfig(cluster_name=CLUSTER)
            )
            self.actions.append(
                [type(a).__name__ + ": " + getattr(a, "reason", "") for a in result.plan.actions]
            )
            retiring = classify(result.snapshot, result.policy).retiring
            if not retiring:
                return tick
            REACHED[cut] = REACHED.get(cut, 0) + 1
            await asyncio.sleep(0.5)  # dask's side settles between ticks, as a poll interval lets it
        raise AssertionError(f"still retiring after {most} ticks: {[m.key for m in retiring]}")


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[Fleet, Client]]:
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as sched:
        workers = []
        for host in HOSTS:
            worker = Worker(sched.address, name=host, nthreads=2, resources={"CPU": 2, "RAM": 8 * GIB})
            await worker
            workers.append(worker)
        workload = CutWorkload(sched.address, timeout=5.0, retire_timeout=20.0)
        workload.scheduler_object = sched
        try:
            async with Client(sched.address, asynchronous=True, set_as_default=False) as client:
                yield Fleet(sched, workers, workload), client
        finally:
            await workload.close()
            for worker in workers:
                await worker.close()


async def _results(client: Client) -> tuple[list[Any], list[int]]:
    """Twelve results held by the user's client, spread over the workers (each the only copy)."""
    futures = [
        client.submit(lambda x: x * x, k, key=f"square-{k}", workers=[HOSTS[k % 3]]) for k in range(12)
    ]
    await client.gather(futures)
    return futures, [k * k for k in range(12)]


@pytest.mark.parametrize("cut", ["before", "during", "after"])
@pytest.mark.parametrize("retired", [HOSTS[:2], HOSTS], ids=["two-of-three", "all"])
async def test_a_retirement_cut_short_leaves_no_worker_retiring_and_loses_no_result(
    fleet: tuple[Fleet, Client], cut: str, retired: tuple[str, ...]
) -> None:
    world, client = fleet
    await world.ready()
    futures, expected = await _results(client)
    world.workload.cut = cut
    retire = RetireWorkers(tuple(world.address(h) for h in retired), "test: retire", ())
    await world.act_once(retire)
    ticks = await world.ticks_until_none_retiring(cut, most=4)
    assert await client.gather(futures) == expected
    left = sorted(ws.name for ws in world.scheduler.workers.values())
    print(
        f"\n{cut}/{len(retired)} workers: none retiring after {ticks} tick(s), workers left {left}; reached: {REACHED}"
    )


async def test_a_cordoned_worker_put_back_closing_gracefully_after_an_uncordon_is_set_running(
    fleet: tuple[Fleet, Client],
) -> None:
    """The ordering the core rule exists for: a cordoned worker's retirement is cut short; a later plan
    uncordons it (a task waits on it), clearing its cordon mark; then dask gives up the retirement and
    restores the status the worker had when it began, closing_gracefully. Without the rule nothing
    ever moves that worker out of `retiring` (it takes no task, nobody retires it)."""
    world, client = fleet
    await world.ready()
    futures, expected = await _results(client)
    host = HOSTS[0]
    address, node_id = world.address(host), world.node_of[host]
    await world.act_once(Cordon(node_id, host, (address,), "test: cordon", ()))
    await world.act_once(Uncordon(node_id, host, (address,), "test: a task waits on it"))
    assert world.scheduler.workers[address].status.name == "running"
    stimulus = f"retire-workers-{time.time()}"  # what _track_retire_worker sends when it gives up
    world.scheduler.stream_comms[address].send(
        {"op": "worker-status-change", "status": "closing_gracefully", "stimulus_id": stimulus}
    )
    await _until(lambda: world.scheduler.workers[address].status.name == "closing_gracefully", "the restore")
    snapshot = await observe(world.ports, CATALOGUE, world.clock.now)
    stray = classify(snapshot, POLICY).retiring
    assert [m.node.id for m in stray if m.node] == [node_id]
    ticks = await world.ticks_until_none_retiring("restored after an uncordon", most=3)
    assert ticks == 2, world.actions
    assert f"Uncordon: {STRAY_RETIREMENT}" in world.actions[0]
    assert world.scheduler.workers[address].status.name == "running"
    assert await client.gather(futures) == expected
    future = client.submit(lambda: 7, workers=[host], allow_other_workers=False, pure=False)
    assert await asyncio.wait_for(client.gather(future), 10) == 7  # it takes tasks again
    print(
        f"\nrestored after an uncordon: none retiring after {ticks} tick(s); uncordoned ({STRAY_RETIREMENT})"
    )
