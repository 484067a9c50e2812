"""Fences in the simulated scheduler behave as the dask adapter's: a worker starting on a fenced host
gets no task; a busy host is refused; unfence and expiry let the fenced workers run again."""

from __future__ import annotations

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler_lab.sim.faults import ScriptedFaults
from swarm_autoscaler_lab.sim.fences import FENCE_TTL
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import EPOCH, Knobs, SimCloud, SimWorkload, World

KNOBS = Knobs(join_s=90.0, join_jitter_s=0.0, worker_start_s=20.0, shutdown_s=30.0, backoff_initial_s=30.0)


def make_world(*jobs: Job) -> World:
    return World(CATALOGUE, {j.key: j for j in jobs}, {}, KNOBS, ScriptedFaults())


async def test_a_worker_starting_on_a_fenced_host_gets_no_task_until_unfenced() -> None:
    job = Job(0, 0.0, 500.0, 1.0, 1.0, 0)
    world = make_world(job)
    dask = SimWorkload(world)
    (inst,) = (await SimCloud(world).launch("m5.large", 1, {})).instances
    world.events.push(EPOCH + 10, "submit", job.key)  # waits, unrunnable, for a worker
    world.advance(EPOCH + 100)  # joined; its worker starts at 110
    fence = await dask.fence([inst.hostname])
    assert fence.workers == () and fence.refused == ()
    world.advance(EPOCH + 120)
    (worker,) = await dask.list_workers()
    assert worker.retiring and not worker.busy and world.scheduler.running_count() == 0
    await dask.unfence([inst.hostname])
    assert world.scheduler.running_count() == 1  # let go: it takes the waiting task
    refused = await dask.fence([inst.hostname])
    assert refused.refused == (inst.hostname,) and not refused.workers[0].retiring


async def test_a_fence_expires_on_the_virtual_clock() -> None:
    world = make_world()
    dask = SimWorkload(world)
    (inst,) = (await SimCloud(world).launch("m5.large", 1, {})).instances
    world.advance(EPOCH + 120)
    fence = await dask.fence([inst.hostname])
    assert [w.retiring for w in fence.workers] == [True]
    world.advance(EPOCH + 120 + FENCE_TTL - 1)
    assert [w.retiring for w in await dask.list_workers()] == [True]
    world.advance(EPOCH + 120 + FENCE_TTL)
    assert [w.retiring for w in await dask.list_workers()] == [False]
