"""Building the daemon from settings: the one place adapters are wired to the core.

`open_daemon` is used by `swarm-autoscaler run`, `plan`, `status` and the demo alike, so every path
drives the same adapters, loop and planner.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import structlog

from swarm_autoscaler.adapters.boot_scripts import ecr_pull_lines
from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.adapters.dask_check import SchedulerCheck
from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.adapters.ec2_identity import claim
from swarm_autoscaler.adapters.ec2_interruptions import SqsInterruptions
from swarm_autoscaler.adapters.keeper_listing import KeeperListedCloud
from swarm_autoscaler.adapters.redis_lock import RedisLock, SingleReplicaLock
from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.adapters.swarm_services import SwarmServicesWorkload
from swarm_autoscaler.config.policy import policy_from_settings
from swarm_autoscaler.config.settings import Settings
from swarm_autoscaler.config.types import AllowedType
from swarm_autoscaler.config.worker import with_worker_env
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import InstanceType, Policy
from swarm_autoscaler.core.ports import Lock, Orchestrator, Workload
from swarm_autoscaler.core.services import dynamic_policy
from swarm_autoscaler.daemon.join import (
    check_join_urls,
    join_desk,
    join_urls,
    refreshing,
    serve_join,
)
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import Metrics, build_app
from swarm_autoscaler.daemon.prices import Prices
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler.runtime.http import listen

log = structlog.get_logger("swarm_autoscaler.daemon.app")


@contextlib.asynccontextmanager
async def open_daemon(
    settings: Settings,
    *,
    orchestrator: Orchestrator | None = None,
    serve_http: bool = True,
) -> AsyncIterator[Daemon]:
    """Check every endpoint once, then yield a ready Daemon; everything is closed on exit.

    The start-up checks, in order, each failing with one error that names the variable: the HTTP port
    and, with join tickets, the join port can be listened on (`ConfigurationError`), then EC2 describes the allowed types, the dask scheduler
    answers and its state can be read, redis takes our password, and the docker engine lists the
    swarm's nodes (`EndpointError`). A scheduler that cannot cordon workers turns consolidation off, with
    one warning line. `orchestrator` replaces the docker swarm adapter (the demo's in-memory swarm).

    The one clock is EC2's (`Ec2Cloud.now`, learnt from its responses): the loop, the in-flight
    listing, the dask adapter's task start times and /healthz all read it, never the host's.
    """
    async with contextlib.AsyncExitStack() as stack:
        metrics = Metrics(settings.cluster_name)
        built: list[Daemon] = []
        swarm = orchestrator or _docker(stack, settings)
        ec2 = _ec2(settings, swarm)  # not connected yet: its clock reads the host's until EC2 answers
        metrics.ec2.follow(ec2.stats)
        clock = ec2.now
        desk = join_desk(settings, ec2, swarm)
        if serve_http and settings.http.port:
            await _serve_http(
                stack, settings, metrics, lambda: built[0].last_success if built else None, clock
            )
        if serve_http and desk is not None:  # TLS, on a port of its own (`daemon.join`)
            stack.push_async_callback(
                (await serve_join(desk, settings.http.host, settings.ec2.join_port)).cleanup
            )
        # Unset, the endpoint is AWS's in the region: the region is then what points at it.
        where = "AUTOSCALER_EC2_ENDPOINT" if settings.ec2.endpoint else "AUTOSCALER_EC2_REGION"
        prices = Prices(settings, ec2)
        catalogue = await _checked(where, _start_ec2(stack, ec2, settings, prices))  # also syncs EC2's clock
        await _read_interruptions(stack, ec2, settings, metrics)
        lock = _lock(settings)
        stack.push_async_callback(_close, lock)
        policy = policy_from_settings(settings, catalogue)
        workload: Workload
        if settings.mode == "dynamic":
            workload, policy = await _dynamic(stack, settings, catalogue, policy)
        else:
            workload, policy = await _computational(stack, settings, clock, policy)
        await _checked("AUTOSCALER_REDIS_URL", lock.check())
        await _checked("AUTOSCALER_DOCKER_URL", swarm.list_nodes())
        # One deployment, one identity (`ec2_identity`): before anything is launched or touched.
        swarm_id = (
            await _checked("AUTOSCALER_DOCKER_URL", swarm.swarm_id())
            if isinstance(swarm, SwarmOrchestrator)
            else ""
        )
        await _checked(where, claim(ec2, swarm_id))
        await _checked("AUTOSCALER_DOCKER_URL", check_join_urls(ec2))
        if desk is not None:
            await _checked("AUTOSCALER_DOCKER_URL", desk.refresh())  # the key of the join token now
            await stack.enter_async_context(refreshing(desk))
            desk.ready = True  # the deployment id is known: `ec2._owned` now tells our machines
        _log_clock(ec2)  # after every check: a failed start says one line and nothing else
        prices.log()
        _warn_without_packing(workload)
        daemon = Daemon(
            cluster_name=settings.cluster_name,
            ports=Ports(InFlightCloud(ec2), swarm, workload),
            lock=lock,
            policy=policy,
            catalogue=catalogue,
            poll_interval=settings.timing.poll_interval,
            act_concurrency=settings.timing.act_concurrency,
            lock_ttl=settings.redis.lock_ttl,
            on_tick=metrics.observe_tick,
        )
        metrics.follow(daemon)
        await _refresh_prices(stack, prices, daemon, settings)
        built.append(daemon)
        yield daemon


T = TypeVar("T")

# An offset between EC2's clock and the host's beyond this is worth telling the operator about (it
# changes no decision: the daemon uses EC2's clock).
_NOTABLE_OFFSET_S = 5.0


def _log_clock(ec2: Ec2Cloud) -> None:
    offset = ec2.ec2_clock.offset()
    if offset is None:
        log.warning("EC2 sent no Date header: falling back to this host's clock for ages and delays")
    elif abs(offset) > _NOTABLE_OFFSET_S:
        log.warning(
            "this host's clock disagrees with EC2's; using EC2's for ages and delays",
            ec2_minus_host_s=round(offset, 1),
        )
    else:
        log.info("clock synced with EC2", ec2_minus_host_s=round(offset, 1))


def _docker(stack: contextlib.AsyncExitStack, settings: Settings) -> SwarmOrchestrator:
    docker = SwarmOrchestrator(settings.docker.url, cluster_name=settings.cluster_name)
    stack.push_async_callback(docker.close)
    return docker


async def _checked(setting: str, awaitable: Awaitable[T]) -> T:
    """A start-up check: its `EndpointError` names `setting`, the variable that points at the endpoint."""
    try:
        return await awaitable
    except EndpointError as exc:
        raise EndpointError(exc.endpoint, exc.detail, setting) from None


async def _serve_http(
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    metrics: Metrics,
    last_success: Callable[[], float | None],
    clock: Callable[[], float],
) -> None:
    """Listen first: a port already in use is a setting to change, found before any endpoint is called.
    (The join endpoint has a TLS listener of its own: `daemon.join.serve_join`.)"""
    host, port = settings.http.host, settings.http.port
    app = build_app(metrics, last_success, settings.timing.poll_interval, clock)
    runner = await listen(
        app, host, port, "AUTOSCALER_HTTP_PORT",
        advice="choose a free port, or 0 to turn the health and metrics endpoint off",
    )  # fmt: skip
    stack.push_async_callback(runner.cleanup)


def _ec2(settings: Settings, swarm: Orchestrator) -> Ec2Cloud:
    """The EC2 adapter; a keeper cluster's (`AUTOSCALER_EC2_LISTING_URL` set) reads its instances from
    the keeper's listing (`adapters.keeper_listing`)."""
    boot_scripts = _with_pulls(
        with_worker_env(settings.ec2.allowed_types, CATALOGUE, settings.ec2.memory_overhead_percent),
        settings.ec2.pull_images,
    )
    cloud: Any = Ec2Cloud
    if settings.ec2.listing_url:
        cloud = functools.partial(
            KeeperListedCloud,
            listing_url=settings.ec2.listing_url,
            listing_token=_listing_token(settings),
            listing_ca_file=settings.ec2.listing_ca_file,
        )
    return cloud(  # type: ignore[no-any-return]
        cluster_name=settings.cluster_name,
        region=settings.ec2.region,
        endpoint=settings.ec2.endpoint,
        access_key_id=_secret(settings.ec2.access_key_id),
        secret_access_key=_secret(settings.ec2.secret_access_key),
        allowed_types={  # each type's user data first writes its worker env file (config.worker)
            name: (spec.ami_id, boot_scripts[name]) for name, spec in settings.ec2.allowed_types.items()
        },
        subnet_ids=list(settings.ec2.subnet_ids),
        security_group_ids=list(settings.ec2.security_group_ids),
        key_name=settings.ec2.key_name,
        iam_instance_profile=settings.ec2.iam_instance_profile,
        custom_tags=dict(settings.ec2.custom_tags),
        capacities={name: tuple(spec.capacity) for name, spec in settings.ec2.allowed_types.items()},
        capacity_backoff_initial=settings.timing.capacity_backoff_initial,
        capacity_backoff_max=settings.timing.capacity_backoff_max,
        spread_subnets=settings.ec2.spread_subnets,
        metadata_hop_limit=settings.ec2.metadata_hop_limit,
        join_command=swarm.join_command,
        # the dynamic mode's machines join paused; the planner sets each active once it takes it in
        join_paused=settings.mode == "dynamic",
        join_urls=join_urls(settings, swarm),
    )


async def _read_interruptions(
    stack: contextlib.AsyncExitStack, ec2: Ec2Cloud, settings: Settings, metrics: Metrics
) -> None:
    """With an interruption queue set, long-poll it in the background for as long as the daemon runs:
    each notice for a machine of ours becomes a tag on it, which every tick's listing reads (see
    `adapters.ec2_interruptions`). Every replica polls: the tag, not the poller, carries the notice."""
    url = settings.ec2.interruption_queue_url
    if not url:
        return
    reader = SqsInterruptions(
        queue_url=url,
        cloud=ec2,
        region=settings.ec2.region,
        access_key_id=_secret(settings.ec2.access_key_id),
        secret_access_key=_secret(settings.ec2.secret_access_key),
        on_message=metrics.count_notice,
    )
    await stack.enter_async_context(reader)
    await _checked("AUTOSCALER_EC2_INTERRUPTION_QUEUE_URL", reader.check())
    task = asyncio.create_task(reader.run(), name="interruption-queue")

    async def _stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(_stop)
    log.info("reading EC2's interruption notices", queue=url)


async def _start_ec2(
    stack: contextlib.AsyncExitStack, ec2: Ec2Cloud, settings: Settings, prices: Prices
) -> dict[str, InstanceType]:
    """EC2 describes the allowed types (a type the region does not offer stops the start, one line), each
    type's AMI suits its architecture, and every type has a price (`daemon.prices`)."""
    await stack.enter_async_context(ec2)
    catalogue = await _catalogue(ec2, list(settings.ec2.allowed_types))
    await ec2.check_images()
    ec2.use_boot_scripts(
        _with_pulls(
            described_boot_scripts(
                settings.ec2.allowed_types, catalogue, settings.ec2.memory_overhead_percent
            ),
            settings.ec2.pull_images,
        )
    )
    await prices.read_list()
    await prices.read_spot()
    return prices.priced(catalogue)


async def _refresh_prices(
    stack: contextlib.AsyncExitStack, prices: Prices, daemon: Daemon, settings: Settings
) -> None:
    """Keep the daemon's prices current in the background for as long as it runs (`Prices.run`)."""
    task = asyncio.create_task(prices.run(daemon, settings.ec2.spot_price_interval), name="prices")

    async def _stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(_stop)


def _with_pulls(scripts: Mapping[str, str], images: Sequence[str]) -> dict[str, str]:
    """Each type's boot script with the pulls of `AUTOSCALER_EC2_PULL_IMAGES` last (an ECR image's login
    first, with the instance role: `boot_scripts.ecr_pull_lines`), after whatever the operator's script
    installs (the AWS CLI, say)."""
    pulls = ecr_pull_lines(images)
    return {
        name: f"{script.rstrip(chr(10))}\n{pulls}" if pulls else script for name, script in scripts.items()
    }


def described_boot_scripts(
    allowed: Mapping[str, AllowedType], catalogue: Mapping[str, InstanceType], memory_percent: float = 0.0
) -> dict[str, str]:
    """The boot scripts re-rendered from the catalogue EC2 described. The worker env was first written
    from the bundled catalogue; EC2's own description is what the planner counts, so the workers publish
    that. A type EC2 did not describe is left out (it keeps the script rendered from the bundled one)."""
    return with_worker_env(
        {n: spec for n, spec in allowed.items() if n in catalogue}, catalogue, memory_percent
    )


async def _computational(
    stack: contextlib.AsyncExitStack, settings: Settings, clock: Callable[[], float], policy: Policy
) -> tuple[Workload, Policy]:
    """The dask scheduler's workload, checked (consolidation off when it cannot cordon workers; one
    warning when the scheduler runs without the packing preload)."""
    url = settings.dask.scheduler_url
    assert url is not None  # load_settings requires it in this mode
    workload = DaskWorkload(
        url, settings.dask.worker_hostname_pattern, clock=clock, tls_files=settings.dask.tls_files
    )
    stack.push_async_callback(workload.close)
    check = await _checked("AUTOSCALER_DASK_SCHEDULER_URL", workload.check_scheduler())
    return workload, _without_consolidation(policy, check, workload.address)


def _warn_without_packing(workload: Workload) -> None:
    """One warning when the dask scheduler runs without the packing preload (docs/packing.md)."""
    if not isinstance(workload, DaskWorkload) or workload.checked is None or workload.checked.packing:
        return
    check = workload.checked
    log.warning(
        f"the dask scheduler {workload.address} runs without the packing preload: small tasks spread "
        "over every machine, so fewer can be scaled down, and restricted work (GPU, instance type) "
        "queued on a busy worker does not move to the machines launched for it; start the scheduler "
        "with --preload swarm_autoscaler.adapters.dask_packing (docs/packing.md)",
        distributed=check.version,
    )


async def _dynamic(
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    catalogue: Mapping[str, InstanceType],
    policy: Policy,
) -> tuple[Workload, Policy]:
    """The swarm's service tasks as the workload (docs/dynamic-mode.md); no worker can be cordoned
    there, so consolidation is off."""
    workload = SwarmServicesWorkload(
        settings.docker.url, settings.cluster_name, tuple(catalogue.values()), policy
    )
    stack.push_async_callback(workload.close)
    await _checked("AUTOSCALER_DOCKER_URL", workload.check())
    log.info("dynamic mode: pending swarm service tasks drive the fleet; consolidation is off")
    return workload, dynamic_policy(policy)


def _without_consolidation(policy: Policy, check: SchedulerCheck, scheduler: str) -> Policy:
    """The policy, with consolidation off when the scheduler cannot cordon workers (one warning line)."""
    if check.cordon is None or policy.consolidate_below == 0.0:
        return policy
    log.warning(
        f"consolidation is off: the dask scheduler {scheduler} cannot cordon workers ({check.cordon})",
        distributed=check.version,
    )
    return dataclasses.replace(policy, consolidate_below=0.0)


async def _catalogue(ec2: Ec2Cloud, names: list[str]) -> dict[str, InstanceType]:
    """Each allowed type as EC2 describes it (priced later: EC2 does not return prices)."""
    described = {itype.name: itype for itype in await ec2.instance_types(names)}
    return {name: described[name] for name in names if name in described}


def _lock(settings: Settings) -> RedisLock | SingleReplicaLock:
    if settings.redis.url is None:
        return SingleReplicaLock()
    return RedisLock(settings.redis.url.get_secret_value(), settings.cluster_name, settings.redis.lock_ttl)


async def _close(lock: Lock) -> None:
    closer = getattr(lock, "close", None)
    if closer is not None:
        await closer()


def _listing_token(settings: Settings) -> str:
    """The keeper listing's bearer: AUTOSCALER_EC2_LISTING_TOKEN_FILE's text (a swarm secret), else _TOKEN."""
    path = settings.ec2.listing_token_file
    if not path:
        return _secret(settings.ec2.listing_token) or ""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"AUTOSCALER_EC2_LISTING_TOKEN_FILE: cannot read {path} ({exc})") from exc


def _secret(value: object) -> str | None:
    getter = getattr(value, "get_secret_value", None)
    return None if getter is None else str(getter())
