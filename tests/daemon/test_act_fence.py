"""act fences the hosts of its terminations before the EC2 call (over the in-memory fakes, whose
FakeWorkload keeps fences as the dask adapter does): a machine that joins after the last fresh read
can no longer get a task, so a termination goes ahead only on an idle machine."""

from __future__ import annotations

from collections.abc import Sequence

from tests.daemon.test_act import World, terminated
from tests.fakes import FakeWorkload

from swarm_autoscaler.core.actions import (
    DrainNode,
    HostIdle,
    NodeOurs,
    NotJoined,
    NoWorker,
    RetireWorkers,
    Terminate,
)
from swarm_autoscaler.core.model import GIB, Instance, InstanceState, Resources, Task
from swarm_autoscaler.daemon.act import Ports
from swarm_autoscaler.errors import EndpointError

HOST = "ip-10-0-0-9"
TASK = Task("late-task", Resources(1, GIB))


def broken_machine(w: World) -> Terminate:
    """An instance planned as broken: no node, no worker, past its start time."""
    inst = Instance("i-late", "m5.large", InstanceState.RUNNING, w.clock.now - 400, HOST)
    w.cloud.instances[inst.id] = inst
    return Terminate(("i-late",), "broken: not up within 8s", expect=(NotJoined(HOST), NoWorker(HOST)))


def joins(w: World, busy: bool, gave: list[bool]) -> None:
    """The machine joins and its worker connects; with `busy` the scheduler then tries to hand it a
    task (`gave` records whether it could)."""
    w.swarm.join(HOST, w.swarm.join_token)
    worker = w.workload.connect(World.worker(9))
    if busy:
        gave.append(w.workload.give(worker.address, TASK))


def fences(workload: FakeWorkload) -> list[tuple[str, tuple[str, ...]]]:
    return workload.fence_calls


async def test_a_worker_connecting_between_the_fence_and_the_termination_gets_no_task() -> None:
    w = World()
    broken = broken_machine(w)
    gave: list[bool] = []
    w.workload.after_fence.append(lambda: joins(w, True, gave))  # after the re-check, before EC2
    (outcome,) = await w.act(broken)
    assert gave == [False]  # fenced as it connected
    (worker,) = w.workload.workers
    assert worker.retiring and not worker.busy  # idle when TerminateInstances went out
    assert outcome.ok and terminated(w) == ["i-late"]
    assert fences(w.workload) == [("fence", (HOST,))]  # the fence stays: the machine is going


async def test_a_worker_that_got_a_task_between_the_fresh_read_and_the_fence_keeps_its_machine() -> None:
    w = World()
    broken = broken_machine(w)
    gave: list[bool] = []
    w.workload.after_read.append(lambda: joins(w, True, gave))  # after the last read, before the fence
    (outcome,) = await w.act(broken)
    assert gave == [True]
    assert outcome.kind == "skipped" and outcome.ok is False and terminated(w) == []
    assert outcome.detail.startswith("skipped: ")  # as every skip, whichever re-check made it
    assert f"a worker connected on {HOST}" in outcome.detail
    assert f"; the fence refused {HOST}: a worker there is busy" in outcome.detail  # every reason
    assert not w.workload.workers[0].retiring  # a refused host is left alone


async def test_an_idle_worker_seen_by_the_fence_skips_the_broken_terminate_and_is_let_go() -> None:
    w = World()
    broken = broken_machine(w)
    w.workload.after_read.append(lambda: joins(w, False, []))
    (outcome,) = await w.act(broken)
    assert outcome.kind == "skipped" and terminated(w) == []
    assert f"a worker connected on {HOST}" in outcome.detail  # the machine came up after all
    assert fences(w.workload) == [("fence", (HOST,)), ("unfence", (HOST,))]
    assert not w.workload.workers[0].retiring and w.workload.give(w.workload.workers[0].address, TASK)


async def test_an_idle_machine_beyond_the_reserve_is_fenced_and_terminated() -> None:
    w = World()
    node, host = w.machine(3)
    end = Terminate(
        ("i-0003",), "drained, beyond the reserve", (node,), expect=(HostIdle(host), NodeOurs(node))
    )
    w.workload.after_fence.append(lambda: w.workload.give(w.workload.workers[0].address, TASK))
    (outcome,) = await w.act(end)
    assert outcome.ok and terminated(w) == ["i-0003"]
    assert w.workload.workers[0].retiring and not w.workload.workers[0].busy


async def test_one_refused_host_does_not_hold_back_the_others_in_the_batch() -> None:
    w = World()
    node_a, host_a = w.machine(3)
    node_b, host_b = w.machine(4)
    ends = [
        Terminate((f"i-000{n}",), "beyond the reserve", (node,), expect=(HostIdle(host), NodeOurs(node)))
        for n, node, host in ((3, node_a, host_a), (4, node_b, host_b))
    ]
    w.workload.after_read.append(lambda: w.workload.give(w.workload.workers[0].address, TASK))
    first, second = await w.act(*ends)
    assert first.kind == "skipped" and f"the fence refused {host_a}" in first.detail
    assert second.ok and terminated(w) == ["i-0004"]
    assert fences(w.workload) == [("fence", (host_a, host_b)), ("unfence", (host_a,))]


async def test_a_failed_termination_lifts_its_fence() -> None:
    w = World()
    node, host = w.machine(3)
    w.cloud.fail_terminate = EndpointError("ec2", "throttled")
    end = Terminate(("i-0003",), "beyond the reserve", (node,), expect=(HostIdle(host), NodeOurs(node)))
    (outcome,) = await w.act(end)
    assert not outcome.ok and outcome.kind == "error"
    assert fences(w.workload) == [("fence", (host,)), ("unfence", (host,))]
    assert not w.workload.workers[0].retiring


async def test_without_a_fence_no_termination_goes_out() -> None:
    w = World()
    broken = broken_machine(w)
    w.workload.fail_fence = EndpointError("dask scheduler", "connection refused")
    (outcome,) = await w.act(broken)
    assert outcome.kind == "skipped" and terminated(w) == []
    assert outcome.detail == (
        "skipped: could not fence its host before terminating (EndpointError: dask scheduler: connection refused)"
    )
    assert fences(w.workload)[-1] == ("unfence", (HOST,))  # best effort: the call may have landed


async def test_a_fence_that_cannot_be_lifted_does_not_fail_the_act() -> None:
    """Lifting a fence is best effort (it expires on the scheduler): a failing unfence call changes no
    outcome and raises nothing."""

    class StuckFence(FakeWorkload):
        async def unfence(self, hostnames: Sequence[str]) -> None:
            await super().unfence(hostnames)
            raise EndpointError("dask scheduler", "connection reset")

    w = World()
    node, host = w.machine(3)
    workload = StuckFence(workers=list(w.workload.workers))
    w.workload = workload
    w.ports = Ports(w.cloud, w.swarm, workload)
    w.cloud.fail_terminate = EndpointError("ec2", "throttled")
    end = Terminate(("i-0003",), "beyond the reserve", (node,), expect=(HostIdle(host), NodeOurs(node)))
    (outcome,) = await w.act(end)
    assert not outcome.ok and outcome.kind == "error" and "throttled" in outcome.detail
    assert fences(workload) == [("fence", (host,)), ("unfence", (host,))]


async def test_a_refused_fence_keeps_the_outcomes_of_the_retirements_before_it() -> None:
    w = World()
    _, idle_host = w.machine(1)
    broken = broken_machine(w)

    def after_the_last_read() -> None:  # the broken machine's worker got a task, then the fence came
        if w.workload.worker_reads == 2:
            joins(w, True, [])

    w.workload.after_read.append(after_the_last_read)
    retire = RetireWorkers(("tcp://10.0.0.1:1",), "idle", expect=(HostIdle(idle_host),))
    outcomes = await w.act(retire, broken)
    assert [o.kind or "ok" for o in outcomes] == ["ok", "skipped"]
    assert f"the fence refused {HOST}" in outcomes[1].detail
    assert w.workload.retired == ["tcp://10.0.0.1:1"] and terminated(w) == []


async def test_no_fence_is_asked_for_without_a_termination() -> None:
    w = World()
    node, host = w.machine(1, worker=False)
    (outcome,) = await w.act(DrainNode(node, host, "empty", expect=(NodeOurs(node),)))
    assert outcome.ok and fences(w.workload) == []
