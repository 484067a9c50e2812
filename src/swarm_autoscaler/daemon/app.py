"""Building the daemon from settings: the one place adapters are wired to the core.

`open_daemon` is used by `swarm-autoscaler run`, `plan`, `status` and the demo alike, so every path
drives the same adapters, loop and planner.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

import structlog

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.adapters.redis_lock import RedisLock, SingleReplicaLock
from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.config.policy import policy_from_settings
from swarm_autoscaler.config.settings import Settings
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import InstanceType
from swarm_autoscaler.core.ports import Lock, Orchestrator
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import Metrics, build_app, start_http
from swarm_autoscaler.daemon.tick import Ports

log = structlog.get_logger("swarm_autoscaler.daemon.app")


@contextlib.asynccontextmanager
async def open_daemon(
    settings: Settings,
    *,
    orchestrator: Orchestrator | None = None,
    clock: Callable[[], float] = time.time,
    serve_http: bool = True,
) -> AsyncIterator[Daemon]:
    """Connect every adapter, validate the allowed types against EC2, and yield a ready Daemon.

    `orchestrator` replaces the docker swarm adapter (the demo's in-memory swarm); everything else is
    built from `settings`. Everything is closed on exit.
    """
    async with contextlib.AsyncExitStack() as stack:
        swarm = orchestrator
        if swarm is None:
            docker = SwarmOrchestrator(settings.docker.url, cluster_name=settings.cluster_name)
            stack.push_async_callback(docker.close)
            swarm = docker
        ec2 = Ec2Cloud(
            cluster_name=settings.cluster_name,
            region=settings.ec2.region,
            endpoint=settings.ec2.endpoint,
            access_key_id=_secret(settings.ec2.access_key_id),
            secret_access_key=_secret(settings.ec2.secret_access_key),
            allowed_types={
                name: (spec.ami_id, spec.boot_script) for name, spec in settings.ec2.allowed_types.items()
            },
            subnet_ids=list(settings.ec2.subnet_ids),
            security_group_ids=list(settings.ec2.security_group_ids),
            key_name=settings.ec2.key_name,
            iam_instance_profile=settings.ec2.iam_instance_profile,
            custom_tags=dict(settings.ec2.custom_tags),
            capacity_backoff_initial=settings.timing.capacity_backoff_initial,
            capacity_backoff_max=settings.timing.capacity_backoff_max,
            join_command=swarm.join_command,
            clock=clock,
        )
        await stack.enter_async_context(ec2)
        workload = DaskWorkload(
            settings.dask.scheduler_url, settings.dask.worker_hostname_pattern, clock=clock
        )
        await stack.enter_async_context(workload)
        lock = _lock(settings)
        stack.push_async_callback(_close, lock)
        catalogue = await _catalogue(ec2, list(settings.ec2.allowed_types))
        policy = policy_from_settings(settings, catalogue)
        metrics = Metrics(settings.cluster_name)
        daemon = Daemon(
            cluster_name=settings.cluster_name,
            ports=Ports(InFlightCloud(ec2, clock), swarm, workload),
            lock=lock,
            policy=policy,
            catalogue=catalogue,
            poll_interval=settings.timing.poll_interval,
            act_concurrency=settings.timing.act_concurrency,
            lock_ttl=settings.redis.lock_ttl,
            clock=clock,
            on_tick=metrics.observe_tick,
        )
        if serve_http and settings.http.port:
            app = build_app(metrics, lambda: daemon.last_success, settings.timing.poll_interval, clock)
            runner = await start_http(app, settings.http.host, settings.http.port)
            stack.push_async_callback(runner.cleanup)
            log.info("serving /healthz and /metrics", host=settings.http.host, port=settings.http.port)
        yield daemon


async def _catalogue(ec2: Ec2Cloud, names: list[str]) -> dict[str, InstanceType]:
    """Each allowed type as EC2 describes it; the bundled price is kept (EC2 does not return prices)."""
    described = await ec2.instance_types(names)
    out: dict[str, InstanceType] = {}
    for itype in described:
        bundled = CATALOGUE.get(itype.name)
        price = (
            itype.price_per_hour
            if itype.price_per_hour is not None
            else (bundled.price_per_hour if bundled else None)
        )
        out[itype.name] = InstanceType(itype.name, itype.resources, price)
    return {name: out[name] for name in names if name in out}


def _lock(settings: Settings) -> Lock:
    if settings.redis.url is None:
        log.info("no AUTOSCALER_REDIS_URL: running as a single replica (no leader lock)")
        return SingleReplicaLock()
    return RedisLock(settings.redis.url.get_secret_value(), settings.cluster_name, settings.redis.lock_ttl)


async def _close(lock: Lock) -> None:
    closer = getattr(lock, "close", None)
    if closer is not None:
        await closer()


def _secret(value: object) -> str | None:
    getter = getattr(value, "get_secret_value", None)
    return None if getter is None else str(getter())
