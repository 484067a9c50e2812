"""A swarm kept in memory behind the Orchestrator port, for the demo on machines without docker and for
the loop's tests. It implements the same contract as the aiodocker adapter, including the lifecycle
marks and the "already gone" rules; machines join it through `join()` as a real node would.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.model import Availability, Node, NodeMarks, NodeStatus
from swarm_autoscaler.core.ports import is_ours
from swarm_autoscaler.errors import NotFoundError


class MemorySwarm:
    """Nodes in a dict. `join_token` and `manager_address` are fixed strings a machine presents;
    `managers` every manager's advertised address (default: `manager_address` alone).
    `cluster_name` is the cluster it serves: a node carrying `OWNERSHIP_LABEL=<cluster_name>` is ours."""

    def __init__(
        self,
        join_token: str = "SWMTKN-memory",
        manager_address: str = "127.0.0.1:2377",
        *,
        cluster_name: str = "",
        managers: tuple[str, ...] = (),
    ) -> None:
        self.cluster_name = cluster_name
        self.join_token = join_token
        self.manager_address = manager_address
        self.managers = managers or (manager_address,)
        self.nodes: dict[str, Node] = {}
        self._ids = itertools.count(1)
        self.calls: list[tuple[str, str]] = []

    # --- the machine side -------------------------------------------------------------------------

    def join(
        self, hostname: str, token: str, labels: Mapping[str, str] | None = None, *, paused: bool = False
    ) -> Node:
        """A machine joins with the worker token; a wrong token is refused as swarm would. `paused`:
        `docker swarm join --availability pause`."""
        if token != self.join_token:
            raise PermissionError("invalid join token")
        node = Node(
            id=f"node{next(self._ids):04d}",
            hostname=hostname,
            availability=Availability.PAUSE if paused else Availability.ACTIVE,
            status=NodeStatus.READY,
            labels=dict(labels or {}),
            ours=is_ours(labels or {}, self.cluster_name),
        )
        self.nodes[node.id] = node
        return node

    def set_status(self, hostname: str, status: NodeStatus) -> None:
        for node_id, node in self.nodes.items():
            if node.hostname == hostname:
                self.nodes[node_id] = dataclasses.replace(node, status=status)

    def replace_node(
        self, node_id: str, *, availability: Availability, labels: Mapping[str, str], marks: NodeMarks
    ) -> None:
        """A whole-spec update, as the Docker Engine API imitation receives it (`dockerapi`)."""
        node = self._get(node_id)
        self.calls.append(("update", node.hostname))
        self.nodes[node_id] = dataclasses.replace(
            node,
            availability=availability,
            labels=dict(labels),
            marks=marks,
            ours=is_ours(labels, self.cluster_name, node.is_manager),
        )

    def by_hostname(self, hostname: str) -> Node | None:
        return next((n for n in self.nodes.values() if n.hostname == hostname), None)

    # --- the Orchestrator port --------------------------------------------------------------------

    async def list_nodes(self) -> tuple[Node, ...]:
        # As the swarm adapter lists them: named by the machine's short hostname, whichever form the node's
        # OS reported (Amazon Linux reports the full private DNS name). The Docker API imitation, which
        # speaks for docker, reads `nodes` as they joined.
        return tuple(
            dataclasses.replace(n, hostname=machine_hostname(n.hostname)) for n in self.nodes.values()
        )

    async def set_availability(self, node_id: str, availability: Availability) -> None:
        node = self._get(node_id)
        self.calls.append(("set_availability", f"{node.hostname}:{availability}"))
        self.nodes[node_id] = dataclasses.replace(node, availability=availability)

    async def mark(
        self,
        node_id: str,
        marks: NodeMarks,
        labels: Mapping[str, str] | None = None,
        availability: Availability | None = None,
    ) -> None:
        node = self._get(node_id)
        merged = {**node.labels, **(labels or {})}
        state = node.availability if availability is None else availability
        if node.marks == marks and merged == node.labels and state == node.availability:
            return  # already so: nothing is written (as the swarm adapter does)
        self.calls.append(("mark", node.hostname))
        self.nodes[node_id] = dataclasses.replace(
            node,
            marks=marks,
            labels=merged,
            availability=state,
            ours=is_ours(merged, self.cluster_name, node.is_manager),
        )

    async def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        node = self._get(node_id)
        self.calls.append(("add_labels", node.hostname))
        merged = {**node.labels, **labels}
        self.nodes[node_id] = dataclasses.replace(
            node, labels=merged, ours=is_ours(merged, self.cluster_name, node.is_manager)
        )

    async def remove(self, node_id: str) -> None:
        node = self.nodes.pop(node_id, None)
        if node is not None:
            self.calls.append(("remove", node.hostname))

    async def join_command(self) -> tuple[str, str]:
        return self.join_token, self.manager_address

    async def manager_addresses(self) -> tuple[str, ...]:
        return self.managers

    def _get(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise NotFoundError(f"node {node_id} is not in the swarm") from None
