"""The dask adapter's scheduler side: plain-data handlers, installed on the scheduler once.

The daemon reads its scheduler as data, never as code (`dask_wire`): distributed's own client unpickles
whatever the scheduler answers, and anyone holding a client of that scheduler can make it answer
anything (`run_on_scheduler` replaces its handlers), so a dask `Client` in the daemon would hand the
daemon's rights (EC2 credentials, the docker socket) to every holder of a client.

So the daemon sends code one way only: `INSTALL`, pickled by us and run by the scheduler's own
`run_function` (whose answer, a pickled frame, the daemon never opens), registers on the scheduler:

- the change watch (`WATCH`, a `SchedulerPlugin`) that counts the changes worth a tick (a task became
  unrunnable or `queued`, a worker got more than it can run at once, a worker left), coalesced over
  `coalesce` seconds, under an `epoch` that is new with each scheduler;
- one comm handler per operation (`OPS`), each answering msgpack data only (dicts, lists, strings,
  numbers), so the daemon's `dask_wire.call` reads every answer with plain msgpack. A scheduler that
  does not know an op answers `None` (distributed's handler lookup), which tells the daemon to install
  again (a scheduler restarted since).

Everything here is built inside factory functions so that cloudpickle ships it *by value*: the scheduler
needs only `distributed`, not this package. It must therefore use nothing but builtins, its own
arguments and what the factories bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarm_autoscaler.adapters.dask_check import PROBE
from swarm_autoscaler.adapters.dask_fence import _FENCE, FENCE_PLUGIN, _make_recorders
from swarm_autoscaler.adapters.dask_versions import READ_VERSIONS

# A new version of what this module installs gets new names: two daemons of different versions on one
# scheduler (a rolling update) then each find their own handlers.
WATCH = "swarm-autoscaler-watch-v2"
OPS = {
    name: f"swarm_autoscaler_{name}_v2"
    for name in ("state", "addresses", "status", "fence", "probe", "wait", "retire")
}
LAUNCH_HOLD_KEY = "swarm-autoscaler-launch-hold"
COALESCE = 0.1
MAX_WAIT = 3600.0  # seconds a wait handler holds its connection at most, whatever it is asked


def _make_state_reader() -> Callable[..., dict[str, Any]]:
    """What the state handler answers (nested: pickled by value)."""
    task, record = _make_recorders()
    versions = READ_VERSIONS

    def read_state(dask_scheduler: Any, watch: Any, hold_key: str, workers_only: bool) -> dict[str, Any]:
        workers = [record(ws) for ws in dask_scheduler.workers.values()]
        if workers_only:  # the cheap re-read before a disruptive action: thousands of tasks skipped
            return {"workers": workers}
        hold = dask_scheduler.task_metadata.get(hold_key)
        return {
            "versions": versions(dask_scheduler),
            "workers": workers,
            "unrunnable": [task(ts) for ts in dask_scheduler.unrunnable],
            "queued": [task(ts) for ts in dask_scheduler.queued],
            "changes": [watch.epoch, watch.changes],
            "hold": hold if isinstance(hold, str) else "",
        }

    return read_state


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


def _make_change_reason() -> Callable[[Any, Any, str], str | None]:
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

    def reason(scheduler: Any, key: Any, finish: str) -> str | None:
        """Why a task's transition to `finish` is a change worth a tick, or None."""
        if finish in ("no-worker", "queued"):
            return finish
        if finish == "processing" and oversubscribed(scheduler, key):
            return "queued-on-worker"
        return None

    return reason


def _make_watch_class(coalesce: float) -> type:
    """The change watch's class (nested: pickled by value, with its class)."""
    # Imported here so that they are bound in the closure and the class pickles by value.
    import asyncio as aio

    from distributed.diagnostics.plugin import SchedulerPlugin

    change_reason = _make_change_reason()

    class ChangeWatch(SchedulerPlugin):
        idempotent = True

        def __init__(self, scheduler: Any) -> None:
            import uuid

            self.scheduler = scheduler
            self.epoch = uuid.uuid4().hex
            self.changes = 0
            self.reasons: set[str] = set()
            self.waiters: set[Any] = set()

        def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
            if reason := change_reason(self.scheduler, key, finish):
                self.notify(reason)

        def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
            self.notify("worker-left")

        def notify(self, reason: str) -> None:
            first = not self.reasons
            self.reasons.add(reason)
            if first:
                try:
                    aio.get_running_loop().call_later(coalesce, self.flush)
                except RuntimeError:  # not on the event loop: count it now
                    self.flush()

        def flush(self) -> None:
            if self.reasons:
                self.reasons = set()
                self.changes += 1
                for waiter in list(self.waiters):
                    if not waiter.done():
                        waiter.set_result(None)

    return ChangeWatch


def _make_waiter(max_wait: float) -> Callable[..., Any]:
    """The wait handler's body (nested: pickled by value)."""
    import asyncio as aio

    async def wait(watch: Any, epoch: str, since: int, timeout: float) -> dict[str, Any]:
        """Answer at once when a change came since (`epoch`, `since`), else at the first change or after
        `timeout` seconds (at most `max_wait`)."""
        if epoch == watch.epoch and since == watch.changes:
            waiter = aio.get_running_loop().create_future()
            watch.waiters.add(waiter)
            try:
                await aio.wait_for(waiter, min(max(float(timeout), 0.0), max_wait))
            except aio.TimeoutError:  # noqa: UP041  not the builtin on a scheduler's Python 3.10
                pass
            finally:
                watch.waiters.discard(waiter)
        return {"epoch": watch.epoch, "changes": watch.changes}

    return wait


def _make_installer(coalesce: float = COALESCE) -> Callable[..., None]:
    """`INSTALL`: registers the watch and the handlers on the scheduler (nested: pickled by value).
    Idempotent: an installed watch is kept (its count goes on); the handlers are set again."""
    read_state = _make_state_reader()
    set_status = _make_status_setter()
    watch_class = _make_watch_class(coalesce)
    wait_for = _make_waiter(MAX_WAIT)
    fence, probe = _FENCE, PROBE
    names, watch_name, fence_name, hold_key = dict(OPS), WATCH, FENCE_PLUGIN, LAUNCH_HOLD_KEY

    def install(dask_scheduler: Any) -> None:
        import time

        watch = dask_scheduler.plugins.get(watch_name)
        if watch is None:
            watch = watch_class(dask_scheduler)
            dask_scheduler.add_plugin(watch, name=watch_name)
        s = dask_scheduler

        def state(workers_only: bool = False) -> dict[str, Any]:
            return read_state(s, watch, hold_key, bool(workers_only))

        def list_addresses() -> dict[str, Any]:
            return {"addresses": list(s.workers)}

        def set_statuses(addresses: list[str], status: str) -> dict[str, Any]:
            return {"done": set_status(s, list(addresses), str(status))}

        def fence_hosts(hostnames: list[str], pattern: str, ttl: float, lift: bool) -> dict[str, Any]:
            return fence(s, fence_name, list(hostnames), str(pattern), float(ttl), bool(lift))

        def probe_scheduler() -> dict[str, Any]:
            return probe(s)

        async def wait(epoch: str, since: int, timeout: float) -> dict[str, Any]:
            answer: dict[str, Any] = await wait_for(watch, epoch, since, timeout)
            return answer

        async def retire(addresses: list[str]) -> dict[str, Any]:
            known = [a for a in addresses if a in s.workers]
            if known:  # through the comm handler a dask client's retire_workers reaches (and its hooks)
                stimulus_id = f"swarm-autoscaler-retire-{time.time()}"
                retire_workers = s.handlers["retire_workers"]
                await retire_workers(workers=known, close_workers=True, remove=True, stimulus_id=stimulus_id)
            return {"addresses": list(s.workers)}

        handlers: dict[str, Callable[..., Any]] = {
            "state": state,
            "addresses": list_addresses,
            "status": set_statuses,
            "fence": fence_hosts,
            "probe": probe_scheduler,
            "wait": wait,
            "retire": retire,
        }
        for op, handler in handlers.items():
            s.handlers[names[op]] = handler

    return install


INSTALL = _make_installer()
