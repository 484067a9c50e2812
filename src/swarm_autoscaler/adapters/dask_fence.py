"""Scheduler-side code of the dask adapter for fencing (`DaskWorkload.fence`), and the plain-data
record of a worker that both the state reader and the fence return.

Like everything the adapter runs on the scheduler, it is built inside factory functions so that
cloudpickle ships it *by value*: the scheduler needs only `distributed`, not this package. See
`ports.Workload.fence` for the contract and `daemon.fencing` for its use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

FENCE_PLUGIN = "swarm-autoscaler-fence-v1"
DEFAULT_FENCE_TTL = 600.0


def _make_recorders() -> tuple[Callable[..., list[Any]], Callable[[Any], dict[str, Any]]]:
    """(task, worker) -> plain data (nested: pickled by value with the functions that use them)."""

    def task(ts: Any, executing: Any = None) -> list[Any]:
        elapsed = executing.get(ts) if executing is not None else None
        prefix = getattr(ts, "prefix", None)
        average = getattr(prefix, "duration_average", -1)  # -1 while unknown
        expected = float(average) if average is not None and average >= 0 else None
        # the `do_not_disrupt` annotation (dask.annotate): its machine is never disrupted while it runs
        keep = bool((getattr(ts, "annotations", None) or {}).get("do_not_disrupt"))
        return [str(ts.key), dict(ts.resource_restrictions or {}), elapsed, expected, keep]

    def record(ws: Any) -> dict[str, Any]:
        return {
            "address": ws.address,
            "name": str(ws.name),
            "status": ws.status.name,
            "resources": dict(ws.resources),
            "nthreads": ws.nthreads,
            "processing": [task(ts, ws.executing) for ts in ws.processing],
            "unique": any(len(ts.who_has or ()) <= 1 for ts in ws.has_what),
        }

    return task, record


def _make_fence_status() -> tuple[Callable[..., None], Callable[..., None]]:
    """(cordon one worker, let go of several) on the scheduler, as `_SET_STATUS` does: the status is set
    on the scheduler and, with `tell`, sent to the worker. Nested: pickled by value."""

    def set_status(dask_scheduler: Any, ws: Any, status: str, tell: bool = True) -> None:
        import time

        stimulus_id = f"swarm-autoscaler-fence-{status}-{time.time()}"
        dask_scheduler.handle_worker_status_change(status, ws, stimulus_id)
        comm = dask_scheduler.stream_comms.get(ws.address)
        if tell and comm is not None:
            comm.send({"op": "worker-status-change", "status": status, "stimulus_id": stimulus_id})

    def release(dask_scheduler: Any, addresses: Iterable[str]) -> None:
        for address in addresses:
            ws = dask_scheduler.workers.get(address)
            if ws is not None and ws.status.name == "closing_gracefully":
                set_status(dask_scheduler, ws, "running")

    return set_status, release


def _make_fence_book() -> type:
    """The fences' bookkeeping on the scheduler: host -> (expiry, the workers the fence cordoned).
    Nested: pickled by value."""
    set_status, release = _make_fence_status()

    class FenceBook:
        def __init__(self, dask_scheduler: Any, host_of: Callable[[Any], str]) -> None:
            self.scheduler = dask_scheduler
            self.host_of = host_of
            self.hosts: dict[str, list[Any]] = {}  # host -> [expires at, addresses it cordoned]

        def fence(self, host: str, ttl: float, workers: list[Any]) -> None:
            import time

            self.hosts.setdefault(host, [0.0, set()])[0] = time.time() + ttl
            for ws in workers:
                self.cordon(ws, host)

        def fenced(self, ws: Any) -> str:
            """The host of `ws` if it is fenced, else ""."""
            import time

            host = self.host_of(ws)
            return host if self.hosts.get(host, (0.0,))[0] > time.time() else ""

        def cordon(self, ws: Any, host: str, tell: bool = True, force: bool = False) -> None:
            """Cordon `ws` for the fence on `host`; `force`: also when it has a status that a cordon
            leaves alone (to tell a worker that reports "running" what the scheduler has)."""
            if force or ws.status.name in ("init", "running", "paused"):
                set_status(self.scheduler, ws, "closing_gracefully", tell)
                self.hosts[host][1].add(ws.address)

        def lift(self, host: str) -> None:
            entry = self.hosts.pop(host, None)
            if entry is not None:
                release(self.scheduler, entry[1])

        def expire(self, host: str) -> None:  # a timer per fence; a renewed fence outlives it
            import time

            if self.hosts.get(host, (float("inf"),))[0] <= time.time():
                self.lift(host)

    return FenceBook


def _make_fences_plugin() -> Callable[..., Any]:
    """Builds, on the scheduler, the plugin that keeps the fences (nested: pickled by value).

    A worker joins in two steps: it registers with status "init" (the `add_worker` hook: its scheduler
    status is set to closing_gracefully there, before the scheduler could give it a task), then reports
    "running" on its stream. The plugin wraps the scheduler's "worker-status-change" stream handler so
    that this report (or any later "running" from a worker on a fenced host, e.g. after a pause) keeps
    it cordoned and tells the worker so."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    book = _make_fence_book()

    class Fences(book, SchedulerPlugin):  # type: ignore[misc,valid-type]
        idempotent = True

        def add_worker(self, scheduler: Any, worker: str) -> None:
            ws = scheduler.workers.get(worker)
            if host := self.fenced(ws):  # an "init" worker is told once it reports "running"
                self.cordon(ws, host, tell=ws.status.name != "init")

        def status_change(self, status: str, worker: str, **kwargs: Any) -> None:
            ws = self.scheduler.workers.get(worker)
            if status == "running" and (host := self.fenced(ws)):
                self.cordon(ws, host, force=True)
                return
            self.original(status=status, worker=worker, **kwargs)

    def build(dask_scheduler: Any, name: str, host_of: Callable[[Any], str]) -> Any:
        plugin = Fences(dask_scheduler, host_of)
        plugin.name = name
        plugin.original = dask_scheduler.stream_handlers["worker-status-change"]
        dask_scheduler.stream_handlers["worker-status-change"] = plugin.status_change
        return plugin

    return build


def _make_fencer() -> Callable[..., dict[str, Any]]:
    """The function `fence()` and `unfence()` run on the scheduler (nested: pickled by value).

    The fences live in a scheduler plugin of their own (`FENCE_PLUGIN`), which this same call installs
    when it is missing: so a fence always comes with the `add_worker` hook that cordons a worker
    connecting later from a fenced host, whatever plugin an older daemon registered, and even on a
    scheduler that restarted since the watch plugin was registered. Runs synchronously on the
    scheduler's event loop: nothing is scheduled between the reads and the status changes."""
    _, record = _make_recorders()
    build = _make_fences_plugin()

    def fence(
        dask_scheduler: Any, plugin_name: str, hostnames: list[str], pattern: str, ttl: float, lift: bool
    ) -> dict[str, Any]:
        import asyncio as aio
        import ipaddress
        import re

        regex = re.compile(pattern)

        def host_of(ws: Any) -> str:
            # as `adapters.hostnames.machine_hostname` (this runs on the scheduler, without our package)
            match = regex.fullmatch(str(ws.name)) if ws is not None else None
            host = (match.group("hostname") or "") if match else ""
            try:
                ipaddress.ip_address(host)
            except ValueError:
                return host.split(".", 1)[0]
            return host

        plugin = dask_scheduler.plugins.get(plugin_name)
        if plugin is None:
            plugin = build(dask_scheduler, plugin_name, host_of)
            dask_scheduler.add_plugin(plugin, name=plugin_name)
        wanted = set(hostnames)
        if lift:
            for host in wanted:
                plugin.lift(host)
            return {"workers": [], "refused": []}
        on_hosts = [ws for ws in dask_scheduler.workers.values() if host_of(ws) in wanted]
        before = [record(ws) for ws in on_hosts]
        refused = {
            host_of(ws) for ws, r in zip(on_hosts, before, strict=True) if r["processing"] or r["unique"]
        }
        for host in wanted - refused:
            plugin.fence(host, ttl, [ws for ws in on_hosts if host_of(ws) == host])
            aio.get_running_loop().call_later(ttl + 0.1, plugin.expire, host)
        return {"workers": [record(ws) for ws in on_hosts], "refused": sorted(refused)}

    return fence


_FENCE = _make_fencer()
