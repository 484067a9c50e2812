"""A keeper replica built from its settings and served in this process (the local cloud's tests and the
demo): `Ec2Primaries` over EC2, `RedisLocks`, the HTTP scheduler probe, the `Keeper` and its API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from swarm_autoscaler.adapters.dask_probe import HttpSchedulerProbe
from swarm_autoscaler.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.adapters.redis_locks import RedisLocks
from swarm_autoscaler.config.keeper import KeeperConfig, cluster_env, env_lines, render_boot
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper


def primaries_of(config: KeeperConfig) -> Ec2Primaries:
    """The keeper's EC2 adapter, its primaries' boot script rendered per cluster from the template."""
    keeper, ec2 = config.keeper, config.ec2

    def user_data(key: ClusterKey, cluster_id: str) -> str:
        values = {
            "cluster_id": cluster_id,
            "user_id": key.user_id,
            "wallet_id": key.wallet_id,
            "scheduler_port": str(keeper.scheduler_port),
            "dashboard_port": str(keeper.dashboard_port),
            "autoscaler_env": env_lines(cluster_env(config, cluster_id)),
        }
        return render_boot(keeper.boot_template, values)

    return Ec2Primaries(
        keeper_name=keeper.name,
        region=ec2.region,
        primary_type=keeper.primary_type,
        ami_id=keeper.primary_ami_id,
        user_data=user_data,
        subnet_ids=ec2.subnet_ids,
        security_group_ids=ec2.security_group_ids,
        key_name=ec2.key_name,
        iam_instance_profile=keeper.primary_iam_instance_profile or ec2.iam_instance_profile,
        custom_tags=ec2.custom_tags,
        scheduler_port=keeper.scheduler_port,
        dashboard_port=keeper.dashboard_port,
        endpoint=ec2.endpoint,
        access_key_id=ec2.access_key_id.get_secret_value() if ec2.access_key_id else None,
        secret_access_key=ec2.secret_access_key.get_secret_value() if ec2.secret_access_key else None,
    )


@contextlib.asynccontextmanager
async def serve_keeper(config: KeeperConfig) -> AsyncIterator[str]:
    """Run one keeper replica and its API on 127.0.0.1 (`AUTOSCALER_KEEPER_HTTP_PORT`); yields the API's
    base URL. Everything stops on exit (its cluster tasks too; their leases are released)."""
    keeper_settings = config.keeper
    if config.redis.url is None:
        raise ValueError("the local keeper needs AUTOSCALER_REDIS_URL (its locks)")
    async with contextlib.AsyncExitStack() as stack:
        hosts = await primaries_of(config).start()
        stack.push_async_callback(hosts.close)
        locks = RedisLocks(config.redis.url.get_secret_value(), keeper_settings.name)
        stack.push_async_callback(locks.close)
        probe = HttpSchedulerProbe()
        stack.push_async_callback(probe.close)
        metrics = KeeperMetrics()
        timing = KeeperTiming(keeper_settings.idle_timeout, keeper_settings.max_start_time)
        keeper = Keeper(
            hosts, probe, locks, timing, interval=keeper_settings.check_interval, on_action=metrics.action
        )
        app = build_keeper_app(keeper, keeper_settings.token.get_secret_value(), metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", keeper_settings.http_port).start()
        stop = asyncio.Event()
        task = asyncio.create_task(keeper.run(stop))

        async def halt() -> None:
            stop.set()
            await task

        stack.push_async_callback(halt)
        yield f"http://127.0.0.1:{keeper_settings.http_port}"
