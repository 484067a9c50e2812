"""DaskWorkload.fence/unfence against a real dask scheduler with in-process workers: a fenced host's
workers get no task, whether they were connected when it was fenced or connect later; a busy host is
refused; a fence lifts on unfence and on expiry."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from distributed import Client, Scheduler, Worker

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.adapters.dask_check import SchedulerCheck
from swarm_autoscaler.core.ports import Fence

StartWorker = Callable[..., Awaitable[Worker]]

_GATE = threading.Event()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    _GATE.clear()
    yield _GATE
    _GATE.set()


def held(value: Any = None) -> Any:
    _GATE.wait(timeout=60)
    return value


def square(n: int) -> int:
    return n * n


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def who_ran(client: Client) -> dict[str, list[str]]:
    result: dict[str, list[str]] = await client.run_on_scheduler(
        lambda dask_scheduler: {
            str(k): sorted(ws.address for ws in ts.who_has or ()) for k, ts in dask_scheduler.tasks.items()
        }
    )
    return result


@pytest.fixture
async def short_fences(scheduler: Scheduler) -> AsyncIterator[DaskWorkload]:
    adapter = DaskWorkload(scheduler.address, timeout=5.0, fence_ttl=1.0)
    yield adapter
    await adapter.close()


async def test_a_worker_connecting_on_a_fenced_host_gets_no_task_until_unfenced(
    workload: DaskWorkload, start_worker: StartWorker, client: Client
) -> None:
    assert await workload.fence(["ip-10-0-0-7"]) == Fence()  # no worker there yet: fenced all the same
    other = await start_worker("ip-10-0-0-8", cpus=2)
    late = await start_worker("ip-10-0-0-7", cpus=2)  # the machine joins after the fence
    await until(lambda: late.status.name == "closing_gracefully")  # the worker itself knows
    futures = [client.submit(square, i, key=f"sq-{i}", resources={"CPU": 1}) for i in range(8)]
    assert await client.gather(futures) == [i * i for i in range(8)]
    ran = await who_ran(client)
    assert all(ran[f"sq-{i}"] == [other.address] for i in range(8))  # none reached the fenced worker
    by_name = {w.name: w for w in await workload.list_workers()}
    assert by_name["ip-10-0-0-7"].retiring and not by_name["ip-10-0-0-8"].retiring

    await workload.unfence(["ip-10-0-0-7", "ip-10-0-0-99"])  # an unknown host is ignored
    await until(lambda: late.status.name == "running")
    pinned = client.submit(square, 9, key="pinned", resources={"CPU": 1}, workers=[late.address])
    assert await pinned == 81
    ran = await who_ran(client)
    assert ran["pinned"] == [late.address]


async def test_fence_cordons_idle_workers_and_refuses_a_busy_host(
    workload: DaskWorkload, start_worker: StartWorker, client: Client, gate: threading.Event
) -> None:
    idle = await start_worker("ip-10-0-0-5", cpus=2)
    busy = await start_worker("ip-10-0-0-6", cpus=2)
    running = client.submit(held, "done", key="running", resources={"CPU": 1}, workers=[busy.address])
    await until(lambda: bool(busy.state.executing))

    fence = await workload.fence(["ip-10-0-0-5", "ip-10-0-0-6"])
    assert fence.refused == ("ip-10-0-0-6",)
    by_name = {w.name: w for w in fence.workers}  # as they are once fenced, read in the same call
    assert by_name["ip-10-0-0-5"].retiring and not by_name["ip-10-0-0-5"].busy
    assert by_name["ip-10-0-0-6"].busy and not by_name["ip-10-0-0-6"].retiring
    await until(lambda: idle.status.name == "closing_gracefully")
    assert busy.status.name == "running"  # a refused host is left alone
    more = client.submit(square, 4, key="more", resources={"CPU": 1})
    assert await more == 16
    assert (await who_ran(client))["more"] == [busy.address]
    gate.set()
    assert await running == "done"


async def test_a_host_holding_the_only_copy_of_a_result_is_refused(
    workload: DaskWorkload, start_worker: StartWorker, client: Client
) -> None:
    holder = await start_worker("ip-10-0-0-5", cpus=2)
    result = client.submit(square, 5, key="kept", workers=[holder.address])
    assert await result == 25  # the future keeps the result on its only holder
    fence = await workload.fence(["ip-10-0-0-5"])
    assert fence.refused == ("ip-10-0-0-5",)
    assert [w.has_unique_data for w in fence.workers] == [True]
    assert holder.status.name == "running"


async def test_a_fence_expires_and_lets_its_workers_go(
    short_fences: DaskWorkload, start_worker: StartWorker, client: Client
) -> None:
    idle = await start_worker("ip-10-0-0-5", cpus=2)
    fence = await short_fences.fence(["ip-10-0-0-5"])
    assert [w.retiring for w in fence.workers] == [True] and fence.refused == ()
    await until(lambda: idle.status.name == "closing_gracefully")
    await until(lambda: idle.status.name == "running", timeout=5.0)  # fence_ttl=1s passed
    late = await start_worker("ip-10-0-0-5-b", cpus=2)
    assert late.status.name == "running"
    assert not any(w.retiring for w in await short_fences.list_workers())


async def test_fencing_nothing_asks_the_scheduler_nothing(workload: DaskWorkload) -> None:
    assert await workload.fence(["", ""]) == Fence()
    await workload.unfence([])


async def test_a_scheduler_that_cannot_cordon_is_read_not_fenced(
    workload: DaskWorkload, start_worker: StartWorker, client: Client, gate: threading.Event
) -> None:
    workload.checked = SchedulerCheck("2022.1.0", "distributed 2022.1.0 is older than needed")
    idle = await start_worker("ip-10-0-0-5", cpus=2)
    busy = await start_worker("ip-10-0-0-6", cpus=2)
    running = client.submit(held, "done", key="running", resources={"CPU": 1}, workers=[busy.address])
    await until(lambda: bool(busy.state.executing))
    fence = await workload.fence(["ip-10-0-0-5", "ip-10-0-0-6"])
    assert fence.refused == ("ip-10-0-0-6",)  # the re-check still sees the busy host
    assert sorted(w.name for w in fence.workers) == ["ip-10-0-0-5", "ip-10-0-0-6"]
    assert idle.status.name == "running" and not any(w.retiring for w in fence.workers)  # nothing fenced
    await workload.unfence(["ip-10-0-0-5"])
    gate.set()
    assert await running == "done"


async def test_a_fence_by_short_hostname_cordons_a_worker_named_with_the_full_one(
    workload: DaskWorkload, start_worker: StartWorker
) -> None:
    """On Amazon Linux the node (and so the worker, named `{{.Node.Hostname}}`) reports EC2's full private
    DNS name; the daemon fences by the machine's short hostname, and the scheduler-side fence matches it."""
    full = await start_worker("ip-10-0-0-9.eu-west-1.compute.internal", cpus=2)
    other = await start_worker("ip-10-0-0-8", cpus=2)
    fence = await workload.fence(["ip-10-0-0-9"])
    assert [w.address for w in fence.workers] == [full.address] and fence.refused == ()
    await until(lambda: full.status.name == "closing_gracefully")
    assert other.status.name == "running"
    by_name = {w.name: w for w in await workload.list_workers()}
    assert by_name[str(full.name)].hostname == "ip-10-0-0-9" and by_name[str(full.name)].retiring
