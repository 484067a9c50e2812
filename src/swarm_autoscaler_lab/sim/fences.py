"""Fences in the simulated scheduler, as the dask adapter keeps them (`ports.Workload.fence`): a fenced
host's workers get no task, whether connected when it was fenced or starting later; a host with a busy
worker is refused; a fence lasts until it is lifted or expires (an event on the virtual clock)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from swarm_autoscaler.core.ports import Fence
from swarm_autoscaler_lab.sim.scheduler import EventQueue, Scheduler

FENCE_TTL = 600.0  # as the dask adapter's default


@dataclass
class SimFences:
    scheduler: Scheduler
    events: EventQueue
    ttl: float = FENCE_TTL
    hosts: dict[str, tuple[float, set[str]]] = field(default_factory=dict)  # host -> (until, cordoned)

    def fenced(self, host: str, now: float) -> bool:
        entry = self.hosts.get(host)
        return entry is not None and entry[0] > now

    def fence(self, hostnames: Sequence[str], now: float) -> Fence:
        wanted = set(hostnames) - {""}
        on_hosts = [w for w in self.scheduler.workers.values() if w.hostname in wanted]
        refused = {w.hostname for w in on_hosts if w.busy}
        for host in wanted - refused:
            cordoned = self.hosts.get(host, (0.0, set()))[1]
            self.hosts[host] = (now + self.ttl, cordoned)
            self.events.push(now + self.ttl, "fence-expired", host)
            for worker in on_hosts:
                if worker.hostname == host and not worker.cordoned:
                    self.scheduler.cordon(worker.address, True, now)
                    cordoned.add(worker.address)
        views = self.scheduler.view(now).workers
        return Fence(tuple(w for w in views if w.hostname in wanted), tuple(sorted(refused)))

    def admitted(self, address: str, host: str, now: float) -> bool:
        """Whether a worker starting on `host` is cordoned as it is added (recorded if so)."""
        if not self.fenced(host, now):
            return False
        self.hosts[host][1].add(address)
        return True

    def unfence(self, hostnames: Sequence[str], now: float) -> None:
        for host in hostnames:
            _, cordoned = self.hosts.pop(host, (0.0, set()))
            for address in cordoned:
                self.scheduler.cordon(address, False, now)

    def expire(self, host: str, now: float) -> None:
        """A fence's timer ran out: lift it unless it was renewed since."""
        entry = self.hosts.get(host)
        if entry is not None and entry[0] <= now:
            self.unfence([host], now)
