"""A real dask scheduler and in-process workers for the adapter tests, one small cluster per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from distributed import Client, Scheduler, Worker

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.core.model import GIB

StartWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def scheduler() -> AsyncIterator[Scheduler]:
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as sched:
        yield sched


@pytest.fixture
async def start_worker(scheduler: Scheduler) -> AsyncIterator[StartWorker]:
    """Start an in-process worker named like an EC2 host; every worker started is closed at the end."""
    started: list[Worker] = []

    async def start(name: str, cpus: float = 2, ram: int = 4 * GIB, **extra: float) -> Worker:
        resources = {"CPU": cpus, "RAM": ram, **extra}
        worker = Worker(scheduler.address, name=name, nthreads=2, resources=resources, dashboard=False)
        await worker
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.close()


@pytest.fixture
async def client(scheduler: Scheduler) -> AsyncIterator[Client]:
    """The user's client that submits work (not the adapter's)."""
    async with Client(scheduler.address, asynchronous=True, set_as_default=False) as user_client:
        yield user_client


@pytest.fixture
async def workload(scheduler: Scheduler) -> AsyncIterator[DaskWorkload]:
    adapter = DaskWorkload(scheduler.address, timeout=5.0, retire_timeout=20.0)
    yield adapter
    await adapter.close()
