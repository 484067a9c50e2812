"""The core's vocabulary: frozen dataclasses that adapters build and the planner reads.

Nothing here performs I/O or reads a clock. Times are seconds since the epoch as floats; the only "now"
the core sees is `Snapshot.now`. Memory sizes are bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

GIB = 1024**3

# --------------------------------------------------------------------------------------------- resources


class NegativeResourcesError(ValueError):
    """Raised when a subtraction would leave a negative amount: callers must check `fits_in` first."""


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of machine capacity or of a task's needs.

    `generic` holds named resources (dask resource restrictions other than CPU, RAM and GPU) as a
    sorted tuple of (name, amount) pairs so that the value is hashable and compares by content.
    Arithmetic never silently goes negative: `-` raises `NegativeResourcesError`; use `saturating_sub`
    where clamping at zero is meant.
    """

    cpus: float = 0.0
    ram: int = 0
    gpus: int = 0
    generic: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def of(cpus: float = 0.0, ram: int = 0, gpus: int = 0, **generic: float) -> Resources:
        return Resources(cpus, ram, gpus, tuple(sorted((k, v) for k, v in generic.items() if v)))

    @property
    def generic_map(self) -> Mapping[str, float]:
        return dict(self.generic)

    def _combine_generic(self, other: Resources, sign: int) -> dict[str, float]:
        out = dict(self.generic)
        for name, amount in other.generic:
            out[name] = out.get(name, 0.0) + sign * amount
        return out

    def __add__(self, other: Resources) -> Resources:
        gen = self._combine_generic(other, 1) if other.generic or self.generic else {}
        return Resources(
            self.cpus + other.cpus,
            self.ram + other.ram,
            self.gpus + other.gpus,
            tuple(sorted((k, v) for k, v in gen.items() if v)),
        )

    def __sub__(self, other: Resources) -> Resources:
        if not other.fits_in(self):
            raise NegativeResourcesError(f"cannot take {other} from {self}")
        return self.saturating_sub(other)

    def saturating_sub(self, other: Resources) -> Resources:
        """Subtract, clamping every amount at zero (for accounting that may be momentarily stale)."""
        gen = self._combine_generic(other, -1) if other.generic or self.generic else {}
        return Resources(
            max(0.0, round(self.cpus - other.cpus, 9)),
            max(0, self.ram - other.ram),
            max(0, self.gpus - other.gpus),
            tuple(sorted((k, v) for k, v in gen.items() if v > 0)),
        )

    def fits_in(self, capacity: Resources) -> bool:
        """True when every amount here is at most the same amount of `capacity`."""
        if self.cpus > capacity.cpus + 1e-9 or self.ram > capacity.ram or self.gpus > capacity.gpus:
            return False
        if not self.generic:
            return True
        have = dict(capacity.generic)
        return all(amount <= have.get(name, 0.0) + 1e-9 for name, amount in self.generic)

    def is_zero(self) -> bool:
        return self.cpus <= 0 and self.ram <= 0 and self.gpus <= 0 and not self.generic

    def __str__(self) -> str:
        parts = [f"cpus={self.cpus:g}", f"ram={self.ram / GIB:.3g}GiB"]
        if self.gpus:
            parts.append(f"gpus={self.gpus}")
        parts.extend(f"{k}={v:g}" for k, v in self.generic)
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class InstanceType:
    """An EC2 instance type: what a machine of that type offers, and its on-demand price if known."""

    name: str
    resources: Resources
    price_per_hour: float | None = None


# --------------------------------------------------------------------------------------------- observed state


class InstanceState(enum.StrEnum):
    """EC2's instance states. EC2 still lists a terminated instance for about an hour: the daemon sees
    it so that a node that joined as its machine was being terminated is still recognised as ours (by
    hostname) and removed once down."""

    PENDING = "pending"
    RUNNING = "running"
    SHUTTING_DOWN = "shutting-down"
    STOPPING = "stopping"
    STOPPED = "stopped"
    TERMINATED = "terminated"


class PoolPhase(enum.StrEnum):
    """Where an instance stands with its type's warm pool (kept in a tag; see core/pool.py).
    PREPARE: launched into the pool: it boots, runs its boot script and stops itself, without joining.
    START: started from the pool: it joins the swarm on this boot."""

    PREPARE = "prepare"
    START = "start"


@dataclass(frozen=True, slots=True)
class Instance:
    """One EC2 instance carrying this daemon's ownership tags.

    `hostname` is the first label of the private DNS name; it is the swarm node's hostname.
    `launched_at` is EC2's launch time, or the time of its last start from the warm pool (as EC2's
    LaunchTime is after a start). `labels` are the node labels it was launched with (kept in its tags):
    its node gets them once it joins. `pool`: its warm pool phase, None for a machine launched to work.
    `spot`: a spot instance (EC2 may interrupt it, and it cannot be stopped into the warm pool).
    `interrupted_at`: when EC2 gave notice that it takes the machine back (a spot interruption warning,
    or a scheduled retirement; kept in a tag), None without a notice. `rebalance_at`: when EC2
    recommended rebalancing it (a spot machine at raised risk; advice, not a notice: see
    core/interrupt.py), None without one.
    """

    id: str
    type_name: str
    state: InstanceState
    launched_at: float
    hostname: str
    zone: str = ""
    subnet_id: str = ""
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    pool: PoolPhase | None = None
    spot: bool = False
    interrupted_at: float | None = None
    rebalance_at: float | None = None
    private_ip: str = ""  # EC2's PrivateIpAddress ("" when not known)

    @property
    def alive(self) -> bool:
        return self.state in (InstanceState.PENDING, InstanceState.RUNNING)


class Availability(enum.StrEnum):
    ACTIVE = "active"
    DRAIN = "drain"
    PAUSE = "pause"


class NodeStatus(enum.StrEnum):
    READY = "ready"
    DOWN = "down"
    UNKNOWN = "unknown"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True, slots=True)
class NodeMarks:
    """The lifecycle the daemon keeps in swarm node labels, so that a restart continues where it stopped.

    All times are epoch seconds or None. `ready` is set once the daemon has seen the node join and
    accepted it into the fleet; `cordoned_since` while its worker takes no new tasks so that the node
    empties (see `Cordon`). The adapter translates these to and from labels.
    """

    ready: bool = False
    empty_since: float | None = None
    drained_since: float | None = None
    termination_started: float | None = None
    down_since: float | None = None
    cordoned_since: float | None = None


# The node label (and instance tag) that says a machine belongs to this daemon's cluster; its value is
# the cluster's name. Launches carry it among the instance's labels, the planner copies it onto the
# node when it joins (a NodeUpdate), and the adapters set `Node.ours` from it.
OWNERSHIP_LABEL = "swarm-autoscaler.cluster"


@dataclass(frozen=True, slots=True)
class Node:
    """A docker swarm node. Manager nodes are observed but never scaled.

    `ours` is True when the node carries this cluster's namespaced ownership label (set by the daemon
    when a machine it launched joins): only such nodes are ever drained, removed or terminated. The
    plain `instance-type` label is for placement constraints only and proves nothing.
    """

    id: str
    hostname: str
    availability: Availability
    status: NodeStatus
    is_manager: bool = False
    marks: NodeMarks = NodeMarks()
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ours: bool = False
    address: str = ""  # swarm's Status.Addr: its authenticated connection's source ("": not known)


@dataclass(frozen=True, slots=True)
class Task:
    """A unit of dask work: its key, what it needs, and the instance type it is pinned to, if any.
    `executing` is True for a processing task its worker reports as running (not waiting on it).
    `expected` is the scheduler's estimate of its duration in seconds (None: no estimate yet), and
    `started` when it started running (None unless executing); both only inform how soon tasks queued
    behind it will start. `do_not_disrupt`: the task carries the dask annotation `do_not_disrupt` (its
    machine is never disrupted while it runs or waits there: core/budgets.py)."""

    key: str
    needs: Resources
    pinned_type: str | None = None
    executing: bool = False
    expected: float | None = None
    started: float | None = None
    do_not_disrupt: bool = False


@dataclass(frozen=True, slots=True)
class Worker:
    """A dask worker, matched to its swarm node by `hostname` (derived from the worker's name).

    `processing` lists every task the scheduler has assigned to it (running or waiting on it: the
    scheduler cannot tell the two apart). `has_unique_data` is True when it holds a result that no
    other worker has, so retiring it would lose work. `retiring` is True once the scheduler gives it
    no new tasks (dask's `closing_gracefully`): it is being retired, or the daemon cordoned it (then its
    node carries the `cordoned_since` mark).
    """

    address: str
    name: str
    hostname: str
    resources: Resources
    processing: tuple[Task, ...] = ()
    has_unique_data: bool = False
    retiring: bool = False

    @property
    def busy(self) -> bool:
        return bool(self.processing) or self.has_unique_data

    @property
    def holding(self) -> bool:
        """It runs and queues nothing but holds a result no other worker has (typically one a client
        has not released yet): dask's `retire_workers` can move such results to another worker first
        (and keeps the worker when it cannot), so it may be retired, never drained or terminated."""
        return not self.processing and self.has_unique_data


@dataclass(frozen=True, slots=True)
class Unavailable:
    """An instance type EC2 recently refused for lack of capacity in one subnet ("" when EC2 chose it),
    skipped there until `until`."""

    type_name: str
    until: float
    subnet_id: str = ""


@dataclass(frozen=True, slots=True)
class Arrivals:
    """What the daemon has seen of the work for one instance type (core/arrivals.py): when a machine of
    the type last took work that arrived, and the typical time between two such arrivals."""

    last: float
    gap: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one tick observed. Built fresh every tick; never mutated.

    `instance_types` is the catalogue of every type the policy may use. `unrunnable` are the tasks the
    scheduler cannot run on any current worker; `queued` those it holds back because every worker is
    busy. Both are pending work. `launch_hold`: why no machine may be added now (empty: none), as the
    scheduler says (a keeper holds a cluster's launches when its wallet's budget is spent).
    `arrivals`: per type, what the daemon has seen of the work over past ticks (core/arrivals.py; empty
    without that memory): how long idle machines are kept follows it.
    """

    now: float
    instance_types: tuple[InstanceType, ...]
    instances: tuple[Instance, ...]
    nodes: tuple[Node, ...]
    workers: tuple[Worker, ...]
    unrunnable: tuple[Task, ...]
    unavailable: tuple[Unavailable, ...] = ()
    queued: tuple[Task, ...] = ()
    launch_hold: str = ""
    arrivals: Mapping[str, Arrivals] = field(default_factory=lambda: MappingProxyType({}))


# --------------------------------------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class TypePolicy:
    """How one allowed instance type is used.

    `reserve`: drained nodes of this type kept warm. `overhead`: resources the OS and sidecars take,
    subtracted from the type's capacity before fitting tasks. `price_per_hour` overrides the catalogue.
    `minimum`: machines of this type always running (the base). `warm_pool`: stopped machines of this
    type kept ready to start (see core/pool.py).
    `surge_above`: while a worker of this type is up, new machines of it are launched only for more than
    this many pending tasks (0: for any; see surge.py).
    `reserve_idle_limit`: a reserve kept only while the type is in use: once no machine of the type
    worked for this long, its reserve is let go, and refilled only when the type works again (0: the
    reserve is kept always; see pool.py).
    `spec`: a hash of what a new machine of this type is launched with (AMI, boot script, type settings,
    subnets, security groups): written on each machine at launch, a machine carrying another is drifted
    (drift.py). "": not tracked.
    """

    name: str
    reserve: int = 0
    overhead: Resources = Resources()
    price_per_hour: float | None = None
    minimum: int = 0
    warm_pool: int = 0
    surge_above: int = 0
    reserve_idle_limit: float = 0.0
    spec: str = ""


@dataclass(frozen=True, slots=True)
class Budget:
    """How many machines may be disrupted at once for some reasons (Karpenter's disruption budgets):
    `nodes` machines, or `share` of our nodes (rounded up), whichever is set (both: the smaller).
    `reasons`: of "empty", "consolidation", "drift", "expiry" (interruptions and repairs are exempt).
    A window (`days`, 0 = Monday; empty: every day; `start` to `end`, seconds after midnight UTC)
    limits when it applies; outside it the budget does not constrain. See core/budgets.py."""

    nodes: int | None = None
    share: float | None = None
    reasons: tuple[str, ...] = ("empty", "consolidation", "drift", "expiry")
    days: tuple[int, ...] = ()
    start: float = 0.0
    end: float = 86400.0


@dataclass(frozen=True, slots=True)
class Policy:
    """The limits and delays the planner follows (built from settings). Durations are seconds.

    - `allowed_types`: in order of preference on price ties.
    - `min_instances` / `max_instances`: live plus in-flight instances stay within these bounds.
    - `max_start_time`: an instance not joined (or whose worker is not up) after this is broken.
    - `drain_delay`: an active node must be empty this long before it is drained.
    - `termination_delay`: a drained node beyond the reserve is terminated after this long drained.
    - `node_down_timeout`: a swarm node down this long is removed (and its instance terminated).
    - `max_launch_per_tick`: cap on new instances per plan (0 = no cap beyond max_instances).
    - `consolidate_below`: a worker using at most this fraction of its machine is cordoned (takes no new
      tasks, so that it empties) when others of its type have room for its tasks (0 = never).
    - `consolidate_under_load`: consolidation also runs while work is pending, when the plan placed all
      of it on capacity that is up (and cordoned workers are then drained as they empty).
    - `tolerated_wait`: a task queued behind a busy worker that dask's duration estimates say starts
      there within this long buys no new instance (0 = every queued task may buy one).
    - `subnets`: the subnets a launch may use (empty: one, chosen by EC2). A type counts as refused for
      capacity only while it is refused in every one of them (see backoff.py).
    - `max_unready_share`: the safety stop (safety.py): while more than this share of our nodes are
      down or unreachable (and at least two), scale-down and the termination of long-down machines (and
      of broken ones whose node is down) halt; scale-up goes on (1 = never).
    - `max_machine_age`: a machine older than this is replaced, replacement first (drift.py; 0 = never).
    - `budgets`: disruption budgets (`Budget`, core/budgets.py); none: no bound.
    - `join_paused`: machines join the swarm paused (the dynamic mode's boot script), and the planner
      sets a node active once it takes it in (see `cluster` and `marks.accept_joined`): a paused node
      never accepted is still joining, so a machine nobody accepted never takes a task.
    - `adopt_by_address` / `adopt_by_identity`: only a node at the instance's `private_ip` / labelled with
      its id (or ours already) matches it; an impostor with its hostname stays unowned (`cluster.classify`).
    - `idle_learning` / `idle_floor`: idle machines of a type whose next task is expected later than a
      relaunch would cost are drained and terminated after `idle_floor` instead of the delays above
      (core/arrivals.py: the ski-rental break-even from the arrivals seen).
    """

    allowed_types: tuple[TypePolicy, ...]
    min_instances: int = 0
    max_instances: int = 10
    max_start_time: float = 600.0
    drain_delay: float = 60.0
    termination_delay: float = 60.0  # the daemon's default (config/settings.py)
    node_down_timeout: float = 300.0
    max_launch_per_tick: int = 0
    consolidate_below: float = 0.5
    consolidate_under_load: bool = True
    tolerated_wait: float = 120.0
    subnets: tuple[str, ...] = ()
    join_paused: bool = False
    adopt_by_address: bool = False
    adopt_by_identity: bool = False
    idle_learning: bool = True
    idle_floor: float = 5.0
    max_unready_share: float = 0.45
    budgets: tuple[Budget, ...] = ()
    max_machine_age: float = 0.0

    def type_policy(self, name: str) -> TypePolicy | None:
        for tp in self.allowed_types:
            if tp.name == name:
                return tp
        return None
