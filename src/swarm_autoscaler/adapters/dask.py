"""The dask scheduler behind the `Workload` port, with `distributed`'s asynchronous client.

Resource conventions (what workers advertise with `--resources` and tasks request with
`client.submit(..., resources=...)`):

- `CPU`, `RAM` (bytes) and `GPU` become `Resources.cpus`, `.ram` and `.gpus`; any other name becomes a
  generic resource.
- **Pinning a task to an instance type**: the task requests the resource `instance-type:<type name>`
  (any positive amount, e.g. `{"CPU": 1, "instance-type:g4dn.xlarge": 1}`), and workers on a machine
  of that type advertise the same resource with an amount no task set will exhaust (e.g.
  `--resources "CPU=4,RAM=16e9,instance-type:g4dn.xlarge=1e9"`). Because it is a real dask resource
  restriction, dask itself keeps the task off other workers, so it stays unrunnable until a machine
  of that type joins. The adapter strips it from the needs and reports it as `Task.pinned_type`
  (and strips it from a worker's resources). A task naming several types keeps the first by name.
- A worker's `Resources` are exactly what it advertises: a worker started without `CPU`/`RAM`
  resources cannot run tasks that request them, and dask agrees.
- `Worker.hostname` is the named group `hostname` of `worker_hostname_pattern` matched (with
  `re.fullmatch`) against the worker's name; a name that does not match gives an empty hostname.

Scheduler-side code: `observe()` (and `list_workers()`, its cheap subset) runs one function on the scheduler (`run_on_scheduler`) that copies
the state into plain lists and dicts. Change notifications come from a small `SchedulerPlugin`
registered under the name `swarm-autoscaler-watch`, which publishes on the event topic
`swarm-autoscaler-change` when a task becomes unrunnable (`no-worker`) or `queued`, when a worker gets
more work than it can run at once, and when a worker leaves; notifications are coalesced over
`_COALESCE` seconds. Both are built inside factory functions so that cloudpickle ships them *by value*:
the scheduler does not need this package installed, only `distributed`. They must therefore use
nothing but builtins and their own arguments.

Cordoning a worker sets its status to `closing_gracefully` on the scheduler and on the worker, the
first step of dask's own `retire_workers`, without the rest: the scheduler gives it no new task, the
worker starts none (its executing tasks finish), and it stays connected. Uncordoning sets `running`
again on both, and the worker starts what waits on it. A task is reported `executing` when the
worker's last heartbeat listed it as running; it then carries `started` (the daemon's clock less the
seconds the heartbeat says it has run). Every task carries `expected`, its prefix's duration estimate
(`TaskPrefix.duration_average`; None while dask has none: before a task of the prefix finished, or once
one runs past twice the estimate), and `do_not_disrupt` when it carries that annotation (`with
dask.annotate(do_not_disrupt=True)`: its machine is never disrupted while it runs, core/budgets.py).

Fencing a host (`fence`, before a termination) cordons its idle workers and, through a second plugin
(`swarm-autoscaler-fence-v1`, installed by the first fence call itself), every worker that connects later
from that host, before the scheduler can give it a task; fences expire after `fence_ttl` seconds.

**Scheduler version.** Cordoning calls scheduler internals (`Scheduler.handle_worker_status_change` and
the `worker-status-change` stream op), and `observe()` reads scheduler state (`unrunnable`, `queued`, each
worker's `processing` and `executing`). `check_scheduler()`, run once at start, reads the scheduler's
distributed version and probes for those internals: a scheduler whose state cannot be read fails the
start (`EndpointError`); one that reads but cannot cordon (distributed older than `MIN_DISTRIBUTED`, or
without `handle_worker_status_change(status, worker, stimulus_id)`) is reported in `SchedulerCheck.cordon`,
and the adapter then refuses to cordon rather than call what is not there. Tested with the distributed
this package pins.

Tasks the scheduler keeps in its own queue (`queued`: unrestricted root tasks held back while every
worker is saturated) are neither unrunnable nor processing; `observe()` returns them in
`WorkloadView.queued`; the planner counts them as pending. A task with no `CPU` restriction needs
one CPU (it occupies one of a worker's threads), and a worker that advertises no `CPU` has `nthreads` CPUs.

Why one file of this size: the scheduler-side functions shipped by value and the client code that reads
their output are the two halves of one wire format, kept together so that they change together.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from distributed import Client as _Client
from distributed.security import Security

from swarm_autoscaler.adapters.dask_check import MIN_DISTRIBUTED, PROBE, SchedulerCheck, cordon_problem
from swarm_autoscaler.adapters.dask_fence import _FENCE, DEFAULT_FENCE_TTL, FENCE_PLUGIN, _make_recorders
from swarm_autoscaler.adapters.dask_versions import READ_VERSIONS, VersionWarnings
from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.model import Resources, Task, Worker
from swarm_autoscaler.core.ports import Fence, WorkloadView
from swarm_autoscaler.errors import ConfigurationError, EndpointError

PIN_PREFIX = "instance-type:"
PLUGIN_NAME = "swarm-autoscaler-watch"
# The autoscaler's own client is named (its id on the scheduler starts `Client-swarm-autoscaler-`), so
# whoever counts a scheduler's clients (the keeper: "no client, no cluster") can leave it out.
CLIENT_NAME = "swarm-autoscaler"
# Scheduler metadata a keeper sets to hold this cluster's launches (its wallet's budget is spent): the
# reason, or "" for none. Read with every observe.
LAUNCH_HOLD_KEY = "swarm-autoscaler-launch-hold"
CHANGE_TOPIC = "swarm-autoscaler-change"
DEFAULT_HOSTNAME_PATTERN = r"(?P<hostname>.+)"
_COALESCE = 0.1
_DEAD_CLIENT_STATUSES = frozenset({"closing", "closed"})
_RETIRING_STATUSES = frozenset({"closing_gracefully", "closing", "closed"})

T = TypeVar("T")

# distributed ships no type hints for Client; treat it as dynamic in one place.
Client: Any = _Client

# --------------------------------------------------------------------------------------------- scheduler side


def _make_state_reader() -> Callable[..., dict[str, Any]]:
    """The function `observe()` runs on the scheduler. Nested so cloudpickle sends it by value."""
    task, record = _make_recorders()
    versions = READ_VERSIONS

    def read_state(dask_scheduler: Any, plugin_name: str, workers_only: bool = False) -> dict[str, Any]:
        workers = [record(ws) for ws in dask_scheduler.workers.values()]
        if workers_only:  # the cheap re-read before a disruptive action: thousands of tasks skipped
            return {"workers": workers}
        hold = dask_scheduler.task_metadata.get("swarm-autoscaler-launch-hold")  # LAUNCH_HOLD_KEY
        return {
            "versions": versions(dask_scheduler),
            "workers": workers,
            "unrunnable": [task(ts) for ts in dask_scheduler.unrunnable],
            "queued": [task(ts) for ts in dask_scheduler.queued],
            "watching": plugin_name in dask_scheduler.plugins,
            "hold": hold if isinstance(hold, str) else "",
        }

    return read_state


def _make_address_reader() -> Callable[..., list[str]]:
    def read_addresses(dask_scheduler: Any) -> list[str]:
        return list(dask_scheduler.workers)

    return read_addresses


# Nested functions (qualname "<locals>") are pickled by value; module-level ones would be by reference.
_READ_STATE = _make_state_reader()
_READ_ADDRESSES = _make_address_reader()


def _make_status_setter() -> Callable[..., list[str]]:
    def set_status(dask_scheduler: Any, addresses: list[str], status: str) -> list[str]:
        """Set `status` ("closing_gracefully" to cordon, "running" to uncordon) on the scheduler and on
        each worker; return the addresses that have it. A cordon only applies to a running or paused
        worker, an uncordon only to a closing_gracefully one."""
        import time

        allowed = ("running", "paused") if status == "closing_gracefully" else ("closing_gracefully",)
        done = []
        for address in addresses:
            ws = dask_scheduler.workers.get(address)
            if ws is None:
                continue
            if ws.status.name in allowed:
                stimulus_id = f"swarm-autoscaler-{status}-{time.time()}"
                dask_scheduler.handle_worker_status_change(status, ws, stimulus_id)
                dask_scheduler.stream_comms[address].send(
                    {"op": "worker-status-change", "status": status, "stimulus_id": stimulus_id}
                )
            if ws.status.name == status:
                done.append(address)
        return done

    return set_status


_SET_STATUS = _make_status_setter()


def _make_oversubscribed() -> Callable[[Any, Any], bool]:
    def oversubscribed(scheduler: Any, key: Any) -> bool:
        """True when the task just put in processing waits behind others on its worker."""
        ts = scheduler.tasks.get(key)
        ws = ts.processing_on if ts is not None else None
        if ws is None:
            return False
        if len(ws.processing) > ws.nthreads:
            return True
        needs = ts.resource_restrictions or {}
        return any(ws.used_resources.get(r, 0) > ws.resources.get(r, 0) for r in needs)

    return oversubscribed


def _make_watch_plugin(name: str, topic: str, coalesce: float) -> Any:
    """A SchedulerPlugin publishing on `topic` when work waits for capacity or a worker leaves."""
    # Imported here so that they are bound in the closure and the plugin pickles by value.
    import asyncio as aio

    from distributed.diagnostics.plugin import SchedulerPlugin

    oversubscribed = _make_oversubscribed()

    class ChangeWatch(SchedulerPlugin):
        idempotent = True

        def __init__(self) -> None:
            self.name = name
            self.scheduler: Any = None
            self.reasons: set[str] = set()

        async def start(self, scheduler: Any) -> None:
            self.scheduler = scheduler

        def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
            if finish in ("no-worker", "queued"):
                self.notify(finish)
            elif finish == "processing" and self.scheduler and oversubscribed(self.scheduler, key):
                self.notify("queued-on-worker")

        def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
            self.notify("worker-left")

        def notify(self, reason: str) -> None:
            first = not self.reasons
            self.reasons.add(reason)
            if first:
                try:
                    aio.get_running_loop().call_later(coalesce, self.flush)
                except RuntimeError:  # not on the event loop: publish now
                    self.flush()

        def flush(self) -> None:
            reasons, self.reasons = sorted(self.reasons), set()
            if self.scheduler is not None and reasons:
                self.scheduler.log_event(topic, {"reasons": reasons})

    return ChangeWatch()


# --------------------------------------------------------------------------------------------- translation


def split_resources(raw: Mapping[str, float]) -> tuple[Resources, str | None]:
    """Dask resources -> (model Resources, pinned instance type or None), per the module's conventions."""
    cpus, ram, gpus = 0.0, 0, 0
    generic: dict[str, float] = {}
    pinned: list[str] = []
    for name, amount in raw.items():
        if name.startswith(PIN_PREFIX):
            if amount > 0:
                pinned.append(name.removeprefix(PIN_PREFIX))
        elif name == "CPU":
            cpus = float(amount)
        elif name == "RAM":
            ram = int(amount)
        elif name == "GPU":
            gpus = round(amount)
        else:
            generic[name] = float(amount)
    return Resources.of(cpus, ram, gpus, **generic), min(pinned) if pinned else None


def _task(raw: Sequence[Any], now: float) -> Task:
    """A task without a `CPU` restriction still occupies one of a worker's threads: it needs 1 CPU.
    `raw` holds the seconds it has run (None unless executing), its prefix's duration estimate and
    whether it carries the `do_not_disrupt` annotation (absent from a fence plugin of an older daemon)."""
    key, restrictions, elapsed, expected = raw[:4]
    needs, pinned = split_resources(restrictions)
    if "CPU" not in restrictions:
        needs = needs + Resources(cpus=1.0)
    started = now - float(elapsed) if elapsed is not None else None
    return Task(
        key=key,
        needs=needs,
        pinned_type=pinned,
        executing=elapsed is not None,
        expected=expected,
        started=started,
        do_not_disrupt=bool(raw[4]) if len(raw) > 4 else False,
    )


class _HostnameMatcher:
    def __init__(self, pattern: str) -> None:
        try:
            self._regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigurationError(f"worker hostname pattern {pattern!r} is not a regex: {exc}") from None
        if "hostname" not in self._regex.groupindex:
            raise ConfigurationError(
                f"worker hostname pattern {pattern!r} needs a named group: (?P<hostname>...)"
            )

    def __call__(self, name: str) -> str:
        match = self._regex.fullmatch(name)
        return machine_hostname(match.group("hostname") or "") if match else ""


# --------------------------------------------------------------------------------------------- adapter


def _security(tls_files: tuple[str, str, str] | None) -> Any:
    """dask's TLS settings from (CA, certificate, key) PEM files; None: plain tcp://."""
    if tls_files is None:
        return None
    ca, cert, key = tls_files
    return Security(  # type: ignore[no-untyped-call]
        tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True
    )


class DaskWorkload:
    """`ports.Workload` on a dask scheduler.

    One asynchronous `Client` is created on first use and reused; `close()` (or `async with`) closes
    it. Every scheduler call is bounded by `timeout` seconds except retirement, bounded by
    `retire_timeout` (moving a retiring worker's data can take a while). Unreachable scheduler,
    closed connection or a timeout raise `EndpointError` naming the scheduler address.
    """

    def __init__(
        self,
        scheduler_address: str,
        worker_hostname_pattern: str = DEFAULT_HOSTNAME_PATTERN,
        *,
        timeout: float = 10.0,
        retire_timeout: float = 300.0,
        fence_ttl: float = DEFAULT_FENCE_TTL,
        clock: Callable[[], float] = time.time,
        tls_files: tuple[str, str, str] | None = None,
    ) -> None:
        self.address = scheduler_address
        self._security = _security(tls_files)
        self._pattern = worker_hostname_pattern
        self._fence_ttl = fence_ttl
        self._clock = clock
        self._hostname = _HostnameMatcher(worker_hostname_pattern)
        self._timeout = timeout
        self._retire_timeout = retire_timeout
        self._endpoint = f"dask scheduler {scheduler_address}"
        self._client: Any = None
        self._connecting = asyncio.Lock()
        self._changed = asyncio.Event()
        self.checked: SchedulerCheck | None = None
        self.versions = VersionWarnings()  # Python/distributed disagreements, each logged once

    # --- the Workload port ------------------------------------------------------------------------

    async def observe(self) -> WorkloadView:
        """Workers (with processing tasks), unrunnable and queued tasks, from one scheduler call."""
        client = await self._connected()
        # Changes before this read are seen by it; only later ones should wake wait_for_change.
        self._changed.clear()
        state = await self._call(client.run_on_scheduler(_READ_STATE, plugin_name=PLUGIN_NAME))
        if not state["watching"]:  # the scheduler restarted since we registered: watch again
            await self._watch(client)
        self.versions.check(state.get("versions") or {})
        now = self._clock()
        return WorkloadView(
            workers=tuple(self._worker(raw, now) for raw in state["workers"]),
            unrunnable=tuple(_task(raw, now) for raw in state["unrunnable"]),
            queued=tuple(_task(raw, now) for raw in state["queued"]),
            launch_hold=str(state.get("hold") or "")[:500],
        )

    async def list_workers(self) -> tuple[Worker, ...]:
        """The workers only (as `observe` reports them), from one scheduler call that leaves out the
        unrunnable and queued tasks. Does not consume change notifications."""
        client = await self._connected()
        read = client.run_on_scheduler(_READ_STATE, plugin_name=PLUGIN_NAME, workers_only=True)
        state = await self._call(read)
        now = self._clock()
        return tuple(self._worker(raw, now) for raw in state["workers"])

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Retire gracefully (close and remove); return those no longer known to the scheduler after.

        The scheduler first copies data held only by a retiring worker to another worker; when no
        other worker can take it (e.g. it is the last one) it keeps the worker, which is then not
        reported. The result is checked against a fresh read of the worker list.
        """
        client = await self._connected()
        before = set(await self._call(client.run_on_scheduler(_READ_ADDRESSES)))
        known = [a for a in dict.fromkeys(addresses) if a in before]
        if not known:
            return ()
        retiring = client.retire_workers(workers=known, close_workers=True, remove=True)
        with self._translated_errors(), contextlib.suppress(TimeoutError):
            # On timeout the scheduler carries on; whatever already left is reported below.
            await asyncio.wait_for(retiring, self._retire_timeout)
        after = set(await self._call(client.run_on_scheduler(_READ_ADDRESSES)))
        return tuple(a for a in known if a not in after)

    async def cordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Stop the scheduler giving these workers new tasks (they finish what they run)."""
        return await self._set_status(addresses, "closing_gracefully")

    async def uncordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Let cordoned workers take and start tasks again."""
        return await self._set_status(addresses, "running")

    async def _set_status(self, addresses: Sequence[str], status: str) -> tuple[str, ...]:
        if not addresses:
            return ()
        if self.checked is not None and self.checked.cordon is not None:
            raise EndpointError(self._endpoint, f"cannot cordon or uncordon: {self.checked.cordon}")
        client = await self._connected()
        wanted = list(dict.fromkeys(addresses))
        done = await self._call(client.run_on_scheduler(_SET_STATUS, addresses=wanted, status=status))
        return tuple(done)

    async def fence(self, hostnames: Sequence[str]) -> Fence:
        """Fence these hosts in one scheduler call (see the module's notes and `ports.Workload.fence`);
        the workers there, as they are once fenced, and the hosts refused for a busy worker. On a
        scheduler that cannot cordon (`SchedulerCheck.cordon`) nothing is fenced: the same answer comes
        from a plain read of the workers, so terminations are re-checked as before, not blocked."""
        wanted = [h for h in dict.fromkeys(hostnames) if h]
        if not wanted:
            return Fence()
        if not self._can_fence:
            on_hosts = tuple(w for w in await self.list_workers() if w.hostname in wanted)
            return Fence(on_hosts, tuple(sorted({w.hostname for w in on_hosts if w.busy})))
        state = await self._fence_call(wanted, lift=False)
        now = self._clock()
        return Fence(tuple(self._worker(raw, now) for raw in state["workers"]), tuple(state["refused"]))

    async def unfence(self, hostnames: Sequence[str]) -> None:
        """Lift these hosts' fences; the workers they cordoned run again."""
        wanted = [h for h in dict.fromkeys(hostnames) if h]
        if wanted and self._can_fence:
            await self._fence_call(wanted, lift=True)

    @property
    def _can_fence(self) -> bool:
        return self.checked is None or self.checked.cordon is None

    async def _fence_call(self, hostnames: list[str], lift: bool) -> dict[str, Any]:
        client = await self._connected()
        call = client.run_on_scheduler(
            _FENCE,
            plugin_name=FENCE_PLUGIN,
            hostnames=hostnames,
            pattern=self._pattern,
            ttl=self._fence_ttl,
            lift=lift,
        )
        result: dict[str, Any] = await self._call(call)
        return result

    async def wait_for_change(self, timeout: float) -> bool:
        """True as soon as the scheduler reports a change not yet seen by `observe()`; False on timeout.
        An unreachable scheduler is waited out quietly (False): the tick's `observe()` reports it, in one
        line, and that is enough."""
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            await self._connected()
        except EndpointError:
            await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
            return False
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            return False
        self._changed.clear()
        return True

    # --- lifecycle --------------------------------------------------------------------------------

    async def check_scheduler(self) -> SchedulerCheck:
        """Once at start: connect, read the scheduler's state once and probe its version and the
        internals cordoning uses. Raises `EndpointError` when the scheduler is unreachable or its state
        cannot be read; a scheduler that cannot cordon is reported in the result (and remembered: the
        adapter then refuses to cordon)."""
        client = await self._connected()
        try:
            found = await self._call(client.run_on_scheduler(PROBE))
        except EndpointError:
            raise
        except Exception as exc:  # raised on the scheduler
            raise self._unreadable(exc, "unknown") from None
        problem = cordon_problem(found["version"], found["status_change"], found["streams"])
        self.checked = SchedulerCheck(found["version"], problem, bool(found.get("packing")))
        try:
            await self.observe()
        except EndpointError:
            raise
        except Exception as exc:  # raised on the scheduler: its distributed lacks what observe reads
            raise self._unreadable(exc, found["version"]) from None
        return self.checked

    async def connect(self) -> None:
        """Connect now rather than on first use (to fail fast at start-up)."""
        await self._connected()

    async def close(self) -> None:
        await self._discard_client()

    async def _discard_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self._timeout)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- plumbing ---------------------------------------------------------------------------------

    def _unreadable(self, exc: Exception, version: str) -> EndpointError:
        minimum = ".".join(map(str, MIN_DISTRIBUTED))
        return EndpointError(
            self._endpoint,
            f"its state cannot be read ({type(exc).__name__}: {exc}); this autoscaler needs a dask "
            f"scheduler running distributed {minimum} or later (it runs {version})",
        )

    async def _connected(self) -> Any:
        async with self._connecting:
            if self._client is not None and self._client.status in _DEAD_CLIENT_STATUSES:
                # The client gives up (and closes itself) when the scheduler stays away longer than
                # its reconnect timeout; start afresh, which also registers the watch again.
                await self._discard_client()
            if self._client is not None:
                return self._client
            client = Client(
                self.address,
                name=CLIENT_NAME,
                asynchronous=True,
                timeout=self._timeout,
                set_as_default=False,
                security=self._security,
            )
            try:
                await self._call(client, self._timeout + 5)
                await self._watch(client)
            except BaseException:
                await client.close()
                raise
            self._client = client
            return client

    async def _watch(self, client: Any) -> None:
        client.subscribe_topic(CHANGE_TOPIC, self._on_change)
        plugin = _make_watch_plugin(PLUGIN_NAME, CHANGE_TOPIC, _COALESCE)
        await self._call(client.register_plugin(plugin, name=PLUGIN_NAME))

    def _on_change(self, event: Any) -> None:
        self._changed.set()

    async def _call(self, awaitable: Awaitable[T], timeout: float | None = None) -> T:
        with self._translated_errors():
            try:
                return await asyncio.wait_for(awaitable, timeout or self._timeout)
            except TimeoutError:
                raise EndpointError(
                    self._endpoint, "no answer in time; is a dask scheduler up and listening there?"
                ) from None

    @contextlib.contextmanager
    def _translated_errors(self) -> Iterator[None]:
        """distributed's connection failures -> EndpointError naming the scheduler."""
        try:
            yield
        except OSError as exc:  # ConnectionError and distributed's CommClosedError among them
            raise EndpointError(self._endpoint, f"{type(exc).__name__}: {exc}") from None
        except RuntimeError as exc:
            # The connection pool raises a bare RuntimeError once the client has closed itself.
            if self._client is None or self._client.status not in _DEAD_CLIENT_STATUSES:
                raise
            raise EndpointError(self._endpoint, f"connection lost ({exc}); will reconnect") from None

    def _worker(self, raw: Mapping[str, Any], now: float) -> Worker:
        resources, _pinned = split_resources(raw["resources"])
        if "CPU" not in raw["resources"]:  # a worker without a CPU resource runs nthreads tasks at once
            resources = resources + Resources(cpus=float(raw["nthreads"]))
        return Worker(
            address=raw["address"],
            name=raw["name"],
            hostname=self._hostname(raw["name"]),
            resources=resources,
            processing=tuple(_task(t, now) for t in raw["processing"]),
            has_unique_data=bool(raw["unique"]),
            retiring=raw["status"] in _RETIRING_STATUSES,
        )
