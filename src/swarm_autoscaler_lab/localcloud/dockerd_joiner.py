"""Joins emulated machines to a real local swarm: each machine becomes its own dockerd node."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm


class DockerdJoiner:
    """`join` starts a dockerd with the machine's hostname and runs `docker swarm join` with the token and
    address the machine read from its user data; `leave` stops that dockerd (the machine is gone).

    `preload`: image tarballs `docker load`ed into each new node before it joins (no registry here: what a
    real AMI bakes in), so that swarm can start service tasks there (the dynamic mode's e2e test)."""

    def __init__(self, swarm: LocalSwarm, preload: Sequence[Path] = ()) -> None:
        self.swarm = swarm
        self.preload = tuple(preload)

    async def join(self, hostname: str, token: str, manager_address: str, paused: bool = False) -> None:
        node = self.swarm.nodes.get(hostname)
        if node is None:
            node = await self.swarm.add_node(hostname)
            for tarball in self.preload:
                await node.docker("load", "-i", str(tarball), timeout=300)
        await node.join(token, manager_address, paused=paused)

    async def leave(self, hostname: str) -> None:
        if hostname in self.swarm.nodes:  # stop_node forgets the node before its first await
            await self.swarm.stop_node(hostname)
