"""The dask scheduler behind the `Workload` port, read as data, never as code.

**No dask client in the daemon.** distributed's own comm unpickles whatever the scheduler answers, and
every holder of a client of that scheduler can make it answer anything (`run_on_scheduler` replaces its
handlers): with a dask `Client` the daemon would run their code with its rights (EC2, the docker socket).
So the adapter installs plain-data handlers on the scheduler once (`dask_handlers.INSTALL`, sent with
the scheduler's own `run_function`, whose pickled answer is never opened) and then speaks to them with
`dask_wire.call`: each answer decoded by plain msgpack, bounded (`STATE_LIMIT`), its shape checked (an
answer it cannot read is an `EndpointError`, never code run). A scheduler that restarted does not know
the handlers (it answers `None`): the adapter installs them again and retries once. The daemon is not a
client of the scheduler (it is not in `scheduler.clients`, and a keeper counting clients counts users
only).

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

Scheduler-side code (`dask_handlers.py`): `observe()` (and `list_workers()`, its cheap subset) is one
call of the state handler, which copies the state into plain lists and dicts. Change notifications come
from the watch plugin there, which counts a change when a task becomes unrunnable (`no-worker`) or
`queued`, when a worker gets more work than it can run at once, and when a worker leaves, coalesced over
`COALESCE` seconds; `wait_for_change` is one long-polling call of the wait handler (the count and the
watch's epoch are plain numbers and a string).

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

Why one file of this size: one class implements the whole port, and each method checks the shape of its
handler's answer beside the call that asked for it (the scheduler side is `dask_handlers.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from distributed.protocol.pickle import dumps

from swarm_autoscaler.adapters.dask_check import MIN_DISTRIBUTED, SchedulerCheck, cordon_problem
from swarm_autoscaler.adapters.dask_fence import DEFAULT_FENCE_TTL
from swarm_autoscaler.adapters.dask_handlers import INSTALL, LAUNCH_HOLD_KEY, OPS
from swarm_autoscaler.adapters.dask_versions import VersionWarnings
from swarm_autoscaler.adapters.dask_wire import WireError, call, client_context
from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.model import Resources, Task, Worker
from swarm_autoscaler.core.ports import Fence, WorkloadView
from swarm_autoscaler.errors import ConfigurationError, EndpointError

__all__ = ["LAUNCH_HOLD_KEY", "PIN_PREFIX", "DaskWorkload", "split_resources"]

PIN_PREFIX = "instance-type:"
DEFAULT_HOSTNAME_PATTERN = r"(?P<hostname>.+)"
# Bytes of one answer read at most: a state of tens of thousands of tasks (about 100 bytes each) fits;
# a scheduler that sends more is not read (an EndpointError), so it cannot exhaust the daemon's memory.
STATE_LIMIT = 64 * 1024 * 1024
_SMALL = 1024 * 1024  # an install's or a wait's answer
_RETIRING_STATUSES = frozenset({"closing_gracefully", "closing", "closed"})
_UNREADABLE = (KeyError, TypeError, ValueError, IndexError, AttributeError)


class SchedulerRaised(EndpointError):
    """The scheduler answered a handler's call with an error (its text, never its pickled exception)."""


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


def _error_text(answer: Any) -> str:
    """What a handler error says (distributed's `error_message`: texts beside a pickled exception that is
    never opened), or the answer's type."""
    if isinstance(answer, dict):
        text = answer.get("exception_text") or answer.get("message") or answer.get("status")
        return str(text)[:300]
    return f"an answer of type {type(answer).__name__}"


class DaskWorkload:
    """`ports.Workload` on a dask scheduler, through plain-data handlers (see the module's notes).

    Each call opens one connection (TLS with `tls_files`: CA, certificate, key) and is bounded by
    `timeout` seconds, except retirement, bounded by `retire_timeout` (moving a retiring worker's data can
    take a while), and the long-polling wait. An unreachable scheduler, a closed connection, a timeout,
    an answer that is not the expected data, or an error raised on the scheduler raise `EndpointError`
    naming the scheduler address. `close()` (or `async with`) is kept for the port's lifecycle; no
    connection outlives a call.
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
        self._tls_files = tls_files
        self._context: ssl.SSLContext | None = None
        self._pattern = worker_hostname_pattern
        self._fence_ttl = fence_ttl
        self._clock = clock
        self._hostname = _HostnameMatcher(worker_hostname_pattern)
        self._timeout = timeout
        self._retire_timeout = retire_timeout
        self._endpoint = f"dask scheduler {scheduler_address}"
        self._installed = False
        self._installing = asyncio.Lock()
        self._seen: tuple[str, int] | None = None  # the watch's (epoch, changes) at the last observe
        self.checked: SchedulerCheck | None = None
        self.versions = VersionWarnings()  # Python/distributed disagreements, each logged once

    # --- the Workload port ------------------------------------------------------------------------

    async def observe(self) -> WorkloadView:
        """Workers (with processing tasks), unrunnable and queued tasks, from one scheduler call."""
        state = await self._op("state", {"workers_only": False}, limit=STATE_LIMIT)
        now = self._clock()
        try:
            # Changes before this read are seen by it; only later ones should wake wait_for_change.
            self._seen = _changes(state["changes"])
            self.versions.check(state.get("versions") or {})
            return WorkloadView(
                workers=tuple(self._worker(raw, now) for raw in state["workers"]),
                unrunnable=tuple(_task(raw, now) for raw in state["unrunnable"]),
                queued=tuple(_task(raw, now) for raw in state["queued"]),
                launch_hold=str(state.get("hold") or "")[:500],
            )
        except _UNREADABLE as exc:
            raise self._not_data("state", exc) from None

    async def list_workers(self) -> tuple[Worker, ...]:
        """The workers only (as `observe` reports them), from one scheduler call that leaves out the
        unrunnable and queued tasks. Does not consume change notifications."""
        state = await self._op("state", {"workers_only": True}, limit=STATE_LIMIT)
        now = self._clock()
        try:
            return tuple(self._worker(raw, now) for raw in state["workers"])
        except _UNREADABLE as exc:
            raise self._not_data("workers", exc) from None

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Retire gracefully (close and remove); return those no longer known to the scheduler after.

        The scheduler first copies data held only by a retiring worker to another worker; when no
        other worker can take it (e.g. it is the last one) it keeps the worker, which is then not
        reported. The result is checked against a fresh read of the worker list.
        """
        before = await self._addresses()
        known = [a for a in dict.fromkeys(addresses) if a in before]
        if not known:
            return ()
        retiring = self._op("retire", {"addresses": known}, timeout=self._retire_timeout + self._timeout)
        with contextlib.suppress(TimeoutError):
            # On timeout the scheduler carries on; whatever already left is reported below.
            await asyncio.wait_for(retiring, self._retire_timeout)
        after = await self._addresses()
        return tuple(a for a in known if a not in after)

    async def _addresses(self) -> set[str]:
        answer = await self._op("addresses", {})
        try:
            return {str(a) for a in answer["addresses"]}
        except _UNREADABLE as exc:
            raise self._not_data("addresses", exc) from None

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
        wanted = list(dict.fromkeys(addresses))
        answer = await self._op("status", {"addresses": wanted, "status": status})
        try:
            return tuple(str(a) for a in answer["done"])
        except _UNREADABLE as exc:
            raise self._not_data("status", exc) from None

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
        try:
            workers = tuple(self._worker(raw, now) for raw in state["workers"])
            return Fence(workers, tuple(str(h) for h in state["refused"]))
        except _UNREADABLE as exc:
            raise self._not_data("fence", exc) from None

    async def unfence(self, hostnames: Sequence[str]) -> None:
        """Lift these hosts' fences; the workers they cordoned run again."""
        wanted = [h for h in dict.fromkeys(hostnames) if h]
        if wanted and self._can_fence:
            await self._fence_call(wanted, lift=True)

    @property
    def _can_fence(self) -> bool:
        return self.checked is None or self.checked.cordon is None

    async def _fence_call(self, hostnames: list[str], lift: bool) -> dict[str, Any]:
        arguments = {"hostnames": hostnames, "pattern": self._pattern, "ttl": self._fence_ttl, "lift": lift}
        answer = await self._op("fence", arguments, limit=STATE_LIMIT)
        if not isinstance(answer.get("workers"), list) or not isinstance(answer.get("refused"), list):
            raise self._not_data("fence", TypeError("workers, refused"))
        return answer

    async def wait_for_change(self, timeout: float) -> bool:
        """True as soon as the scheduler reports a change not yet seen by `observe()`; False on timeout.
        An unreachable scheduler is waited out quietly (False): the tick's `observe()` reports it, in one
        line, and that is enough."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            if self._seen is None:  # nothing observed yet: changes from now on count
                self._seen = await self._wait("", -1, 0.0)
            left = max(0.0, deadline - loop.time())
            found = await self._wait(self._seen[0], self._seen[1], left)
        except EndpointError:
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            return False
        if found == self._seen:
            return False
        self._seen = found
        return True

    async def _wait(self, epoch: str, since: int, seconds: float) -> tuple[str, int]:
        arguments = {"epoch": epoch, "since": since, "timeout": seconds}
        answer = await self._op("wait", arguments, timeout=seconds + self._timeout)
        try:
            return _changes([answer["epoch"], answer["changes"]])
        except _UNREADABLE as exc:
            raise self._not_data("wait", exc) from None

    # --- lifecycle --------------------------------------------------------------------------------

    async def check_scheduler(self) -> SchedulerCheck:
        """Once at start: install the handlers, probe the scheduler's version and the internals
        cordoning uses, and read its state once. Raises `EndpointError` when the scheduler is
        unreachable or its state cannot be read; a scheduler that cannot cordon is reported in the
        result (and remembered: the adapter then refuses to cordon)."""
        try:
            found = await self._op("probe", {})
            version = str(found["version"])
            problem = cordon_problem(version, list(found["status_change"]), bool(found["streams"]))
            packing = bool(found.get("packing"))
        except SchedulerRaised as exc:
            raise self._unreadable(exc, "unknown") from None
        except _UNREADABLE as exc:
            raise self._not_data("probe", exc) from None
        self.checked = SchedulerCheck(version, problem, packing)
        try:
            await self.observe()
        except SchedulerRaised as exc:  # raised on the scheduler: its distributed lacks what observe reads
            raise self._unreadable(exc, version) from None
        return self.checked

    async def connect(self) -> None:
        """Install the handlers now rather than on first use (to fail fast at start-up)."""
        await self._install()

    async def close(self) -> None:
        """Nothing stays open between calls; kept for the port's lifecycle."""

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
        detail = exc.detail if isinstance(exc, EndpointError) else f"{type(exc).__name__}: {exc}"
        return EndpointError(
            self._endpoint,
            f"its state cannot be read ({detail}); this autoscaler needs a dask "
            f"scheduler running distributed {minimum} or later (it runs {version})",
        )

    def _not_data(self, op: str, exc: Exception) -> EndpointError:
        return EndpointError(
            self._endpoint, f"its answer to {op} is not what the autoscaler reads ({type(exc).__name__})"
        )

    async def _op(
        self, name: str, arguments: dict[str, Any], *, timeout: float | None = None, limit: int = _SMALL
    ) -> dict[str, Any]:
        """One call of an installed handler; its answer, a map of plain data. Installs the handlers
        first, and again once when the scheduler does not know them (it restarted)."""
        await self._install()
        message = {"op": OPS[name], **arguments}
        answer = await self._send(message, timeout, limit)
        if answer is None:  # distributed answers None for an op it has no handler for
            self._installed = False
            await self._install()
            answer = await self._send(message, timeout, limit)
        if isinstance(answer, dict) and answer.get("status") in ("error", "uncaught-error"):
            raise SchedulerRaised(self._endpoint, f"{name} raised on the scheduler: {_error_text(answer)}")
        if not isinstance(answer, dict):
            raise EndpointError(self._endpoint, f"its answer to {name} is {_error_text(answer)}, not a map")
        return answer

    async def _install(self) -> None:
        if self._installed:
            return
        async with self._installing:
            if self._installed:
                return
            # The scheduler unpickles what we send (it runs its clients' code anyway); its answer
            # carries the function's result as a pickled frame, which is never opened: only `status`.
            function = dumps(INSTALL)  # type: ignore[no-untyped-call]
            message = {"op": "run_function", "function": function, "wait": True}
            answer = await self._send(message, None, _SMALL)
            if not isinstance(answer, dict) or answer.get("status") != "OK":
                raise SchedulerRaised(
                    self._endpoint, f"the autoscaler's handlers could not be installed: {_error_text(answer)}"
                )
            self._installed = True

    async def _send(self, message: dict[str, Any], timeout: float | None, limit: int) -> Any:
        try:
            return await call(self.address, self._tls(), message, timeout or self._timeout, limit)
        except TimeoutError:
            raise EndpointError(
                self._endpoint, "no answer in time; is a dask scheduler up and listening there?"
            ) from None
        except (OSError, WireError) as exc:  # ssl.SSLError is an OSError
            raise EndpointError(self._endpoint, f"{type(exc).__name__}: {exc}") from None

    def _tls(self) -> ssl.SSLContext | None:
        if self._tls_files is not None and self._context is None:
            try:
                self._context = client_context(*self._tls_files)
            except (OSError, ValueError) as exc:
                raise EndpointError(self._endpoint, f"its TLS files cannot be read: {exc}") from None
        return self._context

    def _worker(self, raw: Mapping[str, Any], now: float) -> Worker:
        resources, _pinned = split_resources(raw["resources"])
        if "CPU" not in raw["resources"]:  # a worker without a CPU resource runs nthreads tasks at once
            resources = resources + Resources(cpus=float(raw["nthreads"]))
        return Worker(
            address=str(raw["address"]),
            name=str(raw["name"]),
            hostname=self._hostname(str(raw["name"])),
            resources=resources,
            processing=tuple(_task(t, now) for t in raw["processing"]),
            has_unique_data=bool(raw["unique"]),
            retiring=raw["status"] in _RETIRING_STATUSES,
        )


def _changes(raw: Sequence[Any]) -> tuple[str, int]:
    """The watch's (epoch, count of changes), checked to be a string and an integer."""
    epoch, count = raw
    if not isinstance(epoch, str) or not isinstance(count, int):
        raise TypeError("changes")
    return epoch, count
