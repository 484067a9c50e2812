"""The Docker Engine API imitation, driven by the project's real aiodocker adapter over HTTP (loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.core.model import Availability, Node, NodeMarks, NodeStatus
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.localcloud.dockerapi import DockerApi
from swarm_autoscaler.localcloud.memswarm import MemorySwarm


class Served:
    def __init__(self, conflict_rate: float = 0.0) -> None:
        self.swarm = MemorySwarm()
        self.guarded: list[tuple[str, str, Availability]] = []
        self.api = DockerApi(self.swarm, guard=self._guard, conflict_rate=conflict_rate, seed=7)

    async def _guard(self, kind: str, node: Node) -> None:
        # Records what the node looked like at that moment: a drain is checked before it takes effect.
        self.guarded.append((kind, node.hostname, node.availability))


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[Served, SwarmOrchestrator]]:
    world = Served()
    url = await world.api.start()
    adapter = SwarmOrchestrator(url, update_attempts=3)
    try:
        yield world, adapter
    finally:
        await adapter.close()
        await world.api.close()


async def test_nodes_marks_and_labels_round_trip_through_the_real_adapter(
    served: tuple[Served, SwarmOrchestrator],
) -> None:
    world, adapter = served
    joined = world.swarm.join("ip-10-0-0-7", world.swarm.join_token)
    marks = NodeMarks(ready=True, empty_since=1_700_000_000.5)
    await adapter.mark(joined.id, marks)
    await adapter.add_labels(joined.id, {"instance-type": "m5.large"})
    nodes = {n.hostname: n for n in await adapter.list_nodes()}
    assert nodes["ip-10-0-255-1"].is_manager
    node = nodes["ip-10-0-0-7"]
    assert (node.marks, node.labels["instance-type"], node.status) == (marks, "m5.large", NodeStatus.READY)
    # The in-memory swarm keeps the marks apart from the labels, as the machines and guards read them.
    assert world.swarm.nodes[joined.id].marks == marks
    assert "swarm-autoscaler.ready" not in world.swarm.nodes[joined.id].labels
    assert await adapter.join_command() == (world.swarm.join_token, world.swarm.manager_address)


async def test_the_guard_sees_a_node_before_it_is_drained_or_removed(
    served: tuple[Served, SwarmOrchestrator],
) -> None:
    world, adapter = served
    node = world.swarm.join("ip-10-0-0-8", world.swarm.join_token)
    await adapter.set_availability(node.id, Availability.DRAIN)
    await adapter.set_availability(node.id, Availability.DRAIN)  # already drained: no second drain
    await adapter.remove(node.id)
    await adapter.remove(node.id)  # already gone counts as success, and nothing is checked
    assert world.guarded == [
        ("drain", "ip-10-0-0-8", Availability.ACTIVE),
        ("remove", "ip-10-0-0-8", Availability.DRAIN),
    ]
    assert world.swarm.nodes == {}


async def test_a_machine_side_change_moves_the_version() -> None:
    world = Served()
    node = world.swarm.join("ip-10-0-0-9", world.swarm.join_token)
    before = world.api.version_of(world.swarm.nodes[node.id])
    assert world.api.version_of(world.swarm.nodes[node.id]) == before
    world.swarm.set_status("ip-10-0-0-9", NodeStatus.DOWN)
    assert world.api.version_of(world.swarm.nodes[node.id]) > before


@pytest.mark.parametrize(("rate", "succeeds"), [(0.5, True), (1.0, False)])
async def test_updates_out_of_sequence_are_retried_by_the_adapter(rate: float, succeeds: bool) -> None:
    world = Served(conflict_rate=rate)
    url = await world.api.start()
    adapter = SwarmOrchestrator(url, update_attempts=8 if succeeds else 3)
    try:
        node = world.swarm.join("ip-10-0-0-10", world.swarm.join_token)
        if succeeds:
            await adapter.mark(node.id, NodeMarks(ready=True))
            assert world.swarm.nodes[node.id].marks.ready
        else:
            with pytest.raises(EndpointError, match="kept changing"):
                await adapter.mark(node.id, NodeMarks(ready=True))
            assert not world.swarm.nodes[node.id].marks.ready
        assert world.api.conflicts >= 1
    finally:
        await adapter.close()
        await world.api.close()


async def test_node_list_filters_as_docker_does(served: tuple[Served, SwarmOrchestrator]) -> None:
    world, adapter = served
    first = world.swarm.join("ip-10-0-0-11", world.swarm.join_token, {"swarm-autoscaler.cluster": "c1"})
    world.swarm.join("ip-10-0-0-12", world.swarm.join_token)
    docker = adapter._client()  # the adapter's own aiodocker client, to pass filters the port does not expose

    async def hostnames(**filters: object) -> list[str]:
        nodes = await docker.nodes.list(filters=filters)
        return sorted(n["Description"]["Hostname"] for n in nodes)

    assert await hostnames(role="manager") == ["ip-10-0-255-1"]
    assert await hostnames(role="worker") == ["ip-10-0-0-11", "ip-10-0-0-12"]
    assert await hostnames(id=first.id) == ["ip-10-0-0-11"]
    assert await hostnames(name="ip-10-0-0-12") == ["ip-10-0-0-12"]
    assert await hostnames(**{"node.label": "swarm-autoscaler.cluster=c1"}) == ["ip-10-0-0-11"]
    assert await hostnames(**{"node.label": "swarm-autoscaler.cluster=c2"}) == []
    assert await hostnames(role=["manager", "worker"], name="ip-10-0-0-11") == ["ip-10-0-0-11"]
