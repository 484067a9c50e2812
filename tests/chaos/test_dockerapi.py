"""The Docker Engine API imitation (`localcloud/dockerapi.py`), driven by the project's real aiodocker
adapter over HTTP (loopback): what the chaos world, the act benchmark and the stop test rely on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.core import ports
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Availability, Node, NodeMarks, NodeStatus
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler_lab.localcloud.dockerapi import DockerApi
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm


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
        assert world.api.out_of_sequence >= world.api.conflicts  # each one refused
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


async def test_the_adapter_reads_ownership_and_writes_marks_through_the_api() -> None:
    swarm = MemorySwarm(cluster_name="c1")
    ours = swarm.join("ip-10-0-0-1", swarm.join_token, {OWNERSHIP_LABEL: "c1"})
    theirs = swarm.join("ip-10-0-0-2", swarm.join_token, {"instance-type": "m5.large"})
    async with DockerApi(swarm) as api, SwarmOrchestrator(api.url, cluster_name="c1") as orch:
        assert isinstance(orch, ports.Orchestrator)
        listed = {n.hostname: n for n in await orch.list_nodes()}
        assert listed["ip-10-0-0-1"].ours and not listed["ip-10-0-0-2"].ours
        assert listed["ip-10-0-255-1"].is_manager and not listed["ip-10-0-255-1"].ours
        await orch.mark(ours.id, NodeMarks(ready=True, empty_since=5.0))
        await orch.set_availability(ours.id, Availability.DRAIN)
        await orch.add_labels(
            theirs.id, {OWNERSHIP_LABEL: "c1"}
        )  # what a NodeUpdate does when a machine joins
        listed = {n.hostname: n for n in await orch.list_nodes()}
        assert listed["ip-10-0-0-1"].marks == NodeMarks(ready=True, empty_since=5.0)
        assert listed["ip-10-0-0-1"].availability is Availability.DRAIN
        assert listed["ip-10-0-0-1"].labels[OWNERSHIP_LABEL] == "c1"  # marks never clear the ownership label
        assert listed["ip-10-0-0-2"].ours
        assert swarm.nodes[theirs.id].ours  # the in-memory swarm reads ownership from the labels too
        assert await orch.join_command() == (swarm.join_token, swarm.manager_address)
        await orch.remove(ours.id)
        await orch.remove(ours.id)  # already gone counts as success
        assert [n.hostname for n in await orch.list_nodes() if not n.is_manager] == ["ip-10-0-0-2"]
        with pytest.raises(EndpointError, match="node is a manager"):
            await orch.remove(listed["ip-10-0-255-1"].id)


async def test_concurrent_updates_of_one_node_are_retried_until_each_lands() -> None:
    swarm = MemorySwarm(cluster_name="c1")
    node = swarm.join("ip-10-0-0-1", swarm.join_token, {OWNERSHIP_LABEL: "c1"})
    async with DockerApi(swarm, latency=0.01) as api, SwarmOrchestrator(api.url, cluster_name="c1") as orch:
        # Six writers read the same version; docker-style, all but one are refused and re-read.
        await asyncio.gather(*(orch.add_labels(node.id, {f"k{i}": "v"}) for i in range(6)))
        (seen,) = [n for n in await orch.list_nodes() if not n.is_manager]
        refused = api.out_of_sequence
    assert {f"k{i}" for i in range(6)} <= set(seen.labels)
    assert sum(1 for kind, _ in swarm.calls if kind == "update") == 6
    assert refused > 0  # the race happened, and every loser re-read and retried
    assert api.conflicts == 0  # no simulated writer: the refusals were the real race


async def test_a_hung_write_is_seen_and_does_not_hold_the_shutdown() -> None:
    swarm = MemorySwarm()
    node = swarm.join("ip-10-0-0-13", swarm.join_token)
    api = DockerApi(swarm, write_latency=3600.0)
    async with api, SwarmOrchestrator(api.url, update_attempts=1) as orch:
        assert api.url.startswith("http://127.0.0.1:")
        assert await orch.list_nodes()  # reads are not delayed by write_latency
        assert api.writes_started == 0 and not api.write_seen.is_set()
        write = asyncio.create_task(orch.mark(node.id, NodeMarks(ready=True)))
        await asyncio.wait_for(api.write_seen.wait(), 10)
        assert api.writes_started == 1
        await asyncio.wait_for(api.close(), 10)  # cut after its shutdown timeout, not aiohttp's 60 s
        with pytest.raises(EndpointError):
            await asyncio.wait_for(write, 10)
    assert not swarm.nodes[node.id].marks.ready  # the hung update never landed
