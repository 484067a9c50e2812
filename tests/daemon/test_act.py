"""act over in-memory fakes: re-checks against a fresh read, retire-then-drain, concurrency, batching,
the deadline and leadership. Plans are built here with the expectations a planner attaches, so these
tests hold whether the planner's actions carry one target or several."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence

from tests.fakes import CATALOGUE, FakeCloud, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.core.actions import (
    Action,
    Cordon,
    DrainNode,
    HostIdle,
    Launch,
    NodeDown,
    NodeOurs,
    NodeUpdate,
    NotJoined,
    NoWorker,
    Plan,
    RemoveNode,
    Retired,
    RetireWorkers,
    Terminate,
)
from swarm_autoscaler.core.cluster import TYPE_LABEL
from swarm_autoscaler.core.model import (
    GIB,
    OWNERSHIP_LABEL,
    Availability,
    Instance,
    InstanceState,
    NodeMarks,
    NodeStatus,
    Resources,
    Snapshot,
    Task,
    Worker,
)
from swarm_autoscaler.daemon.act import ActConfig, Outcome, Ports, act
from swarm_autoscaler.daemon.metrics import Metrics
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

CLUSTER = "test"
OURS = {OWNERSHIP_LABEL: CLUSTER}


class SlowSwarm(MemorySwarm):
    """The in-memory swarm with a delay on every node update, counting updates in flight."""

    def __init__(self, delay: float) -> None:
        super().__init__(cluster_name=CLUSTER)
        self.delay = delay
        self.in_flight = 0
        self.most_in_flight = 0
        self.updates_done = 0

    async def _slow(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        self.updates_done += 1

    async def mark(
        self,
        node_id: str,
        marks: NodeMarks,
        labels: Mapping[str, str] | None = None,
        availability: Availability | None = None,
    ) -> None:
        await self._slow()
        await super().mark(node_id, marks, labels, availability)

    async def set_availability(self, node_id: str, availability: object) -> None:  # type: ignore[override]
        await self._slow()
        await super().set_availability(node_id, availability)  # type: ignore[arg-type]


class World:
    """A cloud, a swarm and a scheduler, and snapshots taken of them."""

    def __init__(self, swarm: MemorySwarm | None = None) -> None:
        self.clock = SteppedClock()
        self.cloud = FakeCloud(self.clock, CATALOGUE)
        self.swarm = swarm or MemorySwarm(cluster_name=CLUSTER)
        self.workload = FakeWorkload()
        self.ports = Ports(self.cloud, self.swarm, self.workload)

    def machine(self, n: int, labels: Mapping[str, str] = OURS, worker: bool = True) -> tuple[str, str]:
        """An instance, its joined node and (optionally) its idle worker; returns (node id, hostname)."""
        host = f"ip-10-0-{n // 250}-{n % 250}"
        inst = Instance(f"i-{n:04d}", "m5.large", InstanceState.RUNNING, self.clock.now - 600, host)
        self.cloud.instances[inst.id] = inst
        node = self.swarm.join(host, self.swarm.join_token, labels)
        if worker:
            self.workload.workers.append(self.worker(n))
        return node.id, host

    @staticmethod
    def worker(n: int, tasks: int = 0, unique: bool = False) -> Worker:
        host = f"ip-10-0-{n // 250}-{n % 250}"
        processing = tuple(Task(f"t{n}-{k}", Resources(1, GIB), executing=True) for k in range(tasks))
        return Worker(f"tcp://10.0.0.{n}:1", host, host, Resources(2, 8 * GIB), processing, unique)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now=self.clock.now,
            instance_types=tuple(CATALOGUE.values()),
            instances=tuple(self.cloud.instances.values()),
            nodes=tuple(self.swarm.nodes.values()),
            workers=tuple(self.workload.workers),
            unrunnable=(),
        )

    async def act(self, *actions: Action, **config: object) -> tuple[Outcome, ...]:
        settings = ActConfig(cluster_name=CLUSTER, **config)  # type: ignore[arg-type]
        return await act(Plan(actions=actions), self.snapshot(), self.ports, config=settings)


def terminated(w: World) -> list[str]:
    return [i for kind, ids in w.cloud.calls if kind == "terminate" for i in ids]  # type: ignore[union-attr]


async def test_a_worker_that_connects_after_the_snapshot_saves_its_machine_from_a_broken_terminate() -> None:
    w = World()
    inst = Instance("i-late", "m5.large", InstanceState.RUNNING, w.clock.now - 400, "ip-10-0-0-9")
    w.cloud.instances[inst.id] = inst
    snapshot = w.snapshot()  # observed: no node, no worker -> planned as broken
    broken = Terminate(
        ("i-late",), "broken: not up within 300s", expect=(NotJoined("ip-10-0-0-9"), NoWorker("ip-10-0-0-9"))
    )
    w.clock.step(13)  # the plan ages; meanwhile the machine joins and its worker takes 45 tasks
    w.swarm.join("ip-10-0-0-9", w.swarm.join_token)
    w.workload.workers.append(World.worker(9, tasks=45, unique=True))
    (outcome,) = await act(Plan(actions=(broken,)), snapshot, w.ports, config=ActConfig(CLUSTER))
    assert outcome.kind == "skipped" and outcome.ok is False
    assert outcome.detail.startswith("skipped: ip-10-0-0-9 joined the swarm since the plan")
    assert "since the plan; a worker connected on ip-10-0-0-9" in outcome.detail  # every reason
    assert terminated(w) == [] and "i-late" in w.cloud.instances
    metrics = Metrics(CLUSTER)
    metrics.observe_tick(TickResult(snapshot, small_policy(5), Plan((broken,)), (outcome,), True), 0.1, None)
    assert b'autoscaler_actions_total{cluster="test",kind="Terminate",outcome="skipped"} 1.0' in (
        metrics.exposition()
    )


async def test_a_still_broken_machine_is_terminated() -> None:
    w = World()
    inst = Instance("i-dead", "m5.large", InstanceState.RUNNING, w.clock.now - 400, "ip-10-0-0-9")
    w.cloud.instances[inst.id] = inst
    broken = Terminate(("i-dead",), "broken", expect=(NotJoined("ip-10-0-0-9"), NoWorker("ip-10-0-0-9")))
    (outcome,) = await w.act(broken)
    assert outcome.ok and terminated(w) == ["i-dead"]


async def test_a_retirement_the_scheduler_refuses_cancels_that_nodes_drain_and_termination() -> None:
    w = World()
    node_a, host_a = w.machine(1)
    node_b, host_b = w.machine(2)
    w.workload.keep_on_retire = {"tcp://10.0.0.1:1"}  # it holds the only copy of a result
    # Without the planner's Retired check on machine 1, to show act cancels them on the refusal itself.
    outcomes = await w.act(
        RetireWorkers(("tcp://10.0.0.1:1",), "idle", expect=(HostIdle(host_a),)),
        RetireWorkers(("tcp://10.0.0.2:1",), "idle", expect=(HostIdle(host_b),)),
        DrainNode(node_a, host_a, "retired", expect=(NodeOurs(node_a),)),
        DrainNode(node_b, host_b, "retired", expect=(NodeOurs(node_b), Retired(host_b))),
        Terminate(("i-0001",), "drained", node_ids=(node_a,), expect=(NodeOurs(node_a),)),
    )
    kinds = [(type(o.action).__name__, o.kind or "ok") for o in outcomes]
    assert kinds == [
        ("RetireWorkers", "ok"),
        ("RetireWorkers", "ok"),
        ("DrainNode", "skipped"),
        ("DrainNode", "ok"),
        ("Terminate", "skipped"),
    ]
    assert "the scheduler kept worker tcp://10.0.0.1:1" in outcomes[2].detail
    # the kept worker is set running again, or it would take no task and never be retired again
    assert ("tcp://10.0.0.1:1", False) in w.workload.cordoned
    assert not next(x for x in w.workload.workers if x.address == "tcp://10.0.0.1:1").retiring
    assert w.swarm.nodes[node_a].availability == "active"
    assert w.swarm.nodes[node_b].availability == "drain"
    assert terminated(w) == []


async def test_the_drain_is_rechecked_on_a_read_taken_after_the_retirement() -> None:
    w = World()
    node, host = w.machine(1)
    w.workload.keep_on_retire = {"tcp://10.0.0.1:1"}
    reads_before = w.workload.worker_reads
    outcomes = await w.act(
        RetireWorkers(("tcp://10.0.0.1:1",), "idle", expect=(HostIdle(host),)),
        DrainNode(node, host, "retired", expect=(Retired(host),)),
    )
    assert w.workload.worker_reads - reads_before == 2  # before the retirement, and after it
    assert outcomes[1].kind == "skipped"
    assert f"the scheduler kept worker {host} on {host}" in outcomes[1].detail


async def test_a_worker_that_got_work_since_the_plan_is_not_retired() -> None:
    w = World()
    _, host = w.machine(1)
    w.workload.workers = [World.worker(1, tasks=3)]
    (outcome,) = await w.act(RetireWorkers(("tcp://10.0.0.1:1",), "idle", expect=(HostIdle(host),)))
    assert outcome.kind == "skipped" and w.workload.retired == []


async def test_a_node_without_our_label_is_never_drained_or_removed() -> None:
    w = World()
    theirs, host = w.machine(1, labels={TYPE_LABEL: "m5.large"})  # placement label only: not ours
    w.swarm.set_status(host, NodeStatus.DOWN)
    outcomes = await w.act(
        DrainNode(theirs, host, "empty", expect=(NodeOurs(theirs),)),
        RemoveNode(theirs, host, "down too long", expect=(NodeOurs(theirs), NodeDown(theirs))),
    )
    assert [o.kind for o in outcomes] == ["skipped", "skipped"]
    assert all("does not carry our ownership label" in o.detail for o in outcomes)
    assert theirs in w.swarm.nodes and w.swarm.nodes[theirs].availability == "active"


async def test_a_node_that_came_back_is_not_removed() -> None:
    w = World()
    node, host = w.machine(1)
    snapshot_down = w.snapshot()
    (outcome,) = await act(
        Plan((RemoveNode(node, host, "down", expect=(NodeOurs(node), NodeDown(node))),)),
        snapshot_down,
        w.ports,
    )
    assert outcome.kind == "skipped" and "ready again" in outcome.detail and node in w.swarm.nodes


async def test_without_a_fresh_read_no_disruptive_action_runs() -> None:
    w = World()
    node, host = w.machine(1)
    other, _ = w.machine(2)
    w.workload.fail_observe = EndpointError("tcp://scheduler", "connection refused")
    outcomes = await w.act(
        NodeUpdate(other, "empty", NodeMarks(empty_since=w.clock.now)),
        # the drain carries its node's marks: written only with it
        DrainNode(node, host, "empty", (NodeOurs(node),), NodeMarks(drained_since=w.clock.now)),
    )
    assert [o.kind or "ok" for o in outcomes] == ["ok", "skipped"]
    assert "no fresh read" in outcomes[1].detail and "connection refused" in outcomes[1].detail
    assert w.swarm.nodes[node].availability == "active"
    assert w.swarm.nodes[node].marks.drained_since is None  # no mark of a drain that did not happen


async def test_gentle_actions_run_before_the_fresh_read_and_the_disruptive_ones() -> None:
    w = World()
    node, host = w.machine(1)
    outcomes = await w.act(
        Cordon(
            node,
            host,
            ("tcp://10.0.0.1:1",),
            "light",
            (NodeOurs(node),),
            NodeMarks(empty_since=w.clock.now, cordoned_since=w.clock.now),  # the planner's complete marks
        ),
        NodeUpdate(node, "empty", NodeMarks(empty_since=w.clock.now)),
        Launch("m5.large", 1, "pending"),
    )
    assert all(o.ok for o in outcomes)
    assert [type(o.action) for o in outcomes] == [Cordon, NodeUpdate, Launch]  # plan order
    marks = w.swarm.nodes[node].marks
    assert marks.empty_since == w.clock.now and marks.cordoned_since == w.clock.now  # both kept


async def test_launches_carry_the_ownership_label_and_the_placement_label() -> None:
    w = World()
    (outcome,) = await w.act(Launch("m5.large", 2, "pending"))
    assert outcome.ok
    for inst in w.cloud.instances.values():
        assert dict(inst.labels) == {OWNERSHIP_LABEL: CLUSTER, TYPE_LABEL: "m5.large"}


async def test_a_launch_carries_the_labels_the_planner_adds_beside_act_s_own() -> None:
    """The launch spec (drift.py) is written on each machine at launch, as a label (an EC2 tag)."""
    w = World()
    (outcome,) = await w.act(Launch("m5.large", 1, "pending", labels=(("swarm-autoscaler.spec", "abc"),)))
    assert outcome.ok
    (inst,) = w.cloud.instances.values()
    assert dict(inst.labels) == {
        OWNERSHIP_LABEL: CLUSTER,
        TYPE_LABEL: "m5.large",
        "swarm-autoscaler.spec": "abc",
    }


async def test_150_node_actions_run_concurrently_within_the_bound() -> None:
    w = World(SlowSwarm(delay=0.05))
    nodes = [w.machine(n, worker=False) for n in range(1, 151)]
    actions: list[Action] = [NodeUpdate(node, "empty", NodeMarks(empty_since=1.0)) for node, _ in nodes[:75]]
    actions += [DrainNode(node, host, "empty", expect=(NodeOurs(node),)) for node, host in nodes[75:]]
    started = time.perf_counter()
    outcomes = await w.act(*actions, concurrency=16)
    elapsed = time.perf_counter() - started
    swarm = w.swarm
    assert isinstance(swarm, SlowSwarm)
    assert all(o.ok for o in outcomes) and swarm.updates_done == 150
    # 16 safety slots (the drains) and, beside them, 8 bookkeeping slots (the marks of nodes with
    # nothing else to do): marks never hold a slot a drain waits for
    assert swarm.most_in_flight == 16 + 8
    assert elapsed < 150 * 0.05 / 4  # one by one it would take 7.5 s


async def test_terminations_go_to_ec2_in_one_call() -> None:
    w = World()
    machines = [w.machine(n, worker=False) for n in range(1, 21)]
    terminates = [
        Terminate((f"i-{n:04d}",), "drained", node_ids=(node,), expect=(NodeOurs(node),))
        for n, (node, _) in enumerate(machines, 1)
    ]
    outcomes = await w.act(*terminates)
    assert all(o.ok for o in outcomes)
    calls = [c for c in w.cloud.calls if c[0] == "terminate"]
    assert len(calls) == 1 and len(calls[0][1]) == 20  # type: ignore[arg-type]
    assert w.swarm.nodes == {}


async def test_the_deadline_stops_starting_work_and_lets_what_runs_finish() -> None:
    # the progress rule: a node update already running is not cancelled at the deadline (its effect
    # would be unknown and the next plan would ask for it again, for ever); what has not started waits
    w = World(SlowSwarm(delay=0.2))
    nodes = [w.machine(n, worker=False) for n in range(1, 21)]
    actions = [NodeUpdate(node, "empty", NodeMarks(empty_since=1.0)) for node, _ in nodes]
    started = time.perf_counter()
    outcomes = await w.act(*actions, concurrency=2, deadline=0.5)
    elapsed = time.perf_counter() - started
    done = [o for o in outcomes if o.ok]
    left = [o for o in outcomes if o.kind == "deadline"]
    assert 2 <= len(done) <= 6 and len(done) + len(left) == 20
    assert all("before it ran" in o.detail for o in left)  # none was cut short
    assert elapsed < 0.5 + 0.2 + 0.2  # the last one started before the deadline, then finished
    swarm = w.swarm
    assert isinstance(swarm, SlowSwarm)
    await asyncio.sleep(0.3)
    assert swarm.in_flight == 0 and swarm.updates_done == len(done)  # nothing started after the deadline


async def test_a_step_still_running_one_deadline_later_is_cut() -> None:
    w = World(SlowSwarm(delay=2.0))
    node, _ = w.machine(1, worker=False)
    started = time.perf_counter()
    outcomes = await w.act(NodeUpdate(node, "empty", NodeMarks(empty_since=1.0)), deadline=0.2)
    assert time.perf_counter() - started < 0.2 * 2 + 0.3  # the hard stop: one deadline past the deadline
    assert outcomes[0].kind == "deadline" and "hard stop" in outcomes[0].detail


async def test_a_drain_running_at_the_deadline_finishes_with_its_marks() -> None:
    w = World(SlowSwarm(delay=0.15))
    node, host = w.machine(1)
    outcomes = await w.act(
        DrainNode(node, host, "empty", (NodeOurs(node),), NodeMarks(empty_since=1.0)),
        deadline=0.2,
    )
    assert [o.ok for o in outcomes] == [True]  # one job: the marks, then the drain, past the deadline
    assert w.swarm.nodes[node].availability == "drain"


async def test_losing_leadership_cancels_what_has_not_started() -> None:
    w = World()
    node, host = w.machine(1)
    leader = [True]

    class LosingCloud(FakeCloud):
        async def launch(  # type: ignore[override]
            self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
        ) -> object:
            leader[0] = False  # the lock is lost while the launch runs
            return await super().launch(type_name, count, labels, pool)

    cloud = LosingCloud(w.clock, CATALOGUE)
    outcomes = await act(
        Plan((Launch("m5.large", 1, "pending"), DrainNode(node, host, "empty", expect=(NodeOurs(node),)))),
        w.snapshot(),
        Ports(cloud, w.swarm, w.workload),
        lambda: leader[0],
    )
    assert outcomes[0].ok and outcomes[1].kind == "cancelled"
    assert w.swarm.nodes[node].availability == "active"


async def test_a_fresh_read_that_hangs_leaves_the_disruptive_actions_to_the_next_tick() -> None:
    w = World()
    node, host = w.machine(1)

    class HangingWorkload(FakeWorkload):
        async def list_workers(self) -> tuple[Worker, ...]:
            await asyncio.sleep(3600)
            return ()

    ports = Ports(w.cloud, w.swarm, HangingWorkload(workers=list(w.workload.workers)))
    started = time.perf_counter()
    (outcome,) = await act(
        Plan((DrainNode(node, host, "empty", expect=(NodeOurs(node),)),)),
        w.snapshot(),
        ports,
        config=ActConfig(CLUSTER, deadline=0.3),
    )
    assert outcome.kind == "deadline" and time.perf_counter() - started < 1.0
    assert w.swarm.nodes[node].availability == "active"


async def test_a_termination_batch_in_flight_at_the_deadline_runs_to_its_end() -> None:
    w = World()
    node, _ = w.machine(1, worker=False)

    class SlowTerminate(FakeCloud):
        async def terminate(self, instance_ids: Sequence[str]) -> None:
            await asyncio.sleep(0.5)
            await super().terminate(instance_ids)

    cloud = SlowTerminate(w.clock, CATALOGUE)
    cloud.instances = dict(w.cloud.instances)
    (outcome,) = await act(
        Plan((Terminate(("i-0001",), "drained", node_ids=(node,), expect=(NodeOurs(node),)),)),
        w.snapshot(),
        Ports(cloud, w.swarm, w.workload),
        config=ActConfig(CLUSTER, deadline=0.2),
    )
    assert outcome.ok and "i-0001" not in cloud.instances and node not in w.swarm.nodes


async def test_a_machine_given_notice_before_its_node_joined_is_labelled_drained_and_terminated() -> None:
    """EC2 gave notice, then the node joined without the ownership label. The plan labels it and drains
    and terminates the machine (each on `NodeOurs`); the label is written first, so the drain and the
    termination land on the same tick. Held back with the drain, the label was never written and the
    machine never let go (found by a fresh-clone run: skipped on every tick)."""
    from swarm_autoscaler.core.plan import plan

    w = World()
    _, host = w.machine(1, labels={})  # joined, not labelled yet
    inst = w.cloud.instances["i-0001"]
    w.cloud.instances[inst.id] = dataclasses.replace(
        inst, labels={OWNERSHIP_LABEL: CLUSTER, TYPE_LABEL: "m5.large"}, interrupted_at=w.clock.now - 5
    )
    snapshot = w.snapshot()
    planned = plan(snapshot, small_policy(max_instances=4))
    outcomes = await act(planned, snapshot, w.ports, config=ActConfig(CLUSTER))
    by_kind = {type(o.action).__name__: o for o in outcomes}
    assert {"NodeUpdate", "DrainNode", "Terminate"} <= set(by_kind), outcomes
    assert all(by_kind[k].ok for k in ("NodeUpdate", "DrainNode", "Terminate")), outcomes
    assert terminated(w) == ["i-0001"], host
