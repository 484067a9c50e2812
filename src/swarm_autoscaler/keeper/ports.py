"""The keeper's ports. Adapters implement them (EC2, dask, redis); tests use in-memory fakes.

State lives in EC2 tags: a restarted keeper (or another replica) rebuilds every cluster from
`ClusterHosts.list_clusters`, and redis holds only locks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from swarm_autoscaler.config.profiles import DEFAULT_PROFILE
from swarm_autoscaler.keeper.lifecycle import Probe
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState


@runtime_checkable
class ClusterHosts(Protocol):
    """The machines of on-demand clusters. Only instances carrying the keeper's ownership tags are
    listed or changed."""

    async def list_clusters(self) -> tuple[Cluster, ...]:
        """Every cluster whose primary is not terminated, rebuilt from its tags. One paged listing, which
        also lists every cluster's workers (`listing`)."""
        ...

    def listing(self, cluster_id: str) -> tuple[float, tuple[dict[str, Any], ...]] | None:
        """The time of the last `list_clusters` and the workers of `cluster_id` it saw, each as EC2's
        DescribeInstances gives an instance (JSON-able); None before the first listing. What the
        cluster's own autoscaler reads instead of calling DescribeInstances (one read for all)."""
        ...

    def primary_arn(self, cluster_id: str) -> str | None:
        """The instance ARN of `cluster_id`'s primary as the last `list_clusters` saw it (None if it did
        not): its autoscaler tags every worker with it, the only workers the primaries' IAM policy lets
        that primary touch."""
        ...

    async def trim(
        self,
        maximum: int,
        cluster_ids: Iterable[str],
        types: Mapping[str, Collection[str]] | None = None,
    ) -> list[tuple[str, str, str]]:
        """Terminate, from the last listing, the workers of `cluster_ids` naming another cluster's primary,
        those of a type not in `types[cluster id]` (when given), and the newest pending or running ones
        beyond `maximum` (never a primary); returns (cluster id, instance id, reason) of each."""
        ...

    async def find(self, key: ClusterKey) -> tuple[Cluster, ...]:
        """The clusters of one (user, wallet) pair whose primary is not terminated (a live one and
        possibly ending or failed ones), read from EC2 now."""
        ...

    async def create(self, key: ClusterKey, now: float, profile: str = DEFAULT_PROFILE) -> Cluster:
        """Launch the primary of `key`'s cluster, tagged with the keeper's ownership tags, the user,
        the wallet, a new cluster id, its `profile` (a known one: its images and machines) and its
        lifecycle (`starting`, created and heartbeat at `now`). Callers hold the key's creation lock
        (`ClusterKey.lock_name`)."""
        ...

    async def update(
        self,
        cluster_id: str,
        *,
        state: ClusterState | None = None,
        heartbeat: float | None = None,
        answered: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Write the given lifecycle fields into the primary's tags. A cluster already gone is ignored."""
        ...

    async def terminate(self, cluster_id: str) -> int:
        """Terminate the cluster's primary and every worker tagged with its id. Idempotent. Returns how
        many of its instances are still alive (0: nothing left, the cluster is gone)."""
        ...


@runtime_checkable
class SchedulerProbe(Protocol):
    """A cluster's dask scheduler, seen from outside through its HTTP (dashboard) address."""

    async def probe(self, url: str) -> Probe:
        """Whether it answers within a short timeout, and whether it has tasks (processing, waiting,
        queued or unrunnable). Never raises: a failure is `Probe(answered=False)`."""
        ...


@runtime_checkable
class SchedulerClients(Protocol):
    """Who is connected to a cluster's scheduler (its `scheduler_url`, with the cluster's credentials)."""

    async def clients(self, cluster: Cluster) -> int | None:
        """How many clients count as present: every client but the cluster's own autoscaler (a client
        holding results counts). None when it cannot be read now. Never raises."""
        ...

    async def hold_launches(self, cluster: Cluster, reason: str) -> bool:
        """Tell the cluster's own autoscaler to launch nothing more (`reason`), or again as usual ("").
        Idempotent; False when it could not be told now. Never raises."""
        ...


@runtime_checkable
class Locks(Protocol):
    """Named locks shared by every keeper replica."""

    def exclusive(self, name: str, wait: float) -> AbstractAsyncContextManager[bool]:
        """Hold `name` for the body; waits up to `wait` seconds for it. Yields False when it could not
        be had (the body must then do nothing exclusive)."""
        ...

    async def claim(self, name: str, ttl: float) -> bool:
        """Take or refresh a lease on `name` for `ttl` seconds without waiting. True while this replica
        holds it; another replica's live lease gives False."""
        ...

    async def release(self, name: str) -> None:
        """Give up a lease this replica holds (no-op otherwise)."""
        ...


@runtime_checkable
class Replicas(Protocol):
    """The live replicas of one keeper, so each takes only its share of the clusters."""

    async def beat(self, ttl: float) -> int:
        """Note this replica alive for `ttl` seconds; how many replicas are alive now, itself included."""
        ...

    async def leave(self) -> None:
        """This replica is stopping: count it out now, not after its `ttl`."""
        ...


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """One launch of a cluster's workers by the keeper (`launches`): what the cluster's autoscaler chose,
    checked (type, count, market, subnet, user data, labels, idempotency token), and what the keeper
    forces (the cluster, its user and wallet, the instance ARN of its primary)."""

    cluster_id: str
    key: ClusterKey
    primary_arn: str
    instance_type: str
    count: int
    spot: bool
    subnet_id: str
    user_data: str
    client_token: str
    labels: tuple[tuple[str, str], ...] = ()
    pool: bool = False
    deployment: str = ""
    ami_id: str = ""  # the cluster's profile's AMI for the type; empty: the launcher's for the type
    join_nonce: str = ""  # the join ticket's nonce, tagged on the workers (`launches`); empty: none


class WorkerLaunchError(Exception):
    """EC2 refused a worker launch (`code`: EC2's error code, such as a capacity or quota refusal), which
    the cluster's autoscaler reads as it reads EC2's own answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@runtime_checkable
class WorkerLauncher(Protocol):
    """The only holder of the power to launch a keeper cluster's workers (the primaries' role has none)."""

    async def live_workers(self, cluster_id: str) -> frozenset[str]:
        """The ids of the cluster's pending or running workers, read from EC2 now (plus those this
        process launched moments ago that EC2 may not list yet)."""
        ...

    async def launch(self, launch: WorkerLaunch) -> tuple[dict[str, Any], ...]:
        """Launch up to `launch.count` workers (at least one), with the keeper's image, network, tags,
        IMDSv2 and no instance profile; each in DescribeInstances' shape as JSON (`tags.listing_entry`).
        Raises `WorkerLaunchError` for EC2's refusal, `EndpointError` when EC2 cannot be reached."""
        ...

    async def stopped_workers(
        self, cluster_id: str, primary_arn: str, instance_ids: Sequence[str], types: Collection[str]
    ) -> frozenset[str]:
        """Those of `instance_ids` that are, read from EC2 now, stopped workers of the cluster naming
        its primary `primary_arn`, of one of `types` (warm-pool machines its autoscaler may start: a
        worker retyped while stopped is not one)."""
        ...

    async def start(self, cluster_id: str, instance_ids: Sequence[str]) -> None:
        """Start these stopped workers of the cluster (StartInstances with the keeper's own credentials);
        `live_workers` counts them from then on, even while EC2 still lists them stopped. Raises
        `WorkerLaunchError` for EC2's refusal, `EndpointError` when EC2 cannot be reached."""
        ...
