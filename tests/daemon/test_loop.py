"""The loop over in-memory fakes of the ports, with a stepped clock and injected faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest
from tests.fakes import CATALOGUE, FakeCloud, FakeLock, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.core.actions import Launch, Terminate
from swarm_autoscaler.core.model import (
    GIB,
    OWNERSHIP_LABEL,
    Availability,
    Instance,
    InstanceState,
    NodeMarks,
    Resources,
    Task,
    Worker,
)
from swarm_autoscaler.core.ports import LaunchResult
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

POLICY = small_policy(5)


async def until(predicate: Callable[[], bool], seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def task(key: str, cpus: float = 1.0) -> Task:
    return Task(key, Resources(cpus, GIB))


class Harness:
    def __init__(self, token: str = "a", lock_state: dict[str, str | None] | None = None) -> None:
        self.clock = SteppedClock()
        self.cloud = FakeCloud(self.clock, CATALOGUE, cluster_name="test")
        self.swarm = MemorySwarm(cluster_name="test")
        self.workload = FakeWorkload()
        self.lock = FakeLock(token, lock_state if lock_state is not None else {"holder": None})
        self.daemon = self.make_daemon(self.cloud, self.lock)

    def make_daemon(self, cloud: FakeCloud, lock: FakeLock, poll: float = 5.0) -> Daemon:
        return Daemon(
            cluster_name="test",
            ports=Ports(InFlightCloud(cloud, self.clock), self.swarm, self.workload),
            lock=lock,
            policy=POLICY,
            catalogue=CATALOGUE,
            poll_interval=poll,
        )

    def launches(self) -> list[object]:
        return [args for kind, args in self.cloud.calls if kind == "launch"]


async def test_a_burst_launches_once_across_ticks() -> None:
    h = Harness()
    h.workload.unrunnable = [task(f"t{i}") for i in range(3)]
    first = await h.daemon.tick_once()
    assert first is not None and first.acted
    assert h.launches() == [("m5.large", 2)]  # 3 one-cpu tasks -> two 2-cpu machines
    h.clock.step(5)
    second = await h.daemon.tick_once()
    assert second is not None
    assert second.plan.of_kind(Launch) == ()
    assert h.launches() == [("m5.large", 2)]


async def test_in_flight_launch_counts_even_when_ec2_does_not_list_it_yet() -> None:
    h = Harness()
    h.workload.unrunnable = [task("t0")]
    await h.daemon.tick_once()
    assert h.launches() == [("m5.large", 1)]
    hidden = dict(h.cloud.instances)
    h.cloud.instances.clear()  # eventual consistency: DescribeInstances does not show it yet
    h.clock.step(5)
    result = await h.daemon.tick_once()
    assert result is not None and result.plan.of_kind(Launch) == ()
    assert {i.id for i in result.snapshot.instances} == set(hidden)


async def test_a_failing_source_means_the_tick_acts_on_nothing_and_the_loop_goes_on() -> None:
    h = Harness()
    h.workload.unrunnable = [task("t0")]
    h.cloud.fail_list = EndpointError("http://ec2", "connection refused")
    assert await h.daemon.tick_once() is None
    assert h.launches() == []
    assert h.daemon.last_success is None
    h.cloud.fail_list = None
    h.clock.step(5)
    assert await h.daemon.tick_once() is not None
    assert h.launches() == [("m5.large", 1)]
    assert h.daemon.last_success == h.clock.now


async def test_a_failing_action_is_data_and_the_others_still_run() -> None:
    h = Harness()
    broken = Instance("i-broken", "m5.large", InstanceState.RUNNING, h.clock.now - 1000, "ip-10-9-9-9")
    h.cloud.instances[broken.id] = broken
    h.workload.unrunnable = [task("t0")]
    h.cloud.fail_launch = EndpointError("http://ec2", "500 internal error")
    result = await h.daemon.tick_once()
    assert result is not None
    by_kind = {o.action_kind: o for o in result.outcomes}
    assert not by_kind["Launch"].ok and "500 internal error" in by_kind["Launch"].detail
    assert by_kind["Terminate"].ok
    assert "i-broken" not in h.cloud.instances


class SlowCloud(FakeCloud):
    async def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
    ) -> LaunchResult:
        await asyncio.sleep(0.3)
        return await super().launch(type_name, count, labels, pool)


async def test_losing_the_lock_mid_tick_cancels_the_remaining_actions() -> None:
    h = Harness()
    slow = SlowCloud(h.clock, CATALOGUE)
    slow.instances["i-broken"] = Instance(
        "i-broken", "m5.large", InstanceState.RUNNING, h.clock.now - 1000, "ip-10-9-9-9"
    )
    lock = FakeLock("a", lose_on_extend=True)
    daemon = h.make_daemon(slow, lock)
    daemon.lock_ttl = 0.15  # the keeper extends every 50 ms and finds the lock gone
    h.workload.unrunnable = [task("t0")]
    result = await daemon.tick_once()
    assert result is not None
    kinds = {type(o.action): o for o in result.outcomes}
    assert kinds[Launch].ok  # launches go first; the lock is lost while it runs
    assert not kinds[Terminate].ok and kinds[Terminate].kind == "cancelled"
    assert [c for c in slow.calls if c[0] == "terminate"] == []


class StuckSwarm(MemorySwarm):
    """A swarm whose node updates hang (a docker engine that stopped answering)."""

    def __init__(self) -> None:
        super().__init__(cluster_name="test")
        self.entered = asyncio.Event()

    async def mark(
        self,
        node_id: str,
        marks: NodeMarks,
        labels: Mapping[str, str] | None = None,
        availability: Availability | None = None,
    ) -> None:
        self.entered.set()
        await asyncio.sleep(3600)


async def test_stop_mid_act_exits_within_seconds_and_releases_the_lock() -> None:
    h = Harness()
    swarm = StuckSwarm()
    h.swarm = swarm
    daemon = h.make_daemon(h.cloud, h.lock, poll=3600.0)  # the deadline alone would wait two hours
    for n in range(1, 41):  # 40 joined nodes to mark as ready: 40 stuck updates
        host = f"ip-10-0-0-{n}"
        h.cloud.instances[f"i-{n}"] = Instance(f"i-{n}", "m5.large", InstanceState.RUNNING, h.clock.now, host)
        swarm.join(host, swarm.join_token, {OWNERSHIP_LABEL: "test", "instance-type": "m5.large"})
        h.workload.workers.append(Worker(f"tcp://10.0.0.{n}:1", host, host, Resources(2, 8 * GIB)))
    stop = asyncio.Event()
    runner = asyncio.create_task(daemon.run(stop))
    await asyncio.wait_for(swarm.entered.wait(), 5)
    started = time.perf_counter()
    stop.set()  # what SIGTERM and SIGINT do (commands.run)
    await asyncio.wait_for(runner, 10)
    assert time.perf_counter() - started < 2.0
    assert h.lock.state["holder"] is None


async def test_two_replicas_exactly_one_acts() -> None:
    shared: dict[str, str | None] = {"holder": None}
    a, b = Harness("a", shared), Harness("b", shared)
    b.cloud, b.workload, b.swarm = a.cloud, a.workload, a.swarm
    b.daemon = b.make_daemon(a.cloud, b.lock)
    a.workload.unrunnable = [task("t0")]
    ra = await a.daemon.tick_once()
    rb = await b.daemon.tick_once()
    assert ra is not None and ra.acted
    assert rb is not None and not rb.acted and rb.outcomes == ()
    assert a.launches() == [("m5.large", 1)]
    assert (a.daemon.leader, b.daemon.leader) == (True, False)


async def test_an_unreachable_lock_is_a_failed_tick_not_a_dead_loop() -> None:
    h = Harness()
    h.lock.fail = True
    h.workload.unrunnable = [task("t0")]
    assert await h.daemon.tick_once() is None
    assert h.launches() == []
    h.lock.fail = False
    assert await h.daemon.tick_once() is not None


async def test_a_scheduler_change_starts_a_tick_long_before_the_poll_interval() -> None:
    h = Harness()
    daemon = h.make_daemon(h.cloud, h.lock, poll=60.0)
    stop = asyncio.Event()
    runner = asyncio.create_task(daemon.run(stop))
    await until(lambda: daemon.ticks >= 1)
    assert h.launches() == []
    started = time.perf_counter()
    h.workload.unrunnable = [task("t0")]
    h.workload.changed.set()
    await until(lambda: daemon.ticks >= 2)
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.wait_for(runner, 5)
    assert h.launches() == [("m5.large", 1)]
    assert elapsed < 2.0
    assert h.lock.state["holder"] is None  # released on the way out


async def test_stop_between_ticks_returns_at_once() -> None:
    h = Harness()
    stop = asyncio.Event()
    runner = asyncio.create_task(h.daemon.run(stop))
    await until(lambda: h.daemon.ticks >= 1)
    stop.set()
    await asyncio.wait_for(runner, 2)
    assert runner.done() and runner.exception() is None


@pytest.mark.parametrize("busy", [True, False])
async def test_idle_worker_is_retired_only_when_not_busy(busy: bool) -> None:
    h = Harness()
    inst = Instance("i-1", "m5.large", InstanceState.RUNNING, h.clock.now - 600, "ip-10-0-0-1")
    h.cloud.instances[inst.id] = inst
    node = h.swarm.join("ip-10-0-0-1", h.swarm.join_token)
    w = Worker(
        "tcp://10.0.0.1:1",
        "ip-10-0-0-1",
        "ip-10-0-0-1",
        Resources(2, 8 * GIB),
        processing=(task("running"),) if busy else (),
    )
    h.workload.workers = [w]
    for _ in range(4):  # ready mark, empty-since mark, then the drain delay passes
        await h.daemon.tick_once()
        h.clock.step(40)
    if busy:
        assert h.workload.retired == []
        assert h.swarm.nodes[node.id].availability == "active"
    else:
        assert h.workload.retired == ["tcp://10.0.0.1:1"]


async def test_a_joined_node_gets_the_labels_its_instance_was_launched_with() -> None:
    h = Harness()
    h.workload.unrunnable = [task("t0")]
    await h.daemon.tick_once()
    (inst,) = h.cloud.instances.values()
    node = h.swarm.join(inst.hostname, h.swarm.join_token)  # the machine boots and joins, unlabelled
    assert "instance-type" not in h.swarm.nodes[node.id].labels
    h.clock.step(5)
    result = await h.daemon.tick_once()
    assert result is not None
    assert h.swarm.nodes[node.id].labels["instance-type"] == "m5.large"
    h.clock.step(5)
    again = await h.daemon.tick_once()  # labelled once, not on every tick
    assert again is not None
    assert sum(1 for c in h.swarm.calls if c == ("add_labels", inst.hostname)) == 1


async def test_consolidation_cordons_through_the_ports_and_pending_work_takes_the_worker_back() -> None:
    h = Harness()
    workers = []
    for n in (1, 2):
        host = f"ip-10-0-0-{n}"
        inst = Instance(f"i-{n}", "m5.xlarge", InstanceState.RUNNING, h.clock.now - 600, host)
        h.cloud.instances[inst.id] = inst
        h.swarm.join(host, h.swarm.join_token)
        running = Task(f"run-{n}", Resources(1, GIB), executing=True)
        workers.append(
            Worker(f"tcp://10.0.0.{n}:1", host, host, Resources(4, 16 * GIB), processing=(running,))
        )
    h.workload.workers = workers
    await h.daemon.tick_once()
    assert h.workload.cordoned == [("tcp://10.0.0.1:1", True)]  # dask now sends new tasks to the other
    node = next(n for n in h.swarm.nodes.values() if n.hostname == "ip-10-0-0-1")
    assert node.marks.cordoned_since == h.clock.now  # marked first: a restart knows it was cordoned

    h.clock.step(5)
    h.workload.unrunnable = [task("big", cpus=3), task("more", cpus=3)]  # more than the other can take
    await h.daemon.tick_once()
    assert h.workload.cordoned[-1] == ("tcp://10.0.0.1:1", False)
    assert h.swarm.nodes[node.id].marks.cordoned_since is None
    assert h.launches() == []  # the cordoned worker's room came first; the rest fit the other


@dataclass
class _StuckExtendLock(FakeLock):
    """A lock whose extension does not end when cancelled (it keeps waiting on its store), standing in
    for a redis call stuck past its cancellation: in a fresh-clone run a tick's phases took 1.1 s and the
    tick then waited 70 s for its lock extension to end."""

    extending: bool = False
    stuck_s: float = 3.0  # past the tick's 2 s bound (`KEEPER_STOP_S`)
    extensions: int = 0
    tasks: list[asyncio.Task[object]] = field(default_factory=list)

    async def extend(self) -> bool:
        self.extending = True
        self.extensions += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(self.stuck_s)  # ignores the cancellation
        return True

    async def settle(self) -> None:
        """Wait for the extensions left running to end (the test loop is shared by the whole session:
        a task that outlived its test once held up the loop's teardown past the suite's timeout)."""
        _, pending = await asyncio.wait(self.tasks, timeout=10)
        assert not pending


async def test_a_lock_extension_that_ignores_cancellation_holds_no_tick_and_a_stop_still_stops() -> None:
    h = Harness()
    lock = _StuckExtendLock("a", {"holder": None})
    daemon = h.make_daemon(h.cloud, lock)
    daemon.lock_ttl = 0.15  # the extension starts 50 ms into the tick
    slow_observe = h.workload.observe

    async def observe() -> object:
        await until(lambda: lock.extending)  # the tick ends while the extension is stuck
        return await slow_observe()

    h.workload.observe = observe  # type: ignore[method-assign]
    started = time.monotonic()
    result = await asyncio.wait_for(daemon.tick_once(), 10)
    took = time.monotonic() - started
    print(f"tick with a stuck extension: {took:.2f}s (bound 2 s after its phases)")
    assert result is not None and took < 5.0
    # A stop cancels a tick stuck in the same place: the cancellation reaches the caller.
    lock.extending = False
    tick = asyncio.create_task(daemon.tick_once())
    await until(lambda: lock.extending)
    await asyncio.sleep(0.5)  # observe, plan and act are done: the tick waits for the extension to end
    assert not tick.done()
    tick.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(tick, 5)
    await lock.settle()


async def test_an_extension_that_swallowed_its_cancellation_extends_no_more_once_its_tick_ended() -> None:
    """Its call ends 0.3 s after the cancellation and says the lock is held: the extension then stops
    (before, it went on extending, tick after tick, for as long as the process ran)."""
    h = Harness()
    lock = _StuckExtendLock("a", {"holder": None}, stuck_s=0.3)
    daemon = h.make_daemon(h.cloud, lock)
    daemon.lock_ttl = 0.15
    slow_observe = h.workload.observe

    async def observe() -> object:
        await until(lambda: lock.extending)
        return await slow_observe()

    h.workload.observe = observe  # type: ignore[method-assign]
    started = time.monotonic()
    assert await daemon.tick_once() is not None
    took = time.monotonic() - started
    await asyncio.sleep(0.5)
    print(f"tick {took:.2f}s, extensions {lock.extensions}")
    assert took < 1.5 and lock.extensions == 1
    await lock.settle()
