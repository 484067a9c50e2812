"""The warm pool and the per-type base in the planner (core/pool.py): the buckets, the start tier, the
fall-through after a refused start, the refill, stopping into the pool, strays and the base."""

from __future__ import annotations

import dataclasses

from tests.builders import NOW, assemble, hostname, machine, make_instance, make_node, make_policy, make_tasks

from swarm_autoscaler.core.actions import HostIdle, Launch, NodeOurs, RemoveNode, Start, Stop, Terminate
from swarm_autoscaler.core.cluster import Bucket, allowed, classify
from swarm_autoscaler.core.model import (
    Availability,
    InstanceState,
    NodeMarks,
    NodeStatus,
    PoolPhase,
    TypePolicy,
    Unavailable,
)
from swarm_autoscaler.core.plan import plan

GPU = "g4dn.xlarge"


def pooled(n: int, type_name: str = GPU, age: float = 1000.0, subnet: str = "subnet-a") -> tuple:  # type: ignore[type-arg]
    inst = dataclasses.replace(make_instance(n, type_name, InstanceState.STOPPED, age), subnet_id=subnet)
    return inst, None, None


def gpu_policy(pool: int = 2, minimum: int = 0, **kwargs: object) -> object:
    return make_policy((TypePolicy("m5.large"), TypePolicy(GPU, warm_pool=pool, minimum=minimum)), **kwargs)  # type: ignore[arg-type]


def gpu_work(n: int) -> tuple:  # type: ignore[type-arg]
    return make_tasks(n, gpus=1, cpus=2, ram_gib=4)


def test_stopped_machines_within_the_pool_are_stopped_and_beyond_it_broken() -> None:
    snapshot = assemble(pooled(1, age=100), pooled(2, age=200), pooled(3, age=300))
    cluster = classify(snapshot, gpu_policy(pool=2))  # type: ignore[arg-type]
    assert [m.key for m in cluster.stopped] == ["i-0001", "i-0002"]  # the newest two
    assert [m.key for m in cluster.broken] == ["i-0003"]


def test_a_stray_stopped_machine_is_terminated_with_a_clear_reason() -> None:
    result = plan(assemble(pooled(1, type_name="m5.large")), gpu_policy())  # type: ignore[arg-type]
    [term] = result.of_kind(Terminate)
    assert term.reason.startswith("stopped outside the warm pool of m5.large")  # type: ignore[union-attr]
    assert "not up with a worker" not in term.reason  # type: ignore[union-attr]


def test_a_pool_machine_is_never_terminated_as_broken_however_old() -> None:
    result = plan(assemble(pooled(1, age=30 * 86400)), gpu_policy())  # type: ignore[arg-type]
    assert not result.of_kind(Terminate)


def test_pending_work_starts_pool_machines_before_launching() -> None:
    result = plan(assemble(pooled(1), pooled(2), unrunnable=gpu_work(3)), gpu_policy())  # type: ignore[arg-type]
    [start] = result.of_kind(Start)
    assert start.instance_ids == ("i-0001", "i-0002") and start.type_name == GPU  # type: ignore[union-attr]
    [launch] = result.of_kind(Launch)
    assert (launch.type_name, launch.count, launch.pool) == (GPU, 1, False)  # type: ignore[union-attr]
    assert dict(result.placed)["pool"] == 2


def test_in_flight_capacity_comes_before_the_pool() -> None:
    """A machine starting from the pool (or launched) already holds the pending task: no second start."""
    inst = dataclasses.replace(make_instance(3, GPU, InstanceState.PENDING, age=5), pool=PoolPhase.START)
    snapshot = assemble(pooled(1), (inst, None, None), unrunnable=gpu_work(1))
    assert classify(snapshot, gpu_policy()).starting  # type: ignore[arg-type]
    result = plan(snapshot, gpu_policy())  # type: ignore[arg-type]
    assert not result.of_kind(Start) and not result.of_kind(Launch)


def test_a_refused_start_falls_through_to_a_launch() -> None:
    refused = Unavailable(GPU, NOW + 60, "subnet-a")
    snapshot = assemble(pooled(1), unrunnable=gpu_work(1), unavailable=(refused,))
    result = plan(snapshot, gpu_policy())  # type: ignore[arg-type]
    assert not result.of_kind(Start)
    [launch] = result.of_kind(Launch)
    assert launch.type_name == GPU  # type: ignore[union-attr]  # other subnets (EC2 picks) are open


def test_starts_come_out_of_the_launch_budget() -> None:
    snapshot = assemble(pooled(1), pooled(2), pooled(3), unrunnable=gpu_work(3))
    result = plan(snapshot, gpu_policy(pool=3, max_instances=2))  # type: ignore[arg-type]
    starts = sum(len(a.instance_ids) for a in result.of_kind(Start))  # type: ignore[union-attr]
    assert starts == 2 and not result.of_kind(Launch)


def test_a_short_pool_is_refilled_when_nothing_is_pending() -> None:
    result = plan(assemble(pooled(1)), gpu_policy(pool=3))  # type: ignore[arg-type]
    [launch] = result.of_kind(Launch)
    assert (launch.type_name, launch.count, launch.pool) == (GPU, 2, True)  # type: ignore[union-attr]
    busy = plan(assemble(pooled(1), unrunnable=make_tasks(1)), gpu_policy(pool=3))  # type: ignore[arg-type]
    assert not [a for a in busy.of_kind(Launch) if a.pool]  # type: ignore[union-attr]


def test_preparing_machines_count_toward_the_pool() -> None:
    prep = dataclasses.replace(make_instance(2, GPU, InstanceState.RUNNING, age=30), pool=PoolPhase.PREPARE)
    snapshot = assemble(pooled(1), (prep, None, None))
    assert [m.key for m in classify(snapshot, gpu_policy()).preparing] == ["i-0002"]  # type: ignore[arg-type]
    assert not plan(snapshot, gpu_policy()).actions  # type: ignore[arg-type]


def test_a_preparing_machine_that_never_stops_is_terminated() -> None:
    prep = dataclasses.replace(make_instance(2, GPU, InstanceState.RUNNING, age=900), pool=PoolPhase.PREPARE)
    [term] = plan(assemble((prep, None, None)), gpu_policy()).of_kind(Terminate)  # type: ignore[arg-type]
    assert "not stopped after preparing" in term.reason  # type: ignore[union-attr]


def _drained(n: int, type_name: str = GPU) -> tuple:  # type: ignore[type-arg]
    marks = NodeMarks(ready=True, drained_since=NOW - 1000)
    return machine(n, type_name, availability=Availability.DRAIN, marks=marks, worker=False)


def test_scale_down_stops_a_drained_machine_into_a_short_pool() -> None:
    result = plan(assemble(_drained(1), _drained(2), pooled(3)), gpu_policy(pool=2))  # type: ignore[arg-type]
    [stop] = result.of_kind(Stop)
    [term] = result.of_kind(Terminate)
    assert stop.node_ids and "stopped into the warm pool" in stop.reason  # type: ignore[union-attr]
    assert set(stop.expect) == {HostIdle(hostname(int(stop.instance_ids[0][-1]))), NodeOurs(stop.node_ids[0])}  # type: ignore[union-attr]
    assert term.instance_ids != stop.instance_ids  # type: ignore[union-attr]
    assert not [a for a in result.of_kind(Launch) if a.pool]  # type: ignore[union-attr]  # filled by the stop
    stopped_node = stop.node_ids[0]  # type: ignore[union-attr]
    assert not any(
        getattr(a, "node_id", None) == stopped_node and getattr(a, "marks", NodeMarks()).termination_started
        for a in result.actions
    )


def test_the_base_of_a_type_is_kept_and_launched() -> None:
    policy = gpu_policy(pool=0, minimum=2)
    result = plan(assemble(_drained(1), _drained(2)), policy)  # type: ignore[arg-type]
    assert not result.of_kind(Terminate) and not result.of_kind(Stop)
    [launch] = plan(assemble(_drained(1)), policy).of_kind(Launch)  # type: ignore[arg-type]
    assert (launch.type_name, launch.count) == (GPU, 1)  # type: ignore[union-attr]
    assert "base of 2 g4dn.xlarge" in launch.reason  # type: ignore[union-attr]


def test_a_down_node_left_by_a_stopped_pool_machine_is_removed() -> None:
    inst, _, _ = pooled(1)
    node = make_node(1, status=NodeStatus.DOWN)
    [remove] = plan(assemble((inst, node, None)), gpu_policy()).of_kind(RemoveNode)  # type: ignore[arg-type]
    assert remove.node_id == node.id  # type: ignore[union-attr]


def test_pool_transitions_are_in_the_table() -> None:
    for before, after in (
        (Bucket.NEW, Bucket.PREPARING),
        (Bucket.PREPARING, Bucket.STOPPED),
        (Bucket.STOPPED, Bucket.STARTING),
        (Bucket.STARTING, Bucket.JOINING),
        (Bucket.STARTING, Bucket.STOPPED),
        (Bucket.DRAINED, Bucket.STOPPED),
    ):
        assert allowed(before, after), (before, after)
    assert not allowed(Bucket.STOPPED, Bucket.DRAINED)


def test_launches_refused_where_ec2_picks_leave_pool_machines_startable() -> None:
    """A pool machine may be the only capacity left while launches are refused: only a refusal in its
    own subnet keeps it stopped."""
    refused = Unavailable(GPU, NOW + 60, "")
    result = plan(assemble(pooled(1), unrunnable=gpu_work(1), unavailable=(refused,)), gpu_policy())  # type: ignore[arg-type]
    [start] = result.of_kind(Start)
    assert start.instance_ids == ("i-0001",)  # type: ignore[union-attr]


def test_a_drained_spot_machine_is_terminated_not_stopped_into_a_short_pool() -> None:
    inst, node, worker = _drained(1)
    spot = (dataclasses.replace(inst, spot=True), node, worker)
    result = plan(assemble(spot), gpu_policy(pool=2))  # type: ignore[arg-type]
    assert not result.of_kind(Stop)  # EC2 cannot stop a one-time spot instance
    [term] = result.of_kind(Terminate)
    assert term.instance_ids == (inst.id,)  # type: ignore[union-attr]
