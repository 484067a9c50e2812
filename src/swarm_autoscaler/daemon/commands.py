"""The daemon's commands: `run`, `plan` (explain, act on nothing) and `status`. `cli.py` parses and calls."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from rich.console import Console
from rich.table import Table

from swarm_autoscaler.config.settings import Settings
from swarm_autoscaler.core.actions import fields_of
from swarm_autoscaler.core.model import NodeMarks
from swarm_autoscaler.daemon.loop import run_clusters
from swarm_autoscaler.daemon.tick import TickResult, run_tick
from swarm_autoscaler.errors import AutoscalerError, ConfigurationError, EndpointError
from swarm_autoscaler.runtime.logs import startup_line
from swarm_autoscaler.runtime.signals import run_until_signal

log = structlog.get_logger("swarm_autoscaler.daemon.commands")

# Exit statuses, as docs/configuration.md lists them. 1 is left to Python: an unexpected error
# (a bug) still ends with its traceback.
EXIT_CONFIG = 2  # a setting is wrong (the line names the variable)
EXIT_ENDPOINT = 3  # an endpoint is unreachable, refuses us, or is not what the setting says
# After SIGTERM/SIGINT the process is gone within this long, whatever an endpoint does (docker stop
# sends SIGKILL after 10 s). The tick in progress is cancelled at once (`Daemon.run`).
EXIT_WITHIN_S = 8.0


def guarded(coro_fn: Callable[[], Coroutine[Any, Any, int]], *, log_format: str) -> int:
    """Run a command; an unreachable endpoint or bad configuration becomes one clear line on standard
    error, no traceback: a JSON object when `log_format` (the settings' `AUTOSCALER_LOG_FORMAT`) is
    json (`logs.startup_line`)."""
    try:
        return asyncio.run(coro_fn())
    except EndpointError as exc:
        where = f" ({exc.setting})" if exc.setting else ""
        _say(f"error: cannot use {exc.endpoint}{where}: {exc.detail}", log_format)
        return EXIT_ENDPOINT
    except ConfigurationError as exc:
        _say(f"configuration error: {exc}", log_format)
        return EXIT_CONFIG
    except AutoscalerError as exc:
        _say(f"error: {exc}", log_format)
        return EXIT_ENDPOINT


def _say(text: str, log_format: str) -> None:
    print(startup_line(text, log_format), file=sys.stderr)


async def run(settings: Settings) -> int:
    """The daemon: check every endpoint once (a failed check raises: one line, exit 2 or 3, by
    `guarded`), then tick until SIGTERM or SIGINT, then exit 0 within `EXIT_WITHIN_S`: the tick in
    progress is cancelled (even mid-act; whoever acts next plans again) and the connections are closed,
    by force if closing takes too long (`run_until_signal`)."""
    from swarm_autoscaler.daemon.app import open_daemon

    async def serve(stop: asyncio.Event) -> None:
        async with open_daemon(settings) as daemon:  # checks every endpoint first: no log line before
            log.info(
                "started: every endpoint answered",
                cluster=settings.cluster_name,
                poll_interval_s=settings.timing.poll_interval,
                leader_lock="redis"
                if settings.redis.url
                else "none: single replica (no AUTOSCALER_REDIS_URL)",
                http=f"{settings.http.host}:{settings.http.port}" if settings.http.port else "off",
            )
            await run_clusters([daemon], stop)

    await run_until_signal(serve, EXIT_WITHIN_S)
    log.info("stopped", cluster=settings.cluster_name)
    return 0


async def _look(settings: Settings) -> TickResult:
    """Observe once and plan, acting on nothing: a tick as a standby replica runs it."""
    from swarm_autoscaler.daemon.app import open_daemon

    async with open_daemon(settings, serve_http=False) as daemon:
        return await run_tick(daemon.ports, daemon.policy, daemon.catalogue, daemon.clock(), leader=False)


async def explain(settings: Settings) -> int:
    """Observe once and print the plan with every action's reason. Acts on nothing."""
    print_plan(await _look(settings), Console())
    return 0


async def status(settings: Settings) -> int:
    """Observe once and print instances, nodes, workers, buckets and pending work."""
    print_status(await _look(settings), Console())
    return 0


def print_plan(result: TickResult, console: Console) -> None:
    p = result.plan
    console.print(f"pending tasks: {p.pending}   placed: {dict(p.placed)}")
    table = Table(title="plan (nothing was done)")
    table.add_column("#", justify="right")
    table.add_column("action")
    table.add_column("target")
    table.add_column("reason")
    for i, action in enumerate(p.actions, 1):
        target = ", ".join(f"{k}={v}" for k, v in fields_of(action).items())
        table.add_row(str(i), type(action).__name__, target, action.reason)
    console.print(table)
    for u in p.unplaceable:
        console.print(f"[yellow]unplaceable[/yellow] {u.task_key}: {u.reason}")
    if not p.actions:
        console.print("nothing to do")


def print_status(result: TickResult, console: Console) -> None:
    snap = result.snapshot
    bucket_of = result.cluster.bucket_of()  # member key (instance id, or node id) -> bucket
    # terminated instances EC2 still lists matter only while a node of theirs lingers (then in a bucket)
    shown = [i for i in snap.instances if i.alive or i.id in bucket_of]
    by_host = {n.hostname: bucket_of.get(n.id, "") for n in snap.nodes}
    by_host.update({i.hostname: bucket_of.get(i.id, "") for i in shown})
    instances = Table(title=f"instances ({len(shown)})")
    for col in ("id", "type", "state", "bucket", "hostname", "age"):
        instances.add_column(col)
    for inst in sorted(shown, key=lambda i: i.id):
        instances.add_row(
            inst.id,
            inst.type_name,
            str(inst.state),
            str(bucket_of.get(inst.id, "")),
            inst.hostname,
            f"{snap.now - inst.launched_at:.0f}s",
        )
    nodes = Table(title=f"nodes ({len(snap.nodes)})")
    for col in ("hostname", "bucket", "availability", "status", "manager", "marks"):
        nodes.add_column(col)
    for node in sorted(snap.nodes, key=lambda n: n.hostname):
        nodes.add_row(
            node.hostname,
            str(by_host.get(node.hostname, "")),
            str(node.availability),
            str(node.status),
            "yes" if node.is_manager else "",
            _marks(node.marks),
        )
    workers = Table(title=f"workers ({len(snap.workers)})")
    for col in ("name", "host", "resources", "processing", "unique data"):
        workers.add_column(col)
    for w in sorted(snap.workers, key=lambda w: w.name):
        workers.add_row(
            w.name, w.hostname, str(w.resources), str(len(w.processing)), "yes" if w.has_unique_data else ""
        )
    for table in (instances, nodes, workers):
        console.print(table)
    counts = result.cluster.counts()
    console.print("buckets: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    for line in pool_lines(result):
        console.print(line)
    console.print(
        f"unrunnable tasks: {len(snap.unrunnable)}   pending (with estimated queue): {result.plan.pending}"
    )


def pool_lines(result: TickResult) -> list[str]:
    """One line per type with a warm pool or a base: its pool by state against its size, and its base."""
    cluster, out = result.cluster, []
    for tp in result.policy.allowed_types:
        if not tp.warm_pool and not tp.minimum:
            continue
        states = {
            name: sum(1 for m in members if m.type_name == tp.name)
            for name, members in (
                ("stopped", cluster.stopped),
                ("preparing", cluster.preparing),
                ("starting", cluster.starting),
            )
        }
        detail = ", ".join(f"{k}={v}" for k, v in states.items())
        out.append(f"warm pool {tp.name}: {detail} (size {tp.warm_pool}); base {tp.minimum} running")
    return out


def _marks(marks: NodeMarks) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields_of(marks).items() if v)
