"""The chaos world in the dynamic mode (`WorldOptions.dynamic`): its user scales swarm services instead of
submitting dask tasks, and its oracle counts service tasks instead of dask work.

The world serves `MemoryServices` (swarm's placement on the in-memory swarm) through its Docker Engine API
imitation, stepped every 0.1 s, and the daemon runs with `AUTOSCALER_MODE=dynamic`. The backlog is one
service, `backlog`, scaled to N replicas of 1 CPU and 1 GiB each (pending beyond what the fleet holds, as
swarm keeps them); the cancellation scales it to 0. A drain, removal or termination that reaches a
node holding a task (assigned, starting, running or stopping) is a guard hit, as one holding dask work is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler_lab.localcloud.machines import MachineEmulator
from swarm_autoscaler_lab.localcloud.memservices import MemoryServices
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.sim.servicetrace import ServiceSpec

BACKLOG = ServiceSpec("backlog", 1.0, 1.0, 0)
STEP_S = 0.1


class ServiceLoad:
    """The services of the dynamic chaos world; `emulator()` gives the machine emulator once built."""

    def __init__(self, swarm: MemorySwarm, emulator: Callable[[], MachineEmulator | None]) -> None:
        self._emulator = emulator
        self.swarm = swarm
        self.services = MemoryServices(swarm, self._type_of, CATALOGUE, start_s=0.3, stop_s=0.3)

    def _type_of(self, hostname: str) -> str | None:
        emulator = self._emulator()
        machines = emulator.machines.values() if emulator is not None else ()
        return next((m.type_name for m in machines if m.hostname == hostname), None)

    async def run(self) -> None:
        while True:
            self.services.step()
            await asyncio.sleep(STEP_S)

    def load(self, hostname: str) -> tuple[int, int] | None:
        """(tasks on the node of `hostname`, 0); None when no node has that hostname."""
        on_node = self.services.on_node()
        nodes = [n for n in self.swarm.nodes.values() if n.hostname == hostname]
        if not nodes:
            return None
        return sum(len(on_node.get(n.id, ())) for n in nodes), 0

    def submit(self, n: int) -> int:
        self.services.scale(BACKLOG, self.services.replicas.get(BACKLOG.name, 0) + n)
        return n

    def busy_nodes(self) -> int:
        return len(self.services.on_node())

    def cancel(self) -> int:
        """Scale every service to 0; returns how many nodes held a task just before."""
        busy = self.busy_nodes()
        for name, spec in list(self.services.specs.items()):
            if self.services.replicas.get(name):
                self.services.scale(spec, 0)
        return busy

    def backlog(self) -> int:
        return sum(1 for t in self.services.tasks.values() if t.desired == "running")
