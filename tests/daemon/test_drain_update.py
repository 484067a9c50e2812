"""A drain is ONE node update: its marks and its availability written together, through the project's real
swarm adapter (aiodocker over HTTP) against the Docker Engine API imitation (`localcloud/dockerapi.py`),
which stands in for dockerd's `POST /nodes/{id}/update` and counts every update it is sent. Before, a
drain was two updates (its marks, then its availability): each a read and a versioned write, and a failure
in between left a node marked drained that was not. The guard a drain passes (the chaos world's check that
no busy node is drained) still sees it, before it takes effect."""

from __future__ import annotations

from tests.daemon.test_act import World

from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.core.actions import DrainNode, HostIdle, NodeOurs, Plan
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Availability, Node, NodeMarks
from swarm_autoscaler.daemon.act import ActConfig, Ports, act
from swarm_autoscaler_lab.localcloud.dockerapi import DockerApi

CLUSTER = "test"


def updates(world: World) -> int:
    return sum(1 for kind, _ in world.swarm.calls if kind == "update")


async def test_a_drain_with_marks_is_one_node_update_through_the_real_adapter() -> None:
    w = World()
    node_id, host = w.machine(1, labels={OWNERSHIP_LABEL: CLUSTER}, worker=False)
    guarded: list[tuple[str, str, Availability]] = []

    async def guard(kind: str, node: Node) -> None:
        guarded.append((kind, node.hostname, node.availability))

    marks = NodeMarks(ready=True, drained_since=w.clock.now)
    drain = DrainNode(node_id, host, "empty", (HostIdle(host), NodeOurs(node_id)), marks)
    async with (
        DockerApi(w.swarm, guard=guard) as api,
        SwarmOrchestrator(api.url, cluster_name=CLUSTER) as orch,
    ):
        ports = Ports(w.cloud, orch, w.workload)
        (outcome,) = await act(Plan(actions=(drain,)), w.snapshot(), ports, config=ActConfig(CLUSTER))
    assert outcome.ok, outcome.detail
    node = w.swarm.nodes[node_id]
    assert (node.availability, node.marks) == (Availability.DRAIN, marks)
    assert updates(w) == 1  # marks and availability in one versioned write
    assert guarded == [("drain", host, Availability.ACTIVE)]  # checked before it took effect
    assert node.labels[OWNERSHIP_LABEL] == CLUSTER  # the write kept the node's other labels


async def test_a_drain_whose_marks_need_no_write_sets_only_the_availability() -> None:
    w = World()
    node_id, host = w.machine(2, worker=False)
    drain = DrainNode(node_id, host, "EC2 takes it back", (NodeOurs(node_id),))  # no marks: unchanged
    async with DockerApi(w.swarm) as api, SwarmOrchestrator(api.url, cluster_name=CLUSTER) as orch:
        ports = Ports(w.cloud, orch, w.workload)
        (outcome,) = await act(Plan(actions=(drain,)), w.snapshot(), ports, config=ActConfig(CLUSTER))
    assert outcome.ok and outcome.detail == "drained"
    assert w.swarm.nodes[node_id].availability == Availability.DRAIN and updates(w) == 1
    assert w.swarm.nodes[node_id].marks == NodeMarks()


async def test_a_skipped_drain_writes_neither_its_marks_nor_its_availability() -> None:
    w = World()
    node_id, host = w.machine(3)
    w.workload.workers = [World.worker(3, tasks=1)]  # its worker got a task since the plan
    marks = NodeMarks(ready=True, drained_since=w.clock.now)
    snapshot = w.snapshot()
    drain = DrainNode(node_id, host, "empty", (HostIdle(host), NodeOurs(node_id)), marks)
    async with DockerApi(w.swarm) as api, SwarmOrchestrator(api.url, cluster_name=CLUSTER) as orch:
        ports = Ports(w.cloud, orch, w.workload)
        (outcome,) = await act(Plan(actions=(drain,)), snapshot, ports, config=ActConfig(CLUSTER))
    assert outcome.kind == "skipped" and updates(w) == 0
    assert w.swarm.nodes[node_id].availability == Availability.ACTIVE
