"""The four ports the daemon talks through. Adapters implement them; in-memory fakes implement the same.

Each contract states consistency, idempotency and what "already gone" means. No port takes an
application object: only model values and plain data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Availability,
    Instance,
    InstanceType,
    Node,
    NodeMarks,
    Task,
    Unavailable,
    Worker,
)


def is_ours(labels: Mapping[str, str], cluster_name: str, is_manager: bool = False) -> bool:
    """True when a worker node's labels carry this cluster's ownership label (`model.OWNERSHIP_LABEL`;
    never for a manager, and never for an empty cluster name). Nothing else, in particular not the plain
    `instance-type` label users also set for placement, makes a node ours."""
    return bool(cluster_name) and not is_manager and labels.get(OWNERSHIP_LABEL) == cluster_name


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """What a launch request achieved.

    `instances` are the ones EC2 accepted (possibly fewer than asked). `refused` names the
    (type, subnet) pairs refused for lack of capacity; `error` is a non-capacity failure message.
    """

    instances: tuple[Instance, ...] = ()
    refused: tuple[Unavailable, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """One consistent read of the scheduler: every worker with its processing tasks, the tasks that no
    current worker can run, and the tasks the scheduler holds in its own queue because every worker is
    saturated (dask's root-task queuing)."""

    workers: tuple[Worker, ...]
    unrunnable: tuple[Task, ...]
    queued: tuple[Task, ...] = ()
    launch_hold: str = ""  # why no machine may be added now (`Snapshot.launch_hold`); empty: none


@dataclass(frozen=True, slots=True)
class Fence:
    """What `Workload.fence` did, read atomically with it: `workers` are the workers on the hosts asked
    about, as they are once fenced (a fenced worker reports `retiring`); `refused` are the hosts left
    unfenced because a worker there is busy (processing a task or holding a result no other worker has)."""

    workers: tuple[Worker, ...] = ()
    refused: tuple[str, ...] = ()


@runtime_checkable
class Cloud(Protocol):
    """Machines. Only instances carrying this daemon's ownership tags are ever listed or changed.

    Consistency: EC2 is eventually consistent; a launched instance may be missing from the next
    listing for a few seconds, so callers count in-flight launches from what `launch` returned until it
    shows up.

    Time: `now()` is the cloud's own clock, the time base of `Instance.launched_at`. The daemon takes
    every tick's `Snapshot.now` (and so every lifecycle mark it writes) from it, so that ages and
    delays never depend on the host's wall clock.
    """

    def now(self) -> float:
        """The cloud's current time, seconds since the epoch. Never blocks (no I/O)."""
        ...

    async def list_instances(self) -> tuple[Instance, ...]:
        """Every owned instance that is not terminated."""
        ...

    async def instance_types(self, names: Sequence[str]) -> tuple[InstanceType, ...]:
        """The catalogue entries for `names` (cached; types are immutable). Unknown names raise
        `ConfigurationError`."""
        ...

    async def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
    ) -> LaunchResult:
        """Launch up to `count` instances of `type_name`, tagged as owned and carrying `labels` for the
        node. Never raises for capacity refusals: they come back in `LaunchResult.refused`. `pool`: into
        the type's warm pool: each machine boots once, runs its boot script and stops itself without
        joining the swarm (its `Instance.pool` is `PoolPhase.PREPARE`)."""
        ...

    async def start_instances(self, instance_ids: Sequence[str]) -> LaunchResult:
        """Start these stopped owned instances so that each joins the swarm on this boot (its
        `Instance.pool` becomes `PoolPhase.START` and its `launched_at` the start time). `instances`: the
        ones started; `refused`: the (type, subnet) pairs EC2 refused for lack of capacity, backed off
        like a launch's (`unavailable`), never raised; `error`: any other failure. Refuses
        (ConfigurationError) ids that are not owned."""
        ...

    async def stop_instances(self, instance_ids: Sequence[str]) -> None:
        """Stop these instances (into the warm pool). Idempotent: one already stopping or stopped
        counts as success. Refuses (ConfigurationError) ids that are not owned."""
        ...

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate these instances. Idempotent: an instance that is already terminated or does not
        exist counts as success. Refuses (ConfigurationError) ids that are not owned."""
        ...

    def unavailable(self, now: float) -> tuple[Unavailable, ...]:
        """The (type, subnet) refusals whose back-off has not expired at `now`."""
        ...


@runtime_checkable
class Orchestrator(Protocol):
    """Swarm nodes: availability and the lifecycle marks kept in node labels.

    An Orchestrator is built for one cluster name: `list_nodes` sets `Node.ours` on exactly the worker
    nodes whose `OWNERSHIP_LABEL` equals it (`is_ours`).
    """

    async def list_nodes(self) -> tuple[Node, ...]:
        """Every node of the swarm (managers included, flagged), in one call: `act` also uses it as the
        fresh read it re-checks disruptive actions against."""
        ...

    async def set_availability(self, node_id: str, availability: Availability) -> None:
        """Set the node's availability, retrying on a stale version. Idempotent. A node that no longer
        exists raises `NotFoundError`."""
        ...

    async def mark(
        self,
        node_id: str,
        marks: NodeMarks,
        labels: Mapping[str, str] | None = None,
        availability: Availability | None = None,
    ) -> None:
        """Replace the node's lifecycle marks, add or overwrite `labels` (the labels its instance was
        launched with) and set `availability` (None: unchanged), in ONE node update; other labels are
        kept. Idempotent: when the node already carries these marks, labels and availability, nothing is
        written. A node that no longer exists raises `NotFoundError`."""
        ...

    async def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        """Add or overwrite these labels, keeping the node's others. Idempotent. A node that no longer
        exists raises `NotFoundError`."""
        ...

    async def remove(self, node_id: str) -> None:
        """Remove a node from the swarm (forcibly). A node already gone counts as success."""
        ...

    async def join_command(self) -> tuple[str, str]:
        """(worker join token, manager address host:port) for new machines' user data."""
        ...

    async def manager_addresses(self) -> tuple[str, ...]:
        """Every manager's address, host:port, as swarm gives it to joining workers (docker's
        `ManagerStatus.Addr`, the address a manager advertises), the leader first, managers known to be
        unreachable left out: where machines reach the managers (`AUTOSCALER_EC2_JOIN_URL=auto`). Called
        right after `join_command` when a launch renders its user data, so an adapter may answer from the
        managers that call read (a few seconds old at most) instead of asking again."""
        ...


@runtime_checkable
class Workload(Protocol):
    """The dask scheduler."""

    async def observe(self) -> WorkloadView:
        """Workers with their processing tasks, and unrunnable tasks, read in one scheduler call."""
        ...

    async def list_workers(self) -> tuple[Worker, ...]:
        """Just the workers, as `observe` reports them (processing tasks, unique data, retiring), in one
        scheduler call that skips the unrunnable and queued tasks: the cheap fresh read `act` re-checks
        disruptive actions against."""
        ...

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Gracefully retire these workers; return the addresses that really retired (a worker holding
        the only copy of a result is kept by the scheduler). Unknown addresses are ignored."""
        ...

    async def cordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Stop giving these workers new tasks (their running and waiting tasks stay; the worker starts
        no new one). Returns the addresses that were cordoned; unknown addresses are ignored."""
        ...

    async def uncordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Let cordoned workers take and start tasks again. Returns the addresses that were uncordoned."""
        ...

    async def fence(self, hostnames: Sequence[str]) -> Fence:
        """In ONE atomic step on the scheduler, stop every worker on these hosts from getting a task:
        idle workers connected there are cordoned, and any worker that connects later from a fenced host
        is cordoned as it is added. A host with a busy worker is refused (not fenced). Returns the
        workers on those hosts as they are at that instant. A fence lasts until `unfence` or until it
        expires (minutes; a host name may be reused later), when the workers it cordoned are let go.
        Fencing a fenced host renews it. This is how `act` closes the window between its last re-check
        and a termination: once fenced, nothing new can land on the machine."""
        ...

    async def unfence(self, hostnames: Sequence[str]) -> None:
        """Lift these hosts' fences: the workers a fence cordoned take tasks again. Unknown or unfenced
        hosts are ignored."""
        ...

    async def wait_for_change(self, timeout: float) -> bool:
        """Wait until new unrunnable or queued work appears or a worker leaves, or `timeout` passes.
        Returns True when woken by a change."""
        ...


@runtime_checkable
class Lock(Protocol):
    """Leadership among replicas for one managed cluster."""

    async def acquire(self) -> bool:
        """Try once to become the leader; True when this replica holds the lock (also when it already
        did, in which case the TTL is refreshed)."""
        ...

    async def extend(self) -> bool:
        """Refresh the TTL while a tick runs. False means the lock was lost: stop acting."""
        ...

    async def release(self) -> None:
        """Give the lock up if held. Safe to call when not held."""
        ...
