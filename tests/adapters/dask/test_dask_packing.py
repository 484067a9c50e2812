"""The packing preload (`adapters.dask_packing`) on a real dask scheduler with real in-process workers:
where tasks land, read from the scheduler's `processing` per worker, with the preload and without."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from distributed import Client, Future, Scheduler, Worker

from swarm_autoscaler.adapters import dask_packing
from swarm_autoscaler.core.model import GIB

PLUGIN_FILE = str(Path(dask_packing.__file__).resolve())
BY_MODULE = "swarm_autoscaler.adapters.dask_packing"

# In-process workers run tasks in this process's threads, so a module-level event can hold them.
_GATE = threading.Event()
_KEPT: list[Future] = []  # the futures of held tasks: a released future would release its task

StartWorker = Callable[..., Awaitable[Worker]]


class Counter:
    """An actor: dask keeps its own objective for those (it balances actors by count)."""

    n = 0


def held(i: int) -> int:
    _GATE.wait(timeout=60)
    return i


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    _GATE.clear()
    yield _GATE
    _GATE.set()  # always open it: no worker thread may stay blocked after a test
    _KEPT.clear()


async def _cluster(preload: list[str]) -> AsyncIterator[tuple[Scheduler, StartWorker, Client]]:
    started: list[Worker] = []
    async with Scheduler(
        host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0", preload=preload
    ) as sched:

        async def start(name: str, cpus: int, ram: int = 8 * GIB, **extra: float) -> Worker:
            resources = {"CPU": cpus, "RAM": ram, **extra}  # as the project's workers advertise them
            worker = Worker(sched.address, name=name, nthreads=cpus, resources=resources, dashboard=False)
            await worker
            started.append(worker)
            return worker

        async with Client(sched.address, asynchronous=True, set_as_default=False) as client:
            try:
                yield sched, start, client
            finally:
                _GATE.set()
                for worker in started:
                    await worker.close()


@pytest.fixture(params=[BY_MODULE, PLUGIN_FILE], ids=["by-module", "by-path"])
async def packing(
    request: pytest.FixtureRequest, gate: threading.Event
) -> AsyncIterator[tuple[Scheduler, StartWorker, Client]]:
    """A scheduler started with the preload, by module name or by the file's path (`--preload`)."""
    async for cluster in _cluster([request.param]):
        yield cluster


@pytest.fixture
async def plain(gate: threading.Event) -> AsyncIterator[tuple[Scheduler, StartWorker, Client]]:
    async for cluster in _cluster([]):
        yield cluster


async def _submit(client: Client, sched: Scheduler, first: int, n: int, **resources: float) -> None:
    """Submit `n` held tasks one at a time, each processing before the next is sent."""
    for i in range(first, first + n):
        _KEPT.append(client.submit(held, i, key=f"held-{i}", resources=resources))
        await _until(
            lambda i=i: f"held-{i}" in sched.tasks and sched.tasks[f"held-{i}"].state == "processing"
        )


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def _placement(sched: Scheduler) -> dict[str, int]:
    return {str(ws.name): len(ws.processing) for ws in sched.workers.values()}


async def test_small_tasks_pack_onto_the_fullest_worker_that_fits(
    packing: tuple[Scheduler, StartWorker, Client],
) -> None:
    sched, start, client = packing
    assert "worker_objective" in vars(sched)  # installed on the instance by dask_setup
    await start("a", cpus=4)
    await start("b", cpus=4)
    await _submit(client, sched, 0, 4, CPU=1)
    assert sorted(_placement(sched).values()) == [0, 4]  # one machine full, the other empty
    await _submit(client, sched, 4, 1, CPU=1)  # fits only on the empty one now
    assert sorted(_placement(sched).values()) == [1, 4]


async def test_without_the_preload_dask_spreads_the_same_tasks(
    plain: tuple[Scheduler, StartWorker, Client],
) -> None:
    sched, start, client = plain
    assert "worker_objective" not in vars(sched)
    await start("a", cpus=4)
    await start("b", cpus=4)
    await _submit(client, sched, 0, 4, CPU=1)
    assert sorted(_placement(sched).values()) == [2, 2]  # least occupancy per thread: alternates


async def test_the_smallest_worker_that_fits_comes_first(
    packing: tuple[Scheduler, StartWorker, Client],
) -> None:
    sched, start, client = packing
    await start("big", cpus=8)
    await start("small", cpus=2)
    await _submit(client, sched, 0, 3, CPU=1)
    assert _placement(sched) == {"big": 1, "small": 2}  # the small one filled first, then the big one
    await _submit(client, sched, 3, 1, CPU=2)  # needs 2 CPUs: only the big one can start it now
    assert _placement(sched) == {"big": 2, "small": 2}


async def test_cpu_tasks_avoid_a_gpu_worker_while_a_cpu_worker_has_room(
    packing: tuple[Scheduler, StartWorker, Client],
) -> None:
    sched, start, client = packing
    await start("gpu", cpus=4, GPU=1)
    await start("cpu", cpus=4)
    await _submit(client, sched, 0, 4, CPU=1)
    assert _placement(sched) == {"gpu": 0, "cpu": 4}
    await _submit(client, sched, 4, 1, CPU=1, GPU=1)  # a GPU task goes where the GPU is
    await _submit(client, sched, 5, 1, CPU=1)  # the CPU worker is full: the GPU worker can start it now
    assert _placement(sched) == {"gpu": 2, "cpu": 4}


async def test_a_task_no_worker_can_start_now_falls_back_to_dasks_choice(
    packing: tuple[Scheduler, StartWorker, Client],
) -> None:
    sched, start, client = packing
    await start("a", cpus=2)
    await start("b", cpus=2)
    await _submit(client, sched, 0, 5, CPU=1)  # 2 + 2 packed, the fifth waits where dask puts it
    counts = sorted(_placement(sched).values())
    assert counts == [2, 3]
    await _submit(client, sched, 5, 1, CPU=1)
    # dask's objective (least occupancy per thread) sends it to the worker with 2, not the fuller one.
    assert sorted(_placement(sched).values()) == [3, 3]


async def test_unrestricted_tasks_and_actors_keep_dasks_objective(
    packing: tuple[Scheduler, StartWorker, Client],
) -> None:
    sched, start, client = packing
    await start("a", cpus=2)
    _KEPT.append(client.submit(Counter, actor=True, key="actor-0", resources={"CPU": 1}))
    await _until(lambda: sched.tasks.get("actor-0") is not None and sched.tasks["actor-0"].state == "memory")
    _KEPT.append(client.submit(held, 0, key="free-0"))
    await _submit(client, sched, 1, 1, CPU=1)
    await _until(
        lambda: sched.tasks.get("free-0") is not None and sched.tasks["free-0"].state == "processing"
    )
    ws = next(iter(sched.workers.values()))
    free, restricted = sched.tasks["free-0"], sched.tasks["held-1"]
    assert sched.worker_objective(free, ws) == Scheduler.worker_objective(sched, free, ws)
    original = Scheduler.worker_objective(sched, restricted, ws)
    assert sched.worker_objective(restricted, ws) == (*dask_packing.CANNOT_START_NOW, *original)
    actor = sched.tasks["actor-0"]  # a restricted actor
    assert actor.actor and actor.resource_restrictions == {"CPU": 1}
    assert sched.worker_objective(actor, ws) == Scheduler.worker_objective(sched, actor, ws)


async def test_teardown_restores_dasks_objective() -> None:
    async with Scheduler(
        host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0", preload=[BY_MODULE]
    ) as sched:
        assert "worker_objective" in vars(sched)
        dask_packing.dask_setup(sched)  # idempotent: the saved original is dask's, not ours
        dask_packing.dask_teardown(sched)
        assert "worker_objective" not in vars(sched)
        assert sched.worker_objective.__func__ is Scheduler.worker_objective  # type: ignore[attr-defined]


def test_the_module_imports_only_the_standard_library_at_run_time() -> None:
    import ast

    tree = ast.parse(Path(PLUGIN_FILE).read_text())
    runtime = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    names = {a.name for n in runtime if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in runtime if isinstance(n, ast.ImportFrom)}
    assert names == {"__future__", "logging", "collections.abc", "typing"}, names
