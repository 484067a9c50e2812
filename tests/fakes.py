"""In-memory implementations of our own ports, for the loop's tests. They follow the ports' contracts
(ports.py), record every call, and can be told to fail."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from swarm_autoscaler.core.model import (
    GIB,
    OWNERSHIP_LABEL,
    Instance,
    InstanceState,
    InstanceType,
    Policy,
    PoolPhase,
    Resources,
    Task,
    TypePolicy,
    Unavailable,
    Worker,
)
from swarm_autoscaler.core.ports import Fence, LaunchResult, WorkloadView
from swarm_autoscaler.errors import ConfigurationError, EndpointError

# A small fleet for the loop-level tests: two general-purpose types, no reserve, no minimum.
CATALOGUE = {
    "m5.large": InstanceType("m5.large", Resources(2, 8 * GIB), 0.096),
    "m5.xlarge": InstanceType("m5.xlarge", Resources(4, 16 * GIB), 0.192),
}


def small_policy(max_instances: int) -> Policy:
    return Policy(
        allowed_types=(TypePolicy("m5.large"), TypePolicy("m5.xlarge")),
        min_instances=0,
        max_instances=max_instances,
        max_start_time=300,
        drain_delay=30,
        termination_delay=60,
    )


@dataclass
class SteppedClock:
    """The only clock the loop sees in tests; `step` moves it forward."""

    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeCloud:
    clock: SteppedClock
    catalogue: Mapping[str, InstanceType]
    instances: dict[str, Instance] = field(default_factory=dict)
    calls: list[tuple[str, object]] = field(default_factory=list)
    fail_list: Exception | None = None
    fail_launch: Exception | None = None
    fail_terminate: Exception | None = None
    refuse_types: set[str] = field(default_factory=set)
    refusals: list[Unavailable] = field(default_factory=list)
    list_delay: float = 0.0  # seconds each listing takes (a slow EC2)
    # As Ec2Cloud: every listed instance of this cluster carries the ownership label for its node.
    cluster_name: str = ""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def now(self) -> float:
        """EC2's clock: the only one the daemon reads."""
        return self.clock()

    async def list_instances(self) -> tuple[Instance, ...]:
        self.calls.append(("list", None))
        if self.list_delay:
            await asyncio.sleep(self.list_delay)
        if self.fail_list is not None:
            raise self.fail_list
        if not self.cluster_name:
            return tuple(self.instances.values())
        owned = {OWNERSHIP_LABEL: self.cluster_name}
        return tuple(
            dataclasses.replace(i, labels=MappingProxyType({**i.labels, **owned}))
            for i in self.instances.values()
        )

    async def instance_types(self, names: Sequence[str]) -> tuple[InstanceType, ...]:
        unknown = [n for n in names if n not in self.catalogue]
        if unknown:
            raise ConfigurationError(f"unknown instance types: {unknown}")
        return tuple(self.catalogue[n] for n in names)

    async def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
    ) -> LaunchResult:
        self.calls.append(("launch", (type_name, count)))
        if self.fail_launch is not None:
            raise self.fail_launch
        if type_name in self.refuse_types:
            refusal = Unavailable(type_name, self.clock() + 30.0)
            self.refusals.append(refusal)
            return LaunchResult(refused=(refusal,))
        launched = []
        for _ in range(count):
            n = next(self._ids)
            inst = Instance(
                id=f"i-{n:08x}",
                type_name=type_name,
                state=InstanceState.PENDING,
                launched_at=self.clock(),
                hostname=f"ip-10-0-{n // 250}-{n % 250}",
                tags=dict(labels),
                labels=dict(labels),
                pool=PoolPhase.PREPARE if pool else None,
            )
            self.instances[inst.id] = inst
            launched.append(inst)
        return LaunchResult(instances=tuple(launched))

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        self.calls.append(("terminate", tuple(instance_ids)))
        if self.fail_terminate is not None:
            raise self.fail_terminate
        for iid in instance_ids:
            self.instances.pop(iid, None)

    async def start_instances(self, instance_ids: Sequence[str]) -> LaunchResult:
        """As Ec2Cloud: a stopped owned instance turns pending, tagged as started, its start time its
        `launched_at`; a type in `refuse_types` is refused for capacity (backed off in `refusals`)."""
        self.calls.append(("start", tuple(instance_ids)))
        started, refused = [], []
        for iid in instance_ids:
            inst = self.instances.get(iid)
            if inst is None or inst.state != InstanceState.STOPPED:
                continue
            if inst.type_name in self.refuse_types:
                refusal = Unavailable(inst.type_name, self.clock() + 30.0, inst.subnet_id)
                self.refusals.append(refusal)
                refused.append(refusal)
                continue
            inst = dataclasses.replace(
                inst, state=InstanceState.PENDING, pool=PoolPhase.START, launched_at=self.clock()
            )
            self.instances[iid] = inst
            started.append(inst)
        return LaunchResult(tuple(started), tuple(refused))

    async def stop_instances(self, instance_ids: Sequence[str]) -> None:
        self.calls.append(("stop", tuple(instance_ids)))
        for iid in instance_ids:
            inst = self.instances.get(iid)
            if inst is not None and inst.alive:
                self.instances[iid] = dataclasses.replace(inst, state=InstanceState.STOPPED)

    def unavailable(self, now: float) -> tuple[Unavailable, ...]:
        return tuple(u for u in self.refusals if u.until > now)


@dataclass
class FakeWorkload:
    workers: list[Worker] = field(default_factory=list)
    unrunnable: list[Task] = field(default_factory=list)
    queued: list[Task] = field(default_factory=list)  # held in the scheduler's own queue
    fail_observe: Exception | None = None
    fail_retire: Exception | None = None
    keep_on_retire: set[str] = field(default_factory=set)
    retired: list[str] = field(default_factory=list)
    cordoned: list[tuple[str, bool]] = field(default_factory=list)  # (address, cordoned or uncordoned)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    waits: int = 0
    worker_reads: int = 0
    # Fences, as the scheduler keeps them: host -> the addresses the fence cordoned.
    fences: dict[str, set[str]] = field(default_factory=dict)
    fence_calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # ("fence"/"unfence", hosts)
    fail_fence: Exception | None = None
    # The world moving on: run after each read of the workers (after it was taken) and after each fence.
    after_read: list[Callable[[], None]] = field(default_factory=list)
    after_fence: list[Callable[[], None]] = field(default_factory=list)

    async def observe(self) -> WorkloadView:
        if self.fail_observe is not None:
            raise self.fail_observe
        return WorkloadView(tuple(self.workers), tuple(self.unrunnable), tuple(self.queued))

    async def list_workers(self) -> tuple[Worker, ...]:
        self.worker_reads += 1
        if self.fail_observe is not None:
            raise self.fail_observe
        read = tuple(self.workers)
        for event in self.after_read:
            event()
        return read

    async def fence(self, hostnames: Sequence[str]) -> Fence:
        """As the dask adapter: idle workers on the hosts are cordoned, busy hosts refused, the workers
        there returned as they are once fenced; later workers on a fenced host join cordoned."""
        self.fence_calls.append(("fence", tuple(hostnames)))
        if self.fail_fence is not None:
            raise self.fail_fence
        wanted = set(hostnames) - {""}
        refused = {w.hostname for w in self.workers if w.hostname in wanted and w.busy}
        for host in wanted - refused:
            cordoned = self.fences.setdefault(host, set())
            fresh = {w.address for w in self.workers if w.hostname == host and not w.retiring}
            cordoned |= set(self._flag(tuple(fresh), True))
        fence = Fence(tuple(w for w in self.workers if w.hostname in wanted), tuple(sorted(refused)))
        for event in self.after_fence:
            event()
        return fence

    async def unfence(self, hostnames: Sequence[str]) -> None:
        self.fence_calls.append(("unfence", tuple(hostnames)))
        for host in hostnames:
            self._flag(tuple(self.fences.pop(host, set())), False)

    def connect(self, worker: Worker) -> Worker:
        """A worker joins; on a fenced host it is cordoned as it is added (before any task)."""
        if worker.hostname in self.fences:
            worker = dataclasses.replace(worker, retiring=True)
            self.fences[worker.hostname].add(worker.address)
        self.workers.append(worker)
        return worker

    def give(self, address: str, task: Task) -> bool:
        """The scheduler hands `task` to the worker at `address`, unless it is cordoned (or gone)."""
        for i, w in enumerate(self.workers):
            if w.address == address and not w.retiring:
                self.workers[i] = dataclasses.replace(w, processing=(*w.processing, task))
                return True
        return False

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        if self.fail_retire is not None:
            raise self.fail_retire
        gone = tuple(a for a in addresses if a not in self.keep_on_retire)
        self.workers = [w for w in self.workers if w.address not in gone]
        self.retired.extend(gone)
        # as dask may: a worker it refused to retire is left closing_gracefully
        kept = {a for a in addresses if a in self.keep_on_retire}
        self.workers = [
            dataclasses.replace(w, retiring=True) if w.address in kept else w for w in self.workers
        ]
        return gone

    async def cordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return self._set_retiring(addresses, True)

    async def uncordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return self._set_retiring(addresses, False)

    def _set_retiring(self, addresses: Sequence[str], on: bool) -> tuple[str, ...]:
        """A cordon or uncordon (recorded in `cordoned`)."""
        done = self._flag(addresses, on)
        self.cordoned.extend((a, on) for a in done)
        return done

    def _flag(self, addresses: Sequence[str], on: bool) -> tuple[str, ...]:
        """The scheduler's view of a cordoned worker: `retiring` (closing_gracefully)."""
        done = tuple(w.address for w in self.workers if w.address in addresses)
        self.workers = [dataclasses.replace(w, retiring=on) if w.address in done else w for w in self.workers]
        return done

    async def wait_for_change(self, timeout: float) -> bool:
        self.waits += 1
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            return False
        self.changed.clear()
        return True


@dataclass
class FakeLock:
    """A lock shared by fake replicas: `holder` is the token of the replica that holds it."""

    token: str
    state: dict[str, str | None] = field(default_factory=lambda: {"holder": None})
    fail: bool = False
    lose_on_extend: bool = False

    async def acquire(self) -> bool:
        if self.fail:
            raise EndpointError("redis://fake", "connection refused")
        if self.state["holder"] in (None, self.token):
            self.state["holder"] = self.token
            return True
        return False

    async def extend(self) -> bool:
        if self.lose_on_extend:
            self.state["holder"] = "someone-else"
        return self.state["holder"] == self.token

    async def release(self) -> None:
        if self.state["holder"] == self.token:
            self.state["holder"] = None
