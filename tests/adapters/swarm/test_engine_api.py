"""The real swarm adapter (aiodocker over HTTP) against the local cloud's Docker Engine API imitation,
which serves the in-memory swarm: what the act benchmark and the stop test rely on."""

from __future__ import annotations

import asyncio

from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.core import ports
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Availability, NodeMarks
from swarm_autoscaler.localcloud.engine_api import EngineApi
from swarm_autoscaler.localcloud.memswarm import MemorySwarm


async def test_the_adapter_reads_ownership_and_writes_marks_through_the_engine_api() -> None:
    swarm = MemorySwarm(cluster_name="c1")
    ours = swarm.join("ip-10-0-0-1", swarm.join_token, {OWNERSHIP_LABEL: "c1"})
    theirs = swarm.join("ip-10-0-0-2", swarm.join_token, {"instance-type": "m5.large"})
    async with EngineApi(swarm) as api, SwarmOrchestrator(api.url, cluster_name="c1") as orch:
        assert isinstance(orch, ports.Orchestrator)
        listed = {n.hostname: n for n in await orch.list_nodes()}
        assert listed["ip-10-0-0-1"].ours and not listed["ip-10-0-0-2"].ours
        await orch.mark(ours.id, NodeMarks(ready=True, empty_since=5.0))
        await orch.set_availability(ours.id, Availability.DRAIN)
        await orch.add_labels(theirs.id, {OWNERSHIP_LABEL: "c1"})  # what LabelNode does when a machine joins
        listed = {n.hostname: n for n in await orch.list_nodes()}
        assert listed["ip-10-0-0-1"].marks == NodeMarks(ready=True, empty_since=5.0)
        assert listed["ip-10-0-0-1"].availability is Availability.DRAIN
        assert listed["ip-10-0-0-1"].labels[OWNERSHIP_LABEL] == "c1"  # marks never clear the ownership label
        assert listed["ip-10-0-0-2"].ours
        assert await orch.join_command() == (swarm.join_token, swarm.manager_address)
        await orch.remove(ours.id)
        await orch.remove(ours.id)  # already gone counts as success
        assert [n.hostname for n in await orch.list_nodes()] == ["ip-10-0-0-2"]


async def test_concurrent_updates_of_one_node_are_retried_until_each_lands() -> None:
    swarm = MemorySwarm(cluster_name="c1")
    node = swarm.join("ip-10-0-0-1", swarm.join_token, {OWNERSHIP_LABEL: "c1"})
    async with EngineApi(swarm, latency=0.01) as api, SwarmOrchestrator(api.url, cluster_name="c1") as orch:
        # Six writers read the same version; docker-style, all but one are refused and re-read.
        await asyncio.gather(*(orch.add_labels(node.id, {f"k{i}": "v"}) for i in range(6)))
        (seen,) = await orch.list_nodes()
        refused = api.out_of_sequence
    assert {f"k{i}" for i in range(6)} <= set(seen.labels)
    assert sum(1 for kind, _ in swarm.calls if kind == "update") == 6
    assert refused > 0  # the race happened, and every loser re-read and retried
