"""act's bounds, each shown by what it protects: one node's actions never interleave, the concurrency
bound holds down to one, actions without a node run side by side, and every deadline path leaves the
rest to the next tick without raising (a launch or a termination in flight runs to its end; a read, a
retirement or a fence that hangs does not hold the tick). Over in-memory fakes, as tests/daemon/test_act.py.

The mutation run (`make mutation`) found these paths without a test that would fail when they broke."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from tests.daemon.test_act import CLUSTER, SlowSwarm, World
from tests.fakes import CATALOGUE, FakeCloud, FakeWorkload, small_policy

from swarm_autoscaler.core.actions import (
    ActivateNode,
    DrainNode,
    HostIdle,
    Launch,
    NodeOurs,
    NodeUpdate,
    NotJoined,
    NoWorker,
    Plan,
    Retired,
    RetireWorkers,
    Terminate,
)
from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.model import Availability, Instance, InstanceState, Node, NodeMarks, Worker
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.core.ports import Fence, LaunchResult
from swarm_autoscaler.daemon.act import ActConfig, Outcome, Ports, act
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

# A hang is bounded here, so that a regression fails in seconds rather than at the per-test timeout.
BOUND = 5.0


class OrderedSwarm(SlowSwarm):
    """The slow swarm recording when each node update starts and ends, per node."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.events: list[tuple[str, str, str]] = []  # (node id, "start"/"end", what)

    async def _on(self, node_id: str, what: str) -> None:
        self.events.append((node_id, "start", what))
        await self._slow()
        self.events.append((node_id, "end", what))

    async def mark(
        self,
        node_id: str,
        marks: NodeMarks,
        labels: Mapping[str, str] | None = None,
        availability: Availability | None = None,
    ) -> None:
        what = f"mark {marks.empty_since}" + (" labels" if labels else "")
        await self._on(node_id, what + (f" availability {availability}" if availability else ""))
        await MemorySwarm.mark(self, node_id, marks, labels, availability)

    async def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        await self._on(node_id, "labels")
        await MemorySwarm.add_labels(self, node_id, labels)

    async def set_availability(self, node_id: str, availability: object) -> None:  # type: ignore[override]
        await self._on(node_id, f"availability {availability}")
        await MemorySwarm.set_availability(self, node_id, availability)  # type: ignore[arg-type]


class SlowCloud(FakeCloud):
    """The fake cloud whose launches take `delay` seconds, counting those in flight."""

    delay = 0.2
    in_flight = 0
    most_in_flight = 0

    async def launch(self, type_name: str, count: int, labels: Mapping[str, str]) -> LaunchResult:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return await super().launch(type_name, count, labels)


def launches(cloud: FakeCloud) -> int:
    return sum(1 for kind, _ in cloud.calls if kind == "launch")


async def test_one_nodes_actions_never_interleave_and_run_in_plan_order() -> None:
    swarm = OrderedSwarm(delay=0.05)
    w = World(swarm)
    nodes = [w.machine(n, worker=False)[0] for n in range(1, 4)]
    actions = [
        action
        for node in nodes
        for action in (
            NodeUpdate(node, "marks and labels", NodeMarks(empty_since=2.0), (("zone", "a"),)),
            ActivateNode(node, node, "activate"),
        )
    ]
    outcomes = await w.act(*actions, concurrency=16)
    assert all(o.ok for o in outcomes)
    for node in nodes:
        mine = [(step, what) for n, step, what in swarm.events if n == node]
        # each update ends before the node's next one starts, in the order the plan gave them
        assert mine == [
            (step, what)
            for what in ("mark 2.0 labels", "availability active")  # marks+labels: ONE update
            for step in ("start", "end")
        ]
    assert swarm.most_in_flight == 3  # the three nodes' updates still ran side by side


async def test_a_concurrency_of_one_runs_one_action_at_a_time() -> None:
    for concurrency in (1, 0):  # 0 is taken as 1: act never deadlocks on a bad setting
        swarm = SlowSwarm(delay=0.02)
        w = World(swarm)
        nodes = [w.machine(n, worker=False)[0] for n in range(1, 6)]
        outcomes = await w.act(
            *(NodeUpdate(node, "empty", NodeMarks(empty_since=1.0)) for node in nodes),
            concurrency=concurrency,
        )
        assert all(o.ok for o in outcomes) and swarm.updates_done == 5
        assert swarm.most_in_flight == 1


async def test_actions_without_a_node_run_side_by_side() -> None:
    w = World()
    cloud = SlowCloud(w.clock, CATALOGUE)
    outcomes = await act(
        Plan((Launch("m5.large", 1, "pending"), Launch("m5.xlarge", 1, "pending"))),
        w.snapshot(),
        Ports(cloud, w.swarm, w.workload),
        config=ActConfig(CLUSTER),
    )
    assert all(o.ok for o in outcomes)
    assert cloud.most_in_flight == 2  # not serialised as if they shared a node


async def test_a_launch_in_flight_at_the_deadline_runs_to_its_end_and_one_not_started_is_left() -> None:
    w = World()
    cloud = SlowCloud(w.clock, CATALOGUE)
    cloud.delay = 0.4
    first, second = Launch("m5.large", 1, "pending"), Launch("m5.xlarge", 1, "pending")
    outcomes = await act(
        Plan((first, second)),
        w.snapshot(),
        Ports(cloud, w.swarm, w.workload),
        config=ActConfig(CLUSTER, concurrency=1, deadline=0.2),
    )
    # A cancelled RunInstances may still start machines no one would count: the one in flight is
    # awaited. The one that had not started by the deadline is not started at all.
    assert outcomes[0].ok and len(cloud.instances) == 1
    assert outcomes[1].kind == "deadline" and not outcomes[1].ok
    assert "passed before it ran" in outcomes[1].detail
    assert launches(cloud) == 1


class SlowRetire(FakeWorkload):
    """A scheduler whose retirements take `delay` seconds and whose worker reads after the first take
    `later_reads` seconds."""

    delay = 0.0
    later_reads = 0.0

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        await asyncio.sleep(self.delay)
        return await super().retire(addresses)

    async def list_workers(self) -> tuple[Worker, ...]:
        if self.worker_reads and self.later_reads:
            await asyncio.sleep(self.later_reads)
        return await super().list_workers()


def retire_then_drain(w: World) -> tuple[RetireWorkers, DrainNode]:
    node, host = w.machine(1)
    return (
        RetireWorkers(("tcp://10.0.0.1:1",), "idle", expect=(HostIdle(host),)),
        DrainNode(node, host, "retired", expect=(NodeOurs(node), Retired(host))),
    )


async def retire_then_drain_over(
    w: World, deadline: float, *, delay: float = 0.0, later_reads: float = 0.0
) -> tuple[tuple[Outcome, ...], DrainNode]:
    """act on a retirement then the drain it makes safe, over a `SlowRetire` scheduler with this `delay`
    and `later_reads`, under this tick deadline, bounded by `BOUND`."""
    workload = SlowRetire(workers=list(w.workload.workers))
    workload.delay, workload.later_reads = delay, later_reads
    retire, drain = retire_then_drain(w)
    plan_ = Plan((retire, drain))
    ports = Ports(w.cloud, w.swarm, workload)
    outcomes = await asyncio.wait_for(
        act(plan_, w.snapshot(), ports, config=ActConfig(CLUSTER, deadline=deadline)), BOUND
    )
    return tuple(outcomes), drain


async def test_a_retirement_cut_short_by_the_deadline_leaves_the_drain_to_the_next_tick() -> None:
    w = World()
    outcomes, drain = await retire_then_drain_over(w, 0.2, delay=0.6)
    # the retirement runs past the deadline until the hard stop (one deadline later), is cut there,
    # and the drain behind it is skipped: its worker's retirement did not happen
    assert [o.kind for o in outcomes] == ["deadline", "skipped"]
    assert "hard stop" in outcomes[0].detail and "did not happen" in outcomes[1].detail
    assert w.swarm.nodes[drain.node_id].availability == "active"


async def test_a_read_after_the_retirement_that_hangs_does_not_hold_the_tick() -> None:
    w = World()
    outcomes, drain = await retire_then_drain_over(w, 0.3, later_reads=3600)
    assert outcomes[0].ok and outcomes[1].kind == "deadline"
    assert w.swarm.nodes[drain.node_id].availability == "active"


class HangingFence(FakeWorkload):
    async def fence(self, hostnames: Sequence[str]) -> Fence:
        await asyncio.sleep(3600)
        return await super().fence(hostnames)


async def test_a_fence_that_hangs_skips_the_termination_by_the_deadline() -> None:
    w = World()
    inst = Instance("i-dead", "m5.large", InstanceState.RUNNING, w.clock.now - 400, "ip-10-0-0-9")
    w.cloud.instances[inst.id] = inst
    broken = Terminate(("i-dead",), "broken", expect=(NotJoined("ip-10-0-0-9"), NoWorker("ip-10-0-0-9")))
    workload = HangingFence()
    (outcome,) = await asyncio.wait_for(
        act(
            Plan((broken,)),
            w.snapshot(),
            Ports(w.cloud, w.swarm, workload),
            config=ActConfig(CLUSTER, deadline=0.3),
        ),
        BOUND,
    )
    assert outcome.kind == "skipped" and outcome.ok is False
    assert (
        outcome.detail == "skipped: could not fence its host before terminating (the tick's deadline passed)"
    )
    assert "i-dead" in w.cloud.instances


async def test_a_retirement_that_did_not_happen_cancels_the_nodes_drain() -> None:
    w = World()
    node, host = w.machine(1)
    w.workload.workers = [World.worker(1, tasks=2)]  # it got work since the plan: its retirement is skipped
    outcomes = await w.act(
        RetireWorkers(("tcp://10.0.0.1:1",), "idle", expect=(HostIdle(host),)),
        DrainNode(node, host, "empty", expect=(NodeOurs(node),)),  # without Retired: act must still hold
    )
    assert [o.kind for o in outcomes] == ["skipped", "skipped"]
    assert "the retirement of worker tcp://10.0.0.1:1 did not happen (skipped)" in outcomes[1].detail
    assert w.swarm.nodes[node].availability == "active"


async def test_without_a_fresh_read_every_failure_is_named() -> None:
    w = World()
    node, host = w.machine(1)

    class FailingSwarm(MemorySwarm):
        async def list_nodes(self) -> tuple[Node, ...]:
            raise EndpointError("unix:///var/run/docker.sock", "engine gone")

    swarm = FailingSwarm(cluster_name=CLUSTER)
    swarm.nodes = w.swarm.nodes
    w.workload.fail_observe = EndpointError("tcp://scheduler", "connection refused")
    (outcome,) = await act(
        Plan((DrainNode(node, host, "empty", expect=(NodeOurs(node),)),)),
        w.snapshot(),
        Ports(w.cloud, swarm, w.workload),
        config=ActConfig(CLUSTER),
    )
    assert outcome.kind == "skipped" and outcome.ok is False
    assert outcome.detail.startswith("skipped: no fresh read to re-check against (EndpointError: ")
    assert "engine gone" in outcome.detail and "connection refused" in outcome.detail
    assert "; EndpointError: " in outcome.detail  # both failures, each with its type


async def test_a_cordoned_worker_whose_retirement_was_cut_short_is_retired_again_next_time() -> None:
    """The chaos test's liveness failure (seed 20607): the plan retires a cordoned idle worker and drains
    its node, with a mark that clears the cordon mark; the deadline cuts the retirement short. Had the
    mark been written first, the worker (still closing_gracefully from its cordon) would look retiring
    to every later plan, which waits on a retirement no one is doing: the fleet never settles."""
    w = World()
    node, host = w.machine(1)
    address = "tcp://10.0.0.1:1"
    cordoned = NodeMarks(ready=True, empty_since=w.clock.now - 100, cordoned_since=w.clock.now - 200)
    await w.swarm.mark(node, cordoned)
    workload = SlowRetire(workers=[dataclasses.replace(World.worker(1), retiring=True)])
    workload.delay = 0.6
    w.workload = workload
    w.ports = Ports(w.cloud, w.swarm, workload)
    policy = small_policy(5)
    first = plan(w.snapshot(), policy)
    assert [type(a) for a in first.actions] == [RetireWorkers, DrainNode]  # the drain carries the marks
    outcomes = await asyncio.wait_for(
        act(first, w.snapshot(), w.ports, config=ActConfig(CLUSTER, deadline=0.2)), BOUND
    )
    w.clock.step(policy.drain_delay)
    snapshot = w.snapshot()
    assert classify(snapshot, policy).active  # not "retiring": a later plan acts on it
    assert w.swarm.nodes[node].marks == cordoned  # the cordon mark stays with its worker
    assert [o.kind for o in outcomes] == ["deadline", "skipped"]  # cut at the hard stop; drain skipped
    again = plan(snapshot, policy).actions
    assert (
        RetireWorkers((address,), f"idle for at least drain_delay={policy.drain_delay:g}s", (HostIdle(host),))
        in again
    )
    assert any(isinstance(a, DrainNode) and a.node_id == node for a in again)


async def test_the_marks_of_a_node_whose_drain_is_skipped_are_skipped_with_it() -> None:
    w = World()
    theirs, host = w.machine(1, labels={}, worker=False)  # not ours: its drain is skipped
    before = w.swarm.nodes[theirs].marks
    drain = DrainNode(theirs, host, "empty", (NodeOurs(theirs),), NodeMarks(drained_since=w.clock.now))
    (outcome,) = await w.act(drain)
    assert outcome.kind == "skipped" and "ownership label" in outcome.detail
    assert w.swarm.nodes[theirs].marks == before


async def test_the_oldest_waiting_actions_start_first_and_the_deadline_leaves_the_newest() -> None:
    swarm = OrderedSwarm(delay=0.1)
    w = World(swarm)
    nodes = [w.machine(n, worker=False)[0] for n in range(1, 7)]
    marks = [NodeUpdate(node, "empty", NodeMarks(empty_since=float(n))) for n, node in enumerate(nodes)]
    waited = {nodes[4]: 7, nodes[5]: 3}  # these two were planned and left over the last ticks
    outcomes = await act(
        Plan(tuple(marks)),
        w.snapshot(),
        w.ports,
        config=ActConfig(CLUSTER, concurrency=2, deadline=0.15),  # one bookkeeping slot: two start
        age=lambda a: waited.get(getattr(a, "node_id", ""), 0),
    )
    started = [node for node, step, _ in swarm.events if step == "start"]
    assert started == [nodes[4], nodes[5]]  # oldest first, then the deadline stopped starting work
    assert [o.ok for o in outcomes] == [False, False, False, False, True, True]
