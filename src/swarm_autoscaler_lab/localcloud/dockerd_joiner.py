"""Joins emulated machines to a real local swarm: each machine becomes its own dockerd node."""

from __future__ import annotations

from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm


class DockerdJoiner:
    """`join` starts a dockerd with the machine's hostname and runs `docker swarm join` with the token and
    address the machine read from its user data; `leave` stops that dockerd (the machine is gone)."""

    def __init__(self, swarm: LocalSwarm) -> None:
        self.swarm = swarm

    async def join(self, hostname: str, token: str, manager_address: str) -> None:
        node = self.swarm.nodes.get(hostname) or await self.swarm.add_node(hostname)
        await node.join(token, manager_address)

    async def leave(self, hostname: str) -> None:
        if hostname in self.swarm.nodes:  # stop_node forgets the node before its first await
            await self.swarm.stop_node(hostname)
