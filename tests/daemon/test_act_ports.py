"""act() through the ports (mutation-testing guards; tests/daemon/test_act.py covers the re-checks,
concurrency and deadline): each action reaches the right port with the right node or instance, and every failure comes
back as an Outcome of the right kind. Over the in-memory fakes of the ports.

Mutation testing found the act path unguarded: deleting the DrainNode, RemoveNode or ActivateNode case,
or removing a terminated machine's node by the wrong id, left every loop test green.
"""

from __future__ import annotations

from tests.fakes import CATALOGUE, FakeCloud, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.core.actions import (
    ActivateNode,
    DrainNode,
    Launch,
    NodeUpdate,
    Plan,
    RemoveNode,
    RetireWorkers,
    Terminate,
)
from swarm_autoscaler.core.model import (
    GIB,
    Availability,
    NodeMarks,
    Resources,
    Snapshot,
    Task,
    Unavailable,
    Worker,
)
from swarm_autoscaler.core.ports import LaunchResult
from swarm_autoscaler.daemon.tick import ObserveError, Ports, act, observe, run_tick
from swarm_autoscaler.errors import LockLostError
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm


class World:
    """A cloud with two running instances whose nodes joined (the second drained), and their workers."""

    def __init__(self) -> None:
        self.clock = SteppedClock()
        self.cloud = FakeCloud(self.clock, CATALOGUE)
        self.swarm = MemorySwarm()
        self.workload = FakeWorkload()
        self.ports = Ports(self.cloud, self.swarm, self.workload)

    async def machines(self, count: int = 2) -> list[str]:
        """Launch and join `count` machines; returns their node ids."""
        result = await self.cloud.launch("m5.large", count, {"instance-type": "m5.large"})
        ids = []
        for inst in result.instances:
            node = self.swarm.join(inst.hostname, self.swarm.join_token)
            ids.append(node.id)
            worker = Worker(
                f"tcp://{inst.hostname}:8786", inst.hostname, inst.hostname, Resources(2, 8 * GIB)
            )
            self.workload.workers.append(worker)
        return ids

    async def snapshot(self) -> Snapshot:
        return await observe(self.ports, CATALOGUE, self.clock())


async def test_node_actions_reach_the_node_they_name() -> None:
    world = World()
    first, second = await world.machines()
    plan = Plan(
        (
            DrainNode(first, "h1", "empty"),
            ActivateNode(second, "h2", "work"),
            NodeUpdate(second, "why", NodeMarks(ready=True), (("zone", "a"),)),
        )
    )
    await world.swarm.set_availability(second, Availability.DRAIN)
    outcomes = await act(plan, await world.snapshot(), world.ports)
    assert [(o.ok, o.detail) for o in outcomes] == [
        (True, "drained"),
        (True, "activated"),
        (True, "marked and labelled"),  # ONE node update for the node's marks and labels
    ]
    nodes = world.swarm.nodes
    assert nodes[first].availability == Availability.DRAIN
    assert nodes[second].availability == Availability.ACTIVE
    assert nodes[second].marks == NodeMarks(ready=True)
    assert nodes[second].labels["zone"] == "a"


async def test_remove_and_terminate_take_away_exactly_the_named_node_and_instance() -> None:
    world = World()
    first, second, third = await world.machines(3)
    snapshot = await world.snapshot()
    victim = next(i.id for i in snapshot.instances if world.swarm.by_hostname(i.hostname).id == second)  # type: ignore[union-attr]
    plan = Plan((RemoveNode(first, "h1", "gone"), Terminate((victim,), "surplus", (second,))))
    outcomes = await act(plan, snapshot, world.ports)
    assert [(o.ok, o.detail) for o in outcomes] == [
        (True, "removed"),
        (
            True,
            "terminated (one call for 1 instance(s)); removed 1 node(s); 1 host(s) fenced first, 1 worker(s) there",
        ),
    ]
    assert set(world.swarm.nodes) == {third}
    assert victim not in world.cloud.instances and len(world.cloud.instances) == 2


async def test_a_worker_the_scheduler_kept_is_named_in_the_outcome() -> None:
    world = World()
    await world.machines(2)
    addresses = tuple(w.address for w in world.workload.workers)
    world.workload.keep_on_retire = {addresses[1]}
    [outcome] = await act(Plan((RetireWorkers(addresses, "idle"),)), await world.snapshot(), world.ports)
    assert outcome.ok and outcome.detail == f"retired 1; scheduler kept {addresses[1]} (set running again)"
    world.workload.keep_on_retire = set(addresses)
    [outcome] = await act(Plan((RetireWorkers(addresses, "idle"),)), await world.snapshot(), world.ports)
    assert outcome.detail == f"retired 0; scheduler kept {', '.join(sorted(addresses))} (set running again)"


async def test_launch_failures_are_outcomes_of_their_kind() -> None:
    world = World()
    [done] = await act(Plan((Launch("m5.large", 2, "work"),)), await world.snapshot(), world.ports)
    assert done.ok and done.detail == f"launched 2: {', '.join(world.cloud.instances)}"
    world.cloud.refuse_types = {"m5.xlarge"}
    [refused] = await act(Plan((Launch("m5.xlarge", 1, "work"),)), await world.snapshot(), world.ports)
    assert (refused.ok, refused.kind, refused.detail) == (
        False,
        "capacity",
        "launched 0/1; no capacity for m5.xlarge",
    )

    async def partial(type_name: str, count: int, labels: object) -> LaunchResult:
        return LaunchResult(refused=(Unavailable(type_name, 0.0, "subnet-a"),), error="bad AMI")

    world.cloud.launch = partial  # type: ignore[method-assign,assignment]
    [error] = await act(Plan((Launch("m5.large", 1, "work"),)), await world.snapshot(), world.ports)
    assert (error.ok, error.kind, error.detail) == (False, "error", "launched 0/1: bad AMI")

    async def all_but_refused(type_name: str, count: int, labels: object) -> LaunchResult:
        return LaunchResult(refused=(Unavailable(type_name, 0.0, "subnet-a"),))

    world.cloud.launch = all_but_refused  # type: ignore[method-assign,assignment]
    [none_asked] = await act(Plan((Launch("m5.large", 0, "work"),)), await world.snapshot(), world.ports)
    assert none_asked.ok, "a refusal while every asked instance launched is no failure"


async def test_a_mark_on_a_node_missing_from_the_snapshot_is_an_error_outcome() -> None:
    world = World()
    [outcome] = await act(
        Plan((NodeUpdate("node9999", "why", NodeMarks(ready=True)),)), await world.snapshot(), world.ports
    )
    assert (outcome.ok, outcome.kind, outcome.detail) == (False, "error", "node node9999 not in the snapshot")


async def test_an_observe_failure_names_each_source_and_its_error() -> None:
    world = World()
    world.cloud.fail_list = RuntimeError("ec2 down")
    world.workload.fail_observe = ValueError("scheduler gone")
    try:
        await world.snapshot()
    except ObserveError as exc:
        message = str(exc)
    else:
        raise AssertionError("observe should have failed")
    prefix = "observe failed, acting on nothing this tick: "
    assert message.startswith(prefix)
    assert set(message.removeprefix(prefix).split("; ")) == {
        "RuntimeError: ec2 down",
        "ValueError: scheduler gone",
    }


async def test_observe_carries_capacity_refusals_and_the_scheduler_queue_into_the_snapshot() -> None:
    """Without them the plan would relaunch a refused type every tick, and buy nothing for tasks the
    scheduler holds back."""
    world = World()
    world.cloud.refuse_types = {"m5.xlarge"}
    await world.cloud.launch("m5.xlarge", 1, {})
    world.workload.queued.append(Task("q", Resources(1, GIB)))
    snapshot = await world.snapshot()
    assert snapshot.unavailable == (Unavailable("m5.xlarge", world.clock() + 30.0),)
    assert snapshot.queued == (Task("q", Resources(1, GIB)),)


async def test_an_action_act_does_not_know_is_an_error_outcome_not_a_crash() -> None:
    world = World()
    stranger = object()
    [outcome] = await act(Plan((stranger,)), await world.snapshot(), world.ports)  # type: ignore[arg-type]
    assert (outcome.ok, outcome.kind, outcome.detail) == (False, "error", f"unknown action {stranger!r}")


async def test_a_tick_acts_by_default_and_a_follower_only_plans() -> None:
    world = World()
    world.workload.unrunnable.append(Task("t", Resources(1, GIB)))
    follower = await run_tick(world.ports, small_policy(3), CATALOGUE, world.clock(), leader=False)
    assert (follower.acted, follower.outcomes, follower.policy) == (False, (), small_policy(3))
    assert follower.snapshot.unrunnable == (Task("t", Resources(1, GIB)),)
    assert follower.plan.of_kind(Launch) and not world.cloud.instances
    leader = await run_tick(world.ports, small_policy(3), CATALOGUE, world.clock())
    assert leader.acted and [o.ok for o in leader.outcomes] == [True] and len(world.cloud.instances) == 1


async def test_once_leadership_is_lost_every_remaining_action_is_cancelled_and_reported() -> None:
    world = World()
    first, second = await world.machines()
    checks = iter((True,))  # leader for the first action only (gentle actions run first)
    plan = Plan(
        (ActivateNode(first, "h1", "w"), DrainNode(first, "h1", "empty"), DrainNode(second, "h2", "empty"))
    )
    outcomes = await act(plan, await world.snapshot(), world.ports, still_leader=lambda: next(checks, False))
    assert [(o.ok, o.detail, o.kind) for o in outcomes] == [
        (True, "activated", ""),
        (False, "leadership lost; cancelled", "cancelled"),
        (False, "leadership lost; cancelled", "cancelled"),
    ]
    assert world.swarm.nodes[second].availability == Availability.ACTIVE


async def test_a_lock_lost_inside_a_port_cancels_that_action_and_the_next_ones_still_run() -> None:
    world = World()
    first, second = await world.machines()

    async def lost(node_id: str, availability: Availability) -> None:
        raise LockLostError("lock taken by replica b")

    real = world.swarm.set_availability
    world.swarm.set_availability = lost  # type: ignore[method-assign]
    plan = Plan((DrainNode(first, "h1", "empty"), RemoveNode(second, "h2", "gone")))
    outcomes = await act(plan, await world.snapshot(), world.ports)
    world.swarm.set_availability = real  # type: ignore[method-assign]
    assert [(o.action, o.ok, o.detail, o.kind) for o in outcomes] == [
        (plan.actions[0], False, "lock taken by replica b", "cancelled"),
        (plan.actions[1], True, "removed", ""),
    ]


async def test_a_refused_action_keeps_its_kind_and_an_unexpected_error_its_type() -> None:
    world = World()
    [first] = await world.machines(1)
    world.cloud.refuse_types = {"m5.xlarge"}

    async def broken(node_id: str) -> None:
        raise OSError("socket closed")

    world.swarm.remove = broken  # type: ignore[method-assign]
    plan = Plan((Launch("m5.xlarge", 1, "w"), RemoveNode(first, "h1", "gone")))
    outcomes = await act(plan, await world.snapshot(), world.ports)
    assert [(o.action, o.ok, o.kind, o.action_kind) for o in outcomes] == [
        (plan.actions[0], False, "capacity", "Launch"),
        (plan.actions[1], False, "error", "RemoveNode"),
    ]
    assert outcomes[1].detail == "OSError: socket closed"
