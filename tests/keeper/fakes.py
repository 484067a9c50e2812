"""In-memory implementations of the keeper's ports, implementing the same protocols: a fleet of
clusters with a settable clock, a scheduler probe whose answers the test sets, and shared locks that
several keepers (replicas) in one process use as they would use redis."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from swarm_autoscaler.config.profiles import DEFAULT_PROFILE
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.keeper.adapters.tags import excess_workers
from swarm_autoscaler.keeper.lifecycle import Probe
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState
from swarm_autoscaler.keeper.ports import WorkerLaunch


class FakeHosts:
    """Clusters as EC2 would keep them in tags. `alive[cluster_id]` counts its live instances;
    `terminate` takes `terminations_to_finish` calls to bring them to 0."""

    def __init__(self, create_delay: float = 0.0) -> None:
        self.clusters: dict[str, Cluster] = {}
        self.alive: dict[str, int] = {}
        self.created = 0
        self.updates = 0
        self.listings = 0
        self.workers: dict[str, list[dict[str, Any]]] = {}
        self.terminate_calls: list[str] = []
        self.trimmed: list[tuple[str, str, str]] = []
        self.create_delay = create_delay
        self.fail = False
        self._ids = itertools.count(1)
        self._by_key: dict[ClusterKey, list[str]] = {}  # as EC2 filters on the user and wallet tags

    def _check(self) -> None:
        if self.fail:
            raise EndpointError("fake EC2", "unreachable")

    async def list_clusters(self) -> tuple[Cluster, ...]:
        self._check()
        self.listings += 1
        return tuple(c for cid, c in self.clusters.items() if self.alive.get(cid, 0) > 0)

    def listing(self, cluster_id: str) -> tuple[float, tuple[dict[str, Any], ...]] | None:
        """As `Ec2Primaries.listing`: `workers[cluster_id]` (entries in DescribeInstances' shape),
        stamped with the number of listings so far; None before the first."""
        if not self.listings:
            return None
        return float(self.listings), tuple(self.workers.get(cluster_id, ()))

    def primary_arn(self, cluster_id: str) -> str | None:
        """As `Ec2Primaries.primary_arn`: an ARN built from the cluster's primary id, once listed."""
        cluster = self.clusters.get(cluster_id)
        if not self.listings or cluster is None or not cluster.primary_id:
            return None
        return f"arn:aws:ec2:us-east-1:123456789012:instance/{cluster.primary_id}"

    async def trim(
        self, maximum: int, cluster_ids: Iterable[str], types: Mapping[str, Collection[str]] | None = None
    ) -> list[tuple[str, str, str]]:
        """As `Ec2Primaries.trim`, over `workers`; records what it ended in `trimmed`."""
        ended = []
        for cid in cluster_ids:
            offered = None if types is None else types.get(cid)
            entries = self.workers.get(cid, ())
            ended += [(cid, iid, why) for iid, why in excess_workers(entries, maximum, None, offered)]
        self.trimmed += ended
        return ended

    async def find(self, key: ClusterKey) -> tuple[Cluster, ...]:
        self._check()
        ids = self._by_key.get(key, ())
        return tuple(self.clusters[cid] for cid in ids if self.alive.get(cid, 0) > 0)

    async def create(self, key: ClusterKey, now: float, profile: str = DEFAULT_PROFILE) -> Cluster:
        self._check()
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        cid = f"kc-{next(self._ids):04d}"
        cluster = Cluster(
            cid,
            key,
            ClusterState.STARTING,
            now,
            now,
            scheduler_url=f"tcp://{cid}:8786",
            dashboard_url=f"http://{cid}:8787",
            profile=profile,
            private_ip="127.0.0.1",  # the primary's, as EC2 gives it: the test clients' source address
        )
        self.clusters[cid] = cluster
        self.alive[cid] = 1
        self._by_key.setdefault(key, []).append(cid)
        self.created += 1
        return cluster

    async def update(
        self,
        cluster_id: str,
        *,
        state: ClusterState | None = None,
        heartbeat: float | None = None,
        answered: float | None = None,
        reason: str | None = None,
    ) -> None:
        self._check()
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            return
        self.updates += 1
        changes: dict[str, object] = {}
        if state is not None:
            changes["state"] = state
        if heartbeat is not None:
            changes["last_heartbeat"] = heartbeat
        if answered is not None:
            changes["last_answered"] = answered
        if reason is not None:
            changes["reason"] = reason
        self.clusters[cluster_id] = dataclasses.replace(cluster, **changes)  # type: ignore[arg-type]

    async def terminate(self, cluster_id: str) -> int:
        self._check()
        self.terminate_calls.append(cluster_id)
        self.alive[cluster_id] = 0
        return 0

    def live(self) -> list[Cluster]:
        return [c for cid, c in self.clusters.items() if self.alive.get(cid, 0) > 0]


class FakeProbe:
    """Answers per scheduler URL: `answers[url] = Probe(...)`; unknown URLs do not answer."""

    def __init__(self) -> None:
        self.answers: dict[str, Probe] = {}
        self.calls = 0

    async def probe(self, url: str) -> Probe:
        self.calls += 1
        return self.answers.get(url, Probe(answered=False))


class SharedLocks:
    """The state of a redis shared by several replicas; `for_replica(name)` gives one replica's view."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.held: set[str] = set()
        self.leases: dict[str, tuple[str, float]] = {}

    def for_replica(self, replica: str) -> ReplicaLocks:
        return ReplicaLocks(self, replica)


class ReplicaLocks:
    def __init__(self, shared: SharedLocks, replica: str) -> None:
        self.shared = shared
        self.replica = replica

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str, wait: float) -> AsyncIterator[bool]:
        deadline = asyncio.get_running_loop().time() + wait
        while name in self.shared.held:
            if asyncio.get_running_loop().time() >= deadline:
                yield False
                return
            await asyncio.sleep(0.001)
        self.shared.held.add(name)
        try:
            yield True
        finally:
            self.shared.held.discard(name)

    async def claim(self, name: str, ttl: float) -> bool:
        owner = self.shared.leases.get(name)
        now = self.shared.clock()
        if owner is not None and owner[0] != self.replica and owner[1] > now:
            return False
        self.shared.leases[name] = (self.replica, now + ttl)
        return True

    async def release(self, name: str) -> None:
        owner = self.shared.leases.get(name)
        if owner is not None and owner[0] == self.replica:
            del self.shared.leases[name]


class FakeWorkers:
    """The keeper's `WorkerLauncher` in memory: `live[cluster_id]` are its pending or running workers;
    every launch is recorded in `launched` and adds its ids there."""

    def __init__(self) -> None:
        self.live: dict[str, set[str]] = {}
        self.stopped: dict[str, set[str]] = {}  # warm-pool workers, started through the start route
        self.launched: list[WorkerLaunch] = []
        self._ids = itertools.count(1)

    async def live_workers(self, cluster_id: str) -> frozenset[str]:
        return frozenset(self.live.get(cluster_id, ()))

    async def launch(self, launch: WorkerLaunch) -> tuple[dict[str, Any], ...]:
        self.launched.append(launch)
        ids = [f"i-{next(self._ids):017x}" for _ in range(launch.count)]
        self.live.setdefault(launch.cluster_id, set()).update(ids)
        return tuple({"InstanceId": iid, "InstanceType": launch.instance_type} for iid in ids)

    async def stopped_workers(
        self, cluster_id: str, primary_arn: str, instance_ids: Sequence[str], types: Collection[str]
    ) -> frozenset[str]:
        return frozenset(i for i in instance_ids if i in self.stopped.get(cluster_id, set()))

    async def start(self, cluster_id: str, instance_ids: Sequence[str]) -> None:
        stopped = self.stopped.get(cluster_id, set())
        started = stopped & set(instance_ids)
        stopped.difference_update(started)
        self.live.setdefault(cluster_id, set()).update(started)
