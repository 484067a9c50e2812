"""The simulated world behind the ports: machine lifecycle, refusals, billing, busy accounting."""

from __future__ import annotations

import pytest

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import Availability, InstanceState, NodeMarks, NodeStatus
from swarm_autoscaler.core.ports import Cloud, Orchestrator, Workload
from swarm_autoscaler.errors import NotFoundError
from swarm_autoscaler_lab.sim.faults import ScriptedFaults
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import EPOCH, Knobs, SimCloud, SimOrchestrator, SimWorkload, World

KNOBS = Knobs(join_s=90.0, join_jitter_s=0.0, worker_start_s=20.0, shutdown_s=30.0, backoff_initial_s=30.0)


def make_world(*jobs: Job, faults: ScriptedFaults | None = None) -> World:
    return World(CATALOGUE, {j.key: j for j in jobs}, {}, KNOBS, faults or ScriptedFaults())


def test_ports_satisfy_the_protocols() -> None:
    world = make_world()
    assert isinstance(SimCloud(world), Cloud)
    assert isinstance(SimOrchestrator(world), Orchestrator)
    assert isinstance(SimWorkload(world), Workload)


async def test_a_node_is_ours_when_its_launch_carried_the_sim_clusters_label() -> None:
    from swarm_autoscaler.core.model import OWNERSHIP_LABEL
    from swarm_autoscaler_lab.sim.world import SIM_CLUSTER

    world = make_world()
    cloud, swarm = SimCloud(world), SimOrchestrator(world)
    await cloud.launch("m5.large", 1, {"instance-type": "m5.large", OWNERSHIP_LABEL: SIM_CLUSTER})
    await cloud.launch("m5.large", 1, {"instance-type": "m5.large"})  # placement label only
    world.advance(EPOCH + 90)
    assert sorted(n.ours for n in await swarm.list_nodes()) == [False, True]
    assert [w.hostname for w in await SimWorkload(world).list_workers()] == []  # no worker yet


async def test_launch_join_worker_then_terminate_bills_per_second() -> None:
    world = make_world()
    cloud, swarm, dask = SimCloud(world), SimOrchestrator(world), SimWorkload(world)
    result = await cloud.launch("m5.large", 1, {"instance-type": "m5.large"})
    (inst,) = result.instances
    assert inst.state is InstanceState.PENDING and inst.launched_at == EPOCH
    world.advance(EPOCH + 89)
    assert await swarm.list_nodes() == ()
    world.advance(EPOCH + 90)
    (node,) = await swarm.list_nodes()
    assert (node.hostname, node.availability, node.status) == (
        inst.hostname,
        Availability.ACTIVE,
        NodeStatus.READY,
    )
    assert node.labels == {"instance-type": "m5.large"}
    assert (await cloud.list_instances())[0].state is InstanceState.RUNNING
    world.advance(EPOCH + 110)
    (worker,) = (await dask.observe()).workers
    assert worker.hostname == inst.hostname and worker.resources.cpus == 2
    world.advance(EPOCH + 3600)
    await cloud.terminate([inst.id])
    await cloud.terminate([inst.id, "i-doesnotexist"])  # idempotent
    assert world.terminations == 1 and world.instance_seconds == 3600
    assert world.cost_usd == pytest.approx(CATALOGUE["m5.large"].price_per_hour or 0)
    assert (await dask.observe()).workers == ()
    assert (await swarm.list_nodes())[0].status is NodeStatus.DOWN
    world.advance(EPOCH + 3631)
    assert await cloud.list_instances() == ()


async def test_refusals_back_off_in_daemon_memory_which_a_restart_loses() -> None:
    world = make_world(faults=ScriptedFaults(refused_calls=frozenset({1, 2})))
    cloud = SimCloud(world)
    first = await cloud.launch("m5.large", 2, {})
    assert first.instances == () and first.refused[0].until == EPOCH + 30
    blocked = await cloud.launch("m5.large", 2, {})  # in back-off: not even tried, as on EC2
    assert blocked.refused == first.refused and world.launch_calls == 1
    world.advance(EPOCH + 30)
    second = await cloud.launch("m5.large", 2, {})
    assert second.refused[0].until == EPOCH + 90  # doubled
    assert [u.type_name for u in cloud.unavailable(EPOCH + 89)] == ["m5.large"]
    assert cloud.unavailable(EPOCH + 90) == ()
    assert SimCloud(world).unavailable(EPOCH + 30) == ()  # a restarted daemon remembers nothing
    world.advance(EPOCH + 90)
    assert len((await cloud.launch("m5.large", 2, {})).instances) == 2


async def test_never_joining_instance_runs_without_a_node() -> None:
    world = make_world(faults=ScriptedFaults(never_join=frozenset({1})))
    cloud = SimCloud(world)
    await cloud.launch("m5.large", 2, {})
    world.advance(EPOCH + 1000)
    assert {i.state for i in await cloud.list_instances()} == {InstanceState.RUNNING}
    assert len(world.nodes) == 1


async def test_draining_a_busy_node_is_recorded_and_its_task_restarts() -> None:
    job = Job(0, 0.0, 500.0, 1.0, 1.0, 0)
    world = make_world(job)
    cloud, swarm = SimCloud(world), SimOrchestrator(world)
    world.events.push(EPOCH + 200, "submit", job.key)
    await cloud.launch("m5.large", 1, {})
    world.advance(EPOCH + 200)
    assert world.scheduler.running_count() == 1
    (node,) = await swarm.list_nodes()
    await swarm.set_availability(node.id, Availability.DRAIN)
    assert [v.what for v in world.violations] == [f"drain set: node {node.hostname} held 1 task(s)"]
    assert world.scheduler.restarts == 1 and len(world.scheduler.unrunnable) == 1
    await swarm.set_availability(node.id, Availability.ACTIVE)
    world.advance(EPOCH + 220)
    assert world.scheduler.started_at[job.key] == EPOCH + 220


async def test_marks_survive_in_the_world_and_missing_nodes_raise() -> None:
    world = make_world()
    await SimCloud(world).launch("m5.large", 1, {})
    world.advance(EPOCH + 90)
    node_id = next(iter(world.nodes))
    await SimOrchestrator(world).mark(node_id, NodeMarks(ready=True, empty_since=EPOCH + 90))
    (node,) = await SimOrchestrator(world).list_nodes()  # a fresh adapter, as after a restart
    assert node.marks == NodeMarks(ready=True, empty_since=EPOCH + 90)
    with pytest.raises(NotFoundError):
        await SimOrchestrator(world).set_availability("nope", Availability.DRAIN)
    await SimOrchestrator(world).remove("nope")  # already gone counts as success


async def test_retired_idle_worker_is_restarted_by_swarm_while_its_node_is_active() -> None:
    world = make_world()
    await SimCloud(world).launch("m5.large", 1, {})
    world.advance(EPOCH + 110)
    (worker,) = (await SimWorkload(world).observe()).workers
    assert await SimWorkload(world).retire([worker.address, "tcp://unknown:1"]) == (worker.address,)
    assert world.violations == [] and (await SimWorkload(world).observe()).workers == ()
    world.advance(EPOCH + 130)
    assert len((await SimWorkload(world).observe()).workers) == 1


def holding_world(*jobs: Job) -> World:
    knobs = Knobs(join_s=90.0, join_jitter_s=0.0, worker_start_s=20.0, shutdown_s=30.0, hold_results=True)
    return World(CATALOGUE, {j.key: j for j in jobs}, {}, knobs, ScriptedFaults())


async def test_a_worker_whose_held_results_have_nowhere_to_go_is_kept_on_retirement() -> None:
    """With `hold_results`, a finished job's result stays on its worker (unique data) until every job
    has finished; retiring the only worker moves nothing and keeps it, as dask's `retire_workers` does."""
    world = holding_world(Job(0, 0.0, 10.0, 1.0, 1.0, 0), Job(1, 5000.0, 10.0, 1.0, 1.0, 0))
    cloud, dask = SimCloud(world), SimWorkload(world)
    await cloud.launch("m5.large", 1, {"instance-type": "m5.large"})
    world.advance(EPOCH + 110)
    world.scheduler.submit("job-000000", world.now)
    world.advance(EPOCH + 121)
    (holder,) = (await dask.observe()).workers
    assert holder.holding
    assert await dask.retire([holder.address]) == ()
    assert [w.address for w in (await dask.observe()).workers if w.holding] == [holder.address]
    assert world.violations == []


async def test_a_holder_retired_beside_a_running_worker_hands_its_results_over() -> None:
    """Retiring moves the results to a running worker first; the client releases them all once the
    last job finished."""
    long, short = Job(0, 0.0, 300.0, 1.0, 1.0, 0), Job(1, 0.0, 10.0, 1.0, 1.0, 0)
    world = holding_world(long, short)
    cloud, dask = SimCloud(world), SimWorkload(world)
    await cloud.launch("m5.large", 2, {"instance-type": "m5.large"})
    world.advance(EPOCH + 110)
    world.scheduler.submit(long.key, world.now)  # to the first worker
    world.scheduler.submit(short.key, world.now)  # to the least busy: the second
    world.advance(EPOCH + 121)
    running, holder = (await dask.observe()).workers
    assert holder.holding and running.processing and not running.has_unique_data
    assert await dask.retire([holder.address]) == (holder.address,)
    (receiver,) = (await dask.observe()).workers
    assert receiver.address == running.address and receiver.has_unique_data and world.violations == []
    world.advance(EPOCH + 420)
    assert not any(w.has_unique_data for w in (await dask.observe()).workers)


async def test_draining_a_node_whose_worker_holds_the_only_copy_of_a_result_is_a_violation() -> None:
    job = Job(0, 0.0, 10.0, 1.0, 1.0, 0)
    world = holding_world(job, Job(1, 5000.0, 10.0, 1.0, 1.0, 0))  # the second keeps results held
    cloud, swarm = SimCloud(world), SimOrchestrator(world)
    await cloud.launch("m5.large", 1, {"instance-type": "m5.large"})
    world.advance(EPOCH + 110)
    world.scheduler.submit(job.key, world.now)
    world.advance(EPOCH + 130)
    (node,) = await swarm.list_nodes()
    await swarm.set_availability(node.id, Availability.DRAIN)
    assert [v.what for v in world.violations] == [
        f"drain set: node {node.hostname} held the only copy of 1 result(s)"
    ]
