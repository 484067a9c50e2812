"""Building the keeper from its settings, and `swarm-autoscaler keeper`: the one place the keeper's
adapters (EC2 primaries, redis locks, the dask scheduler probe) are wired to its service and API.

Start-up, in order, each failure one line naming the variable (exit 2 or 3, as the daemon's): the API's
port can be listened on, EC2 describes the primary and worker types, redis answers (when
`AUTOSCALER_REDIS_URL` is set). Then `started`, and the keeper runs until SIGTERM or SIGINT, after
which it is gone within `EXIT_WITHIN_S` (its cluster tasks are cancelled and their leases released:
another replica takes the clusters over at once).

The clock is EC2's (`Ec2Transport.now`): cluster ages are measured in the time base of the primaries'
tags, whatever this host's clock says.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog
from aiohttp import web

from swarm_autoscaler.adapters.ec2_pricing import read_prices
from swarm_autoscaler.config import keeper as keeper_config
from swarm_autoscaler.config.keeper import KeeperConfig, cluster_env, env_lines, keeper_ca, render_boot
from swarm_autoscaler.config.profiles import DEFAULT_PROFILE, launched_types, profiles_of
from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler.keeper.access import InProcessTokens, TokenStore
from swarm_autoscaler.keeper.adapters.api_tls import RedisApiPki, api_hosts, make_api_pki, server_context_of
from swarm_autoscaler.keeper.adapters.dask_clients import TlsSchedulerClients
from swarm_autoscaler.keeper.adapters.dask_probe import HttpSchedulerProbe
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries, UserData
from swarm_autoscaler.keeper.adapters.ec2_workers import Ec2Workers
from swarm_autoscaler.keeper.adapters.redis_budgets import RedisBudgets
from swarm_autoscaler.keeper.adapters.redis_credentials import RedisCredentials
from swarm_autoscaler.keeper.adapters.redis_leases import RedisLocks
from swarm_autoscaler.keeper.adapters.redis_tokens import RedisTokens
from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.adapters.sealing import Sealer, key_from_text
from swarm_autoscaler.keeper.adapters.tags import WORKER_DEPLOYMENT_TAG, worker_tags
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import InProcessCredentials, deployment_id, primary_token
from swarm_autoscaler.keeper.interruptions import read_interruptions
from swarm_autoscaler.keeper.launches import Launches
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.limits import Limits
from swarm_autoscaler.keeper.locks import InProcessLocks
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.keeper.usage import UsageAccountant
from swarm_autoscaler.runtime.http import listen, server_context
from swarm_autoscaler.runtime.signals import run_until_signal

log = structlog.get_logger("swarm_autoscaler.keeper.app")

EXIT_WITHIN_S = 8.0  # docker stop sends SIGKILL after 10 s
EXPECTED_START_S = 120.0  # how long a primary usually takes to run its scheduler (for `eta_s`)
T = TypeVar("T")


def user_data_of(config: KeeperConfig, api_ca: str | None = None) -> UserData:
    """The primaries' boot script for one cluster: the template with that cluster's values. `api_ca`:
    the PEM of the CA the keeper's own API certificate comes from ({{keeper_ca}}, unless the operator
    names one in AUTOSCALER_KEEPER_TLS_CA_FILE)."""
    keeper = config.keeper
    template = keeper.boot_template
    secret = keeper.token.get_secret_value()
    # the operator's CA file names what the primaries reach (a TLS proxy in front, say): it wins
    ca = keeper_ca(keeper) if api_ca is None or keeper.tls_ca_file else api_ca.strip()

    profiles = profiles_of(keeper)

    def render(key: ClusterKey, cluster_id: str, profile: str = DEFAULT_PROFILE) -> str:
        chosen = profiles[profile]  # a known one: the service checked it
        values = {
            "keeper_url": keeper.public_url or "",
            "keeper_ca": ca,
            "credentials_token": primary_token(secret, cluster_id),
            "image": chosen.image,
            "worker_image": chosen.worker_image,
            "scheduler_image": chosen.scheduler_image,
            "cluster_id": cluster_id,
            "user_id": key.user_id,
            "wallet_id": key.wallet_id,
            "scheduler_port": str(keeper.scheduler_port),
            "dashboard_port": str(keeper.dashboard_port),
            "autoscaler_env": env_lines(
                cluster_env(
                    config,
                    cluster_id,
                    worker_tags(keeper.name, key, deployment_id(secret)),
                    keeper_config.LISTING_TOKEN_SECRET,  # the token comes with the one-time fetch, not user data
                    chosen.worker_types,
                )
            ),
        }
        return render_boot(template, values)

    return render


def primaries(config: KeeperConfig, api_ca: str | None = None) -> Ec2Primaries:
    """The EC2 adapter, not started (`api_ca`: as `user_data_of`'s)."""
    ec2, keeper = config.ec2, config.keeper
    return Ec2Primaries(
        keeper_name=keeper.name,
        region=ec2.region,
        endpoint=ec2.endpoint,
        access_key_id=None if ec2.access_key_id is None else ec2.access_key_id.get_secret_value(),
        secret_access_key=None if ec2.secret_access_key is None else ec2.secret_access_key.get_secret_value(),
        primary_type=keeper.primary_type,
        ami_id=keeper.primary_ami_id,
        user_data=user_data_of(config, api_ca),
        subnet_ids=list(ec2.subnet_ids),
        security_group_ids=list(ec2.security_group_ids),
        key_name=ec2.key_name,
        iam_instance_profile=keeper.primary_iam_instance_profile or ec2.iam_instance_profile,
        custom_tags=dict(ec2.custom_tags),
        scheduler_port=keeper.scheduler_port,
        dashboard_port=keeper.dashboard_port,
        metadata_hop_limit=keeper.primary_metadata_hop_limit,
        primary_types={name: p.primary_type for name, p in profiles_of(keeper).items()},
        deployment=deployment_id(keeper.token.get_secret_value()),
    )


def launches_of(config: KeeperConfig, keeper: Keeper, hosts: Ec2Primaries) -> Launches:
    """The launch route's checks and launcher: the keeper's worker types (their AMIs and capacities),
    its subnets, security groups and key pair, and each cluster's maximum."""
    ec2, settings = config.ec2, config.keeper
    launcher = Ec2Workers(
        hosts,
        keeper_name=settings.name,
        amis={name: spec.ami_id for name, spec in settings.worker_types.items()},
        security_group_ids=list(ec2.security_group_ids),
        key_name=ec2.key_name,
        # this keeper deployment's id on its workers too (`tags.WORKER_DEPLOYMENT_TAG`)
        custom_tags={**ec2.custom_tags, WORKER_DEPLOYMENT_TAG: hosts.deployment},
    )
    return Launches(
        keeper,
        launcher,
        types={name: tuple(spec.capacity) for name, spec in settings.worker_types.items()},
        maximum=settings.max_instances_per_cluster,
        subnets=tuple(ec2.subnet_ids),
        profile_types={
            name: {t: tuple(spec.capacity) for t, spec in p.worker_types.items()}
            for name, p in profiles_of(settings).items()
        },
        profile_amis={
            name: {t: spec.ami_id for t, spec in p.worker_types.items()}
            for name, p in profiles_of(settings).items()
        },
    )


@contextlib.asynccontextmanager
async def open_keeper(config: KeeperConfig) -> AsyncIterator[Keeper]:
    """Check every endpoint once (see the module docstring), serve the API, and yield the keeper (not
    running yet: `await keeper.run(stop)`). Everything is closed on exit."""
    keeper_settings = config.keeper
    async with contextlib.AsyncExitStack() as stack:
        api_tls = await _checked("AUTOSCALER_REDIS_URL", api_tls_of(config, stack))
        hosts = primaries(config, api_tls.ca_pem)
        locks = _locks(config)
        stack.push_async_callback(locks.close)
        credentials = _credentials(config)
        if isinstance(credentials, RedisCredentials):
            stack.push_async_callback(credentials.close)
        probe = HttpSchedulerProbe()
        stack.push_async_callback(probe.close)
        metrics = KeeperMetrics(keeper_settings.wallet_metric_limit)
        usage = None
        tokens: TokenStore = InProcessTokens()
        limits = Limits(
            max_clusters_per_user=keeper_settings.max_clusters_per_user,
            default_budget=keeper_settings.wallet_budget_usd,
            budgets=dict(keeper_settings.wallet_budgets),
        )
        if config.redis.url is not None:
            url = config.redis.url.get_secret_value()
            usage = limits.usage = RedisUsage(url, keeper_settings.name)
            stack.push_async_callback(usage.close)
            tokens = redis_tokens = RedisTokens(url, keeper_settings.name)
            stack.push_async_callback(redis_tokens.close)
            limits.store = budgets = RedisBudgets(url, keeper_settings.name)
            stack.push_async_callback(budgets.close)
        clients = TlsSchedulerClients(credentials)
        stack.push_async_callback(clients.close)
        keeper = Keeper(
            hosts=hosts,
            probe=probe,
            locks=locks,
            timing=KeeperTiming(
                keeper_settings.idle_timeout,
                keeper_settings.max_start_time,
                no_client_timeout=keeper_settings.no_client_timeout,
                budget_grace=keeper_settings.budget_grace,
            ),
            budget_interval=keeper_settings.usage_interval,
            interval=keeper_settings.check_interval,
            clock=hosts.now,
            on_action=metrics.action,
            lock_ttl=keeper_settings.lock_ttl,
            limits=limits,
            clients=clients,
            replicas=locks if isinstance(locks, RedisLocks) else None,
            max_workers=keeper_settings.max_instances_per_cluster,
            profiles=tuple(profiles_of(keeper_settings)),
            bind_primaries=keeper_settings.bind_primary_tokens,
        )
        launches = launches_of(config, keeper, hosts)
        keeper.types_of = launches.types_of  # a worker of another type is ended at the next listing
        app = build_keeper_app(
            keeper,
            keeper_settings.token.get_secret_value(),
            metrics,
            expected_start_s=min(EXPECTED_START_S, keeper_settings.max_start_time),
            healthy=lambda: _unhealthy(keeper),
            usage=usage,
            credentials=credentials,
            tokens=tokens,
            launches=launches,
        )
        if usage is not None:
            keeper.accountant = UsageAccountant(
                hosts, usage, keeper_settings.usage_interval, hosts.now, metrics.counted
            )
        where = "AUTOSCALER_EC2_ENDPOINT" if config.ec2.endpoint else "AUTOSCALER_EC2_REGION"
        await _checked(where, stack.enter_async_context(hosts))  # the client only: no request yet
        await _listen(stack, app, config, api_tls.context)  # before any request: a busy port is found first
        types = launched_types(keeper_settings)
        await _checked(where, hosts.check(types))  # also syncs EC2's clock
        await _checked(where, hosts.claim())  # no other keeper deployment under this name
        await read_interruptions(stack, hosts, config)  # its clusters' notices, as tags (interruptions.py)
        if keeper.accountant is not None:  # every type priced, by the daemon's rule, or no start
            keeper.accountant.prices = await _prices(config, types)
        await _checked("AUTOSCALER_REDIS_URL", locks.check())
        _log_api_tls(config, api_tls)  # once every check passed: a refused start stays one line
        yield keeper


def _locks(config: KeeperConfig) -> RedisLocks | InProcessLocks:
    if config.redis.url is None:
        return InProcessLocks()
    return RedisLocks(config.redis.url.get_secret_value(), config.keeper.name)


def _credentials(config: KeeperConfig) -> RedisCredentials | InProcessCredentials:
    """The clusters' TLS credentials: in redis when the replicas share one (they must agree on them),
    sealed with the secrets key when one is set."""
    if config.redis.url is None:
        return InProcessCredentials(make_credentials)
    url = config.redis.url.get_secret_value()
    return RedisCredentials(url, config.keeper.name, make_credentials, sealer=_sealer(config))


def _at_rest(config: KeeperConfig) -> str:
    """How the clusters' private keys are kept, for the start line (the clear text is the operator's cue)."""
    if config.redis.url is None:
        return "in memory only"
    if config.keeper.secrets_key is None and not config.keeper.secrets_key_file:
        return "IN THE CLEAR in redis: set AUTOSCALER_KEEPER_SECRETS_KEY_FILE (docs/security.md)"
    return "sealed in redis"


def _sealer(config: KeeperConfig) -> Sealer | None:
    keeper = config.keeper
    if keeper.secrets_key is not None:
        return Sealer(key_from_text(keeper.secrets_key.get_secret_value()))
    if keeper.secrets_key_file:
        setting = "AUTOSCALER_KEEPER_SECRETS_KEY_FILE"
        try:
            text = Path(keeper.secrets_key_file).read_text()
        except OSError as exc:
            raise ConfigurationError(
                f"{setting}: cannot read {keeper.secrets_key_file} ({exc.strerror})"
            ) from None
        return Sealer(key_from_text(text, setting))
    return None


def _unhealthy(keeper: Keeper) -> str | None:
    """None while the keeper lists its clusters on schedule; else why not (then /healthz says 503)."""
    limit = 3 * keeper.interval + 5.0
    last = keeper.last_discovery
    if last is None:
        return "no listing of the clusters has succeeded yet"
    if keeper.clock() - last > limit:
        return f"listing the clusters has failed for {keeper.clock() - last:.0f}s"
    return None


async def _listen(
    stack: contextlib.AsyncExitStack, app: web.Application, config: KeeperConfig, tls: ssl.SSLContext | None
) -> None:
    host, port = config.http.host, config.keeper.http_port
    runner = await listen(app, host, port, "AUTOSCALER_KEEPER_HTTP_PORT", tls)
    stack.push_async_callback(runner.cleanup)


@dataclass(frozen=True, slots=True)
class ApiTls:
    """How the keeper's API is served: its TLS context (None: plain HTTP), the PEM of the CA the
    primaries verify it with when the keeper made its own certificate, and a word for the start line."""

    context: ssl.SSLContext | None
    ca_pem: str | None
    described: str


def _log_api_tls(config: KeeperConfig, api_tls: ApiTls) -> None:
    if api_tls.context is None:
        log.warning(
            "the keeper's API is PLAIN HTTP: tokens and the clusters' TLS files cross the network in the "
            "clear unless a proxy in front of it terminates TLS (AUTOSCALER_KEEPER_PLAIN_HTTP=true)",
            keeper=config.keeper.name,
            # a proxy that terminates TLS hides each primary's address: every one-time token is refused
            primary_tokens="set AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS=false behind such a proxy"
            if config.keeper.bind_primary_tokens
            else "unbound",
        )
    else:
        log.info("the keeper's API serves HTTPS", keeper=config.keeper.name, tls=api_tls.described)


async def api_tls_of(config: KeeperConfig, stack: contextlib.AsyncExitStack) -> ApiTls:
    """The operator's certificate (AUTOSCALER_KEEPER_TLS_CERT_FILE and _KEY_FILE); else plain HTTP when
    AUTOSCALER_KEEPER_PLAIN_HTTP asks for it; else the keeper's own (`adapters.api_tls`), from redis
    when there is one, so every replica serves the same and a restart keeps it."""
    keeper = config.keeper
    if keeper.tls_cert_file is not None and keeper.tls_key_file is not None:
        return ApiTls(
            server_context(keeper.tls_cert_file, keeper.tls_key_file), None, "operator's certificate"
        )
    if keeper.plain_http:
        return ApiTls(None, None, "OFF: plain HTTP (AUTOSCALER_KEEPER_PLAIN_HTTP=true)")
    hosts = api_hosts(keeper.public_url)
    if config.redis.url is None:
        pki = await asyncio.to_thread(make_api_pki, keeper.name, hosts)
    else:
        store = RedisApiPki(config.redis.url.get_secret_value(), keeper.name, sealer=_sealer(config))
        stack.push_async_callback(store.close)
        pki = await store.get_or_make(hosts)
    where = "in memory: a restart makes another" if config.redis.url is None else "kept in redis"
    described = f"own certificate for {', '.join(pki.hosts)} ({where}), CA sha256 {pki.fingerprint}"
    return ApiTls(server_context_of(pki), pki.ca_pem, described)


async def _checked(setting: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except EndpointError as exc:
        raise EndpointError(exc.endpoint, exc.detail, setting) from None


async def run_keeper(config: KeeperConfig) -> int:
    """`swarm-autoscaler keeper`: check, serve and keep the clusters until SIGTERM or SIGINT; exit 0
    within `EXIT_WITHIN_S` of the signal (`run_until_signal`)."""

    async def serve(stop: asyncio.Event) -> None:
        async with open_keeper(config) as keeper:
            log.info(
                "started: every endpoint answered",
                keeper=config.keeper.name,
                http=f"{config.http.host}:{config.keeper.http_port}",
                check_interval_s=config.keeper.check_interval,
                idle_timeout_s=config.keeper.idle_timeout,
                locks="redis" if config.redis.url else "in-process: single replica (no AUTOSCALER_REDIS_URL)",
                private_keys_at_rest=_at_rest(config),
                api_tls=not config.keeper.plain_http,
                primary_tokens="bound" if config.keeper.bind_primary_tokens else "unbound",
            )
            await keeper.run(stop)

    await run_until_signal(serve, EXIT_WITHIN_S)
    log.info("stopped", keeper=config.keeper.name)
    return 0


async def _prices(config: KeeperConfig, types: list[str]) -> dict[str, float]:
    """The usage ledger's on-demand price of each type the keeper launches (`ec2_pricing.read_prices`):
    a worker type's `price_per_hour` wins, then AUTOSCALER_KEEPER_PRIMARY_PRICE_PER_HOUR for the primary's
    type, then the AWS Price List; none of them stops the start."""
    ec2 = config.ec2
    keeper = config.keeper
    operator = {keeper.primary_type: keeper.primary_price_per_hour}  # a profile's other type: the list's
    operator |= {
        name: spec.price_per_hour
        for p in profiles_of(keeper).values()
        for name, spec in p.worker_types.items()
        if spec.price_per_hour
    }
    priced = await read_prices(
        list(dict.fromkeys(types)),
        region=ec2.region,
        operator=operator,
        setting="AUTOSCALER_KEEPER_WORKER_TYPES (the primary's: AUTOSCALER_KEEPER_PRIMARY_PRICE_PER_HOUR)",
        endpoint=ec2.endpoint,
        access_key_id=ec2.access_key_id.get_secret_value() if ec2.access_key_id else None,
        secret_access_key=ec2.secret_access_key.get_secret_value() if ec2.secret_access_key else None,
    )
    return priced.prices
