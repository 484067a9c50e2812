"""Contract tests of `SwarmOrchestrator` against a real local docker swarm (see conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.core import ports
from swarm_autoscaler.core.model import Availability, Node, NodeMarks, NodeStatus
from swarm_autoscaler.errors import EndpointError, NotFoundError
from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm

pytestmark = pytest.mark.swarm

MANAGER = "ip-10-0-0-1"  # the nodes conftest.py starts
WORKERS = ("ip-10-0-0-2", "ip-10-0-0-3")


def processes_naming(folder: Path) -> list[str]:
    """pids of live processes whose command line names `folder` (a node's dockerd and containerd)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(folder).encode() in (proc / "cmdline").read_bytes():
                found.append(proc.name)
        except OSError:
            continue
    return found


async def node_named(orch: SwarmOrchestrator, hostname: str) -> Node:
    nodes = [n for n in await orch.list_nodes() if n.hostname == hostname]
    assert len(nodes) == 1, f"{hostname}: {nodes}"
    return nodes[0]


def version_of(swarm: LocalSwarm, node_id: str) -> int:
    return int(swarm.manager.docker_sync("node", "inspect", "--format", "{{.Version.Index}}", node_id))


def mounts_under(folder: Path) -> list[str]:
    return [line for line in Path("/proc/self/mounts").read_text().splitlines() if str(folder) in line]


class RacingOrchestrator(SwarmOrchestrator):
    """Someone else updates the node (a label, through the docker CLI) right after each of the first
    `races` reads, so the write that follows carries a stale version."""

    def __init__(self, swarm: LocalSwarm, races: int, **kwargs: Any) -> None:
        super().__init__(swarm.manager_url, **kwargs)
        self.swarm = swarm
        self.races = races
        self.reads = 0

    async def _read_node(self, node_id: str) -> Mapping[str, Any]:
        raw = await super()._read_node(node_id)
        self.reads += 1
        if self.reads <= self.races:
            await self.swarm.manager.docker("node", "update", "--label-add", f"race={self.reads}", node_id)
        return raw


async def test_lists_every_node_with_hostname_role_and_state(local_swarm: LocalSwarm) -> None:
    async with SwarmOrchestrator(local_swarm.manager_url) as orch:
        assert isinstance(orch, ports.Orchestrator)
        nodes = await orch.list_nodes()
    by_host = {n.hostname: n for n in nodes}
    assert set(by_host) >= {MANAGER, *WORKERS}
    assert by_host[MANAGER].is_manager
    assert not any(by_host[h].is_manager for h in WORKERS)
    for host in (MANAGER, *WORKERS):
        assert by_host[host].status is NodeStatus.READY
        assert by_host[host].availability is Availability.ACTIVE
    assert len({n.id for n in nodes}) == len(nodes)


async def test_marks_and_extra_labels_round_trip(local_swarm: LocalSwarm) -> None:
    marks = NodeMarks(
        ready=True, empty_since=1_700_000_000.25, drained_since=1_700_000_100.5, down_since=None
    )
    async with SwarmOrchestrator(local_swarm.manager_url) as orch:
        node = await node_named(orch, WORKERS[0])
        await orch.add_labels(node.id, {"instance-type": "t3.small", "zone": "eu-west-1a"})
        await orch.mark(node.id, marks)
        seen = await node_named(orch, WORKERS[0])
        assert seen.marks == marks
        assert seen.labels["instance-type"] == "t3.small"
        assert seen.labels["swarm-autoscaler.ready"] == "true"
        assert "swarm-autoscaler.down-since" not in seen.labels

        version = version_of(local_swarm, node.id)
        await orch.mark(node.id, marks)  # idempotent: nothing changes, nothing is written
        assert version_of(local_swarm, node.id) == version

        await orch.mark(node.id, NodeMarks())
        cleared = await node_named(orch, WORKERS[0])
    assert cleared.marks == NodeMarks()
    assert not [k for k in cleared.labels if k.startswith("swarm-autoscaler.")]
    assert cleared.labels["zone"] == "eu-west-1a"


async def test_a_node_is_ours_only_once_it_carries_our_cluster_label(local_swarm: LocalSwarm) -> None:
    async with SwarmOrchestrator(local_swarm.manager_url, cluster_name="own-test") as orch:
        node = await node_named(orch, WORKERS[1])
        await orch.add_labels(node.id, {"instance-type": "m5.large"})  # a user's placement label
        assert not (await node_named(orch, WORKERS[1])).ours
        await orch.add_labels(
            node.id, {ports.OWNERSHIP_LABEL: "own-test"}
        )  # what a NodeUpdate writes on join
        await orch.mark(node.id, NodeMarks(ready=True))  # marks keep the ownership label
        seen = await node_named(orch, WORKERS[1])
        assert seen.ours and seen.labels[ports.OWNERSHIP_LABEL] == "own-test"
        assert not (await node_named(orch, MANAGER)).ours
    async with SwarmOrchestrator(local_swarm.manager_url, cluster_name="another") as other:
        assert not (await node_named(other, WORKERS[1])).ours  # another cluster's daemon leaves it alone
    await local_swarm.manager.docker("node", "update", "--label-rm", ports.OWNERSHIP_LABEL, node.id)


async def test_custom_label_prefix(local_swarm: LocalSwarm) -> None:
    async with SwarmOrchestrator(local_swarm.manager_url, label_prefix="acme/") as orch:
        node = await node_named(orch, WORKERS[1])
        await orch.mark(node.id, NodeMarks(termination_started=1_700_000_500.0))
        seen = await node_named(orch, WORKERS[1])
        await orch.mark(node.id, NodeMarks())
    assert seen.labels["acme/termination-started"] == "1700000500.0"
    assert seen.marks == NodeMarks(termination_started=1_700_000_500.0)


async def test_garbled_mark_labels_read_as_absent(local_swarm: LocalSwarm) -> None:
    async with SwarmOrchestrator(local_swarm.manager_url) as orch:
        node = await node_named(orch, WORKERS[1])
        garbled = {
            "swarm-autoscaler.ready": "maybe",
            "swarm-autoscaler.empty-since": "yesterday",
            "swarm-autoscaler.down-since": "nan",
            "swarm-autoscaler.termination-started": "",
            "swarm-autoscaler.drained-since": "1700000000",
        }
        args = [a for k, v in garbled.items() for a in ("--label-add", f"{k}={v}")]
        await local_swarm.manager.docker(
            "node", "update", *args, node.id
        )  # written behind the adapter's back
        seen = await node_named(orch, WORKERS[1])
        await orch.mark(node.id, NodeMarks())
    assert seen.marks == NodeMarks(drained_since=1_700_000_000.0)


async def test_drain_and_activate_round_trip(local_swarm: LocalSwarm) -> None:
    async with SwarmOrchestrator(local_swarm.manager_url) as orch:
        node = await node_named(orch, WORKERS[0])
        await orch.set_availability(node.id, Availability.DRAIN)
        assert (await node_named(orch, WORKERS[0])).availability is Availability.DRAIN
        await orch.set_availability(node.id, Availability.DRAIN)  # idempotent
        assert (await node_named(orch, WORKERS[0])).availability is Availability.DRAIN
        await orch.set_availability(node.id, Availability.ACTIVE)
        assert (await node_named(orch, WORKERS[0])).availability is Availability.ACTIVE


class CountingOrchestrator(SwarmOrchestrator):
    """The adapter, counting the node reads it makes (one per versioned write it sends)."""

    reads = 0

    async def _read_node(self, node_id: str) -> Mapping[str, Any]:
        self.reads += 1
        return await super()._read_node(node_id)


async def test_a_drain_with_its_marks_is_one_node_update(local_swarm: LocalSwarm) -> None:
    """What act sends for a DrainNode that carries marks: dockerd takes marks and availability in one
    node spec (one read, one versioned write)."""
    marks = NodeMarks(ready=True, drained_since=1_700_000_100.0)
    async with CountingOrchestrator(local_swarm.manager_url) as orch:
        node = await node_named(orch, WORKERS[0])
        await orch.mark(node.id, marks, None, Availability.DRAIN)
        writes = orch.reads
        seen = await node_named(orch, WORKERS[0])
        await orch.mark(node.id, NodeMarks(), None, Availability.ACTIVE)
        back = await node_named(orch, WORKERS[0])
    assert (seen.availability, seen.marks, writes) == (Availability.DRAIN, marks, 1)
    assert (back.availability, back.marks) == (Availability.ACTIVE, NodeMarks())


async def test_stale_version_is_reread_and_retried(local_swarm: LocalSwarm) -> None:
    orch = RacingOrchestrator(local_swarm, races=2)
    async with orch:
        node = await node_named(orch, WORKERS[1])
        await orch.set_availability(node.id, Availability.DRAIN)
        assert orch.reads == 3  # two writes refused as out of sequence, the third went through
        seen = await node_named(orch, WORKERS[1])
        await orch.set_availability(node.id, Availability.ACTIVE)
    assert seen.availability is Availability.DRAIN
    assert seen.labels["race"] == "2"  # the concurrent update was kept, not overwritten


async def test_stale_version_gives_up_after_the_attempts(local_swarm: LocalSwarm) -> None:
    orch = RacingOrchestrator(local_swarm, races=10, update_attempts=2)
    async with orch:
        node = await node_named(orch, WORKERS[1])
        with pytest.raises(EndpointError, match="kept changing"):
            await orch.mark(node.id, NodeMarks(ready=True))
        assert not (await node_named(orch, WORKERS[1])).marks.ready
    assert orch.reads == 2


async def test_missing_node_raises_not_found(local_swarm: LocalSwarm) -> None:
    async with SwarmOrchestrator(local_swarm.manager_url) as orch:
        with pytest.raises(NotFoundError):
            await orch.set_availability("nosuchnode0000000000000000", Availability.DRAIN)
        with pytest.raises(NotFoundError):
            await orch.mark("nosuchnode0000000000000000", NodeMarks(ready=True))


async def test_join_command_lets_a_new_node_join(local_swarm: LocalSwarm) -> None:
    async with SwarmOrchestrator(local_swarm.manager_url) as orch:
        token, manager_addr = await orch.join_command()
        assert manager_addr == local_swarm.manager_addr
        assert token.startswith("SWMTKN-")
        node = await local_swarm.add_node("ip-10-0-0-4")
        try:
            await node.join(token, manager_addr)
            await local_swarm.wait_nodes(["ip-10-0-0-4"])
            joined = await node_named(orch, "ip-10-0-0-4")
            assert joined.status is NodeStatus.READY
            assert not joined.is_manager
        finally:
            await local_swarm.stop_node("ip-10-0-0-4")
        await orch.remove(joined.id)


async def test_remove_a_node_that_left_and_again(local_swarm: LocalSwarm) -> None:
    node = await local_swarm.add_node("ip-10-0-0-5")
    await node.join(local_swarm.worker_token, local_swarm.manager_addr)
    await local_swarm.wait_nodes(["ip-10-0-0-5"])
    async with SwarmOrchestrator(local_swarm.manager_url) as orch:
        gone = await node_named(orch, "ip-10-0-0-5")
        await local_swarm.stop_node("ip-10-0-0-5")
        assert processes_naming(node.folder) == []
        assert mounts_under(node.folder) == []
        await local_swarm.wait_nodes(["ip-10-0-0-5"], status="down", timeout=30)
        await orch.remove(gone.id)
        assert gone.id not in {n.id for n in await orch.list_nodes()}
        await orch.remove(gone.id)  # already gone: success
        await asyncio.gather(orch.remove(gone.id), orch.remove(gone.id))


async def test_unreachable_engine_raises_endpoint_error(tmp_path: Path) -> None:
    async with SwarmOrchestrator(f"unix://{tmp_path}/no.sock", timeout=5) as orch:
        with pytest.raises(EndpointError, match=r"no\.sock"):
            await orch.list_nodes()
        with pytest.raises(EndpointError):
            await orch.join_command()


class ManagerReadsCounting(SwarmOrchestrator):
    """The adapter, counting its reads of the managers."""

    reads = 0

    async def _read_managers(self) -> list[Mapping[str, Any]]:
        self.reads += 1
        return await super()._read_managers()


async def test_manager_addresses_are_the_advertised_ones_read_with_the_join_command(
    local_swarm: LocalSwarm,
) -> None:
    """What `AUTOSCALER_EC2_JOIN_URL=auto` names: each manager's `ManagerStatus.Addr`, the address it
    advertises (the one `join_command` hands workers), from the read that `join_command` made just
    before (one managers list for a launch's user data); a later ask reads again."""
    async with ManagerReadsCounting(local_swarm.manager_url) as orch:
        _, manager = await orch.join_command()
        addresses = await orch.manager_addresses()
        assert orch.reads == 1
        orch._managers = (orch._managers[0] - 60.0, orch._managers[1])  # that read, a minute old
        assert await orch.manager_addresses() == addresses
        assert orch.reads == 2
        seen = (await node_named(orch, MANAGER)).address  # what `auto` does not use, for comparison
    print(f"manager {MANAGER}: ManagerStatus.Addr {manager}, Status.Addr {seen}")
    assert addresses == (local_swarm.manager_addr,) == (manager,)
