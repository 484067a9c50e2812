"""The keeper's local cloud: a moto EC2 server, a redis-server and the primaries' emulator, wired so
that the real keeper (built from settings, as `swarm-autoscaler keeper` builds it) runs against it
unchanged, and each primary it launches boots into a cluster with a real dask scheduler and its own
autoscaler (see `primary`).

The VPC is carved from loopback (`127.N.0.0/16`, N claimed so that no two local clouds on one
machine share addresses: `loopback`): a primary's private IP is then an address its scheduler listens on,
and the keeper reaches it at `tcp://<private ip>:8786` as it would on AWS.

A keeper cluster's autoscaler (one whose boot script names the keeper's listing) signs its EC2 requests
with a key of its own (`PRIMARY_ACCESS_KEY`, the primaries' role), and while a keeper runs here, EC2
refuses RunInstances and StartInstances signed with it (`UnauthorizedOperation`, as the primaries' IAM
policy does, which moto does not evaluate): its workers can only be launched and started through the
keeper's routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from swarm_autoscaler.adapters.ec2 import OWNER_TAG, OWNER_VALUE
from swarm_autoscaler.keeper.adapters.tags import CLUSTER_ID_TAG, KEEPER_TAG
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud.cloud import daemon_timing, quote_env
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix, release_loopback_prefix
from swarm_autoscaler_lab.localcloud.moto_server import (
    LOCAL_ACCESS_KEY,
    LOCAL_SECRET_KEY,
    LocalNetwork,
    MotoServer,
    provision_network,
)
from swarm_autoscaler_lab.localcloud.primaries import PrimaryEmulator
from swarm_autoscaler_lab.localcloud.primary import PrimaryBoot, PrimaryOptions
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer, free_port

PRIMARY_ACCESS_KEY = "AKIALOCALPRIMARYROLE1"  # what a keeper cluster's autoscaler signs with here


def _primaries_launch_nothing(action: str, params: Mapping[str, str], access_key: str) -> str | None:
    """The primaries' IAM policy, for the actions it no longer allows: RunInstances and StartInstances."""
    if action in ("RunInstances", "StartInstances") and access_key == PRIMARY_ACCESS_KEY:
        return "the primaries' role may not launch or start: the keeper launches and starts their workers"
    return None


WORKER_TYPES: Mapping[str, Mapping[str, Any]] = {"m5.large": {}, "m5.xlarge": {}}
PRIMARY_TYPE = "m5.large"


@dataclass(frozen=True, slots=True)
class KeeperCloudOptions:
    """`worker_types` and `max_workers` are each cluster's autoscaler's allowed types and maximum."""

    fast: bool = False
    worker_types: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: dict(WORKER_TYPES))
    max_workers: int = 4
    seed: int = 0
    redis: bool = True

    @property
    def boot_delay(self) -> float:
        return 1.0 if self.fast else 3.0

    def daemon_timing(self) -> dict[str, str]:
        """Each cluster's autoscaler's delays: the local cloud's (`cloud.DAEMON_TIMING`)."""
        return daemon_timing(self.fast)


def primary_tags(keeper_name: str) -> dict[str, str]:
    """The ownership tags of a keeper's primaries (`adapters.ec2_primaries`)."""
    return {OWNER_TAG: OWNER_VALUE, KEEPER_TAG: keeper_name}


class KeeperCloud:
    """Start with `async with KeeperCloud(options) as kc:`; everything stops on exit, even on failure."""

    def __init__(self, options: KeeperCloudOptions | None = None) -> None:
        self.options = options or KeeperCloudOptions()
        self.moto = MotoServer(seed=self.options.seed)
        self.redis: RedisServer | None = None
        self.network: LocalNetwork | None = None
        self.primaries: PrimaryEmulator | None = None
        self.prefix = claim_loopback_prefix()  # no other local cloud on this machine uses it
        # Ports of its own for the primaries' schedulers, not dask's 8786/8787, in every keeper's settings
        # (`keeper_env`) and the primaries' emulator alike (a real boot takes them from the settings): a
        # scheduler elsewhere on this machine listening on every address (the README's stack in the
        # dockerd lane, beside the fast lane) owns those ports on 127.N.0.4 too, and the keeper took it
        # for its own primary's (a cluster "running" before its primary booted).
        self.scheduler_port, self.dashboard_port = free_port(), free_port()
        self.token = secrets.token_urlsafe(24)
        # moto's backends are process-wide: a name of its own keeps this cloud's keepers away from the
        # primaries of another cloud in the same process (a test session runs several).
        self.keeper_name = f"keeper-{secrets.token_hex(4)}"
        self._tmp = tempfile.TemporaryDirectory(prefix="swarm-autoscaler-keeper-")
        self._tasks: list[asyncio.Task[None]] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> KeeperCloud:
        try:
            await self._start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _start(self) -> None:
        self.moto.start()
        self._stack.callback(self.moto.stop)
        self.network = await asyncio.to_thread(
            provision_network, self.moto.endpoint, instance_profile=False, prefix=self.prefix
        )
        if self.options.redis:
            self.redis = RedisServer()
            await asyncio.to_thread(self.redis.start)
            self._stack.callback(self.redis.stop)

    def boot_primaries(self, tag_filters: Mapping[str, str], cluster_tag: str) -> PrimaryEmulator:
        """Start booting the instances carrying `tag_filters` (the keeper's ownership tags) as primaries
        of the cluster named by their `cluster_tag`."""
        assert self.network is not None and self.primaries is None
        options = PrimaryOptions(
            ec2_endpoint=self.moto.endpoint,
            region=self.network.region,
            workdir=Path(self._tmp.name),
            worker_boot_delay=self.options.boot_delay,
            emulator_interval=0.3 if self.options.fast else 0.5,
            scheduler_port=self.scheduler_port,
            dashboard_port=self.dashboard_port,
        )
        self.primaries = PrimaryEmulator(
            options, tag_filters, cluster_tag, self.daemon_env, boot_delay=self.options.boot_delay
        )
        self._tasks.append(asyncio.create_task(self.primaries.run(0.3 if self.options.fast else 0.5)))
        return self.primaries

    def boot_keeper_primaries(self, keeper_name: str | None = None) -> PrimaryEmulator:
        """Start booting the primaries of the keeper named `keeper_name` (default: this cloud's keepers'
        name), for a keeper that runs elsewhere too (a `swarm-autoscaler keeper` process)."""
        return self.boot_primaries(primary_tags(keeper_name or self.keeper_name), CLUSTER_ID_TAG)

    def daemon_env(self, boot: PrimaryBoot) -> dict[str, str]:
        """The settings of one cluster's autoscaler: what the keeper wrote in the primary's boot script
        (`boot.user_env`) over this cloud's defaults, with this cloud's endpoints and, in fast mode, its
        short delays on top. (The primary adds the cluster's name and its scheduler's address; the
        docker URL and the join URL are dropped: the primary's swarm is in memory.)"""
        assert self.network is not None
        types = {
            name: {"ami_id": self.network.ami_id, **dict(spec)}
            for name, spec in self.options.worker_types.items()
        }
        timing = {f"AUTOSCALER_{k}": v for k, v in self.options.daemon_timing().items()}
        env = {
            "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types),
            "AUTOSCALER_EC2_MIN_INSTANCES": "0",
            "AUTOSCALER_EC2_MAX_INSTANCES": str(self.options.max_workers),
            **timing,
            **boot.user_env,
            **self.ec2_env(),
            "AUTOSCALER_HTTP_PORT": "0",
            "AUTOSCALER_HTTP_HOST": "127.0.0.1",
            "AUTOSCALER_LOG_FORMAT": "console",
        }
        if self.options.fast:
            env.update(timing)
        env.pop("AUTOSCALER_DOCKER_URL", None)
        env.pop("AUTOSCALER_REDIS_URL", None)  # one autoscaler per cluster: no leader election
        # The default script's join tickets (`auto`) need the real boot (dockerd nodes, a loopback VPC):
        # this cloud's machines join an in-memory swarm with the token. tests/e2e/test_keeper_boot.py
        # boots a keeper cluster's workers through the ticket.
        env.pop("AUTOSCALER_EC2_JOIN_URL", None)
        if boot.user_env.get("AUTOSCALER_EC2_LISTING_URL"):  # a keeper's cluster: the primaries' role
            env["AUTOSCALER_EC2_ACCESS_KEY_ID"] = PRIMARY_ACCESS_KEY
        return env

    def keeper_env(self, *, idle_timeout_s: float, http_port: int) -> dict[str, str]:
        """The settings of a keeper on this cloud (`swarm-autoscaler keeper`): its token, its primaries
        and each cluster's workers (this cloud's AMI), short checks in fast mode, and this cloud's redis."""
        assert self.network is not None
        types = {
            name: {"ami_id": self.network.ami_id, **dict(spec)}
            for name, spec in self.options.worker_types.items()
        }
        fast = self.options.fast
        env = {
            **self.ec2_env(),
            "AUTOSCALER_KEEPER_TOKEN": self.token,
            "AUTOSCALER_KEEPER_PUBLIC_URL": f"http://127.0.0.1:{http_port}",
            # Plain HTTP on loopback: the lab's many API clients stay simple. The keeper's default, HTTPS
            # with its own CA, is served and verified in tests/keeper/test_api_tls_default.py.
            "AUTOSCALER_KEEPER_PLAIN_HTTP": "true",
            # AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS is left at its default (on): every primary here has a
            # loopback private IP it sends from (the emulator's fetch, the default boot script's curl
            # --interface), and the keeper answers its one-time token there only.
            "AUTOSCALER_KEEPER_NAME": self.keeper_name,
            "AUTOSCALER_KEEPER_PRIMARY_TYPE": PRIMARY_TYPE,
            "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": self.network.ami_id,
            "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps(types),
            "AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER": str(self.options.max_workers),
            "AUTOSCALER_KEEPER_IDLE_TIMEOUT": f"{idle_timeout_s:g}s",
            "AUTOSCALER_KEEPER_MAX_START_TIME": "60s" if fast else "120s",
            "AUTOSCALER_KEEPER_CHECK_INTERVAL": "1s" if fast else "2s",
            "AUTOSCALER_KEEPER_LOCK_TTL": "3s" if fast else "6s",
            "AUTOSCALER_KEEPER_USAGE_INTERVAL": "1s" if fast else "2s",
            "AUTOSCALER_KEEPER_HTTP_PORT": str(http_port),
            "AUTOSCALER_KEEPER_SCHEDULER_PORT": str(self.scheduler_port),
            "AUTOSCALER_KEEPER_DASHBOARD_PORT": str(self.dashboard_port),
            "AUTOSCALER_HTTP_HOST": "127.0.0.1",
            "AUTOSCALER_LOG_FORMAT": "console",
        }
        if self.redis is not None:
            env["AUTOSCALER_REDIS_URL"] = self.redis.url
        return env

    @contextlib.asynccontextmanager
    async def keeper(
        self,
        *,
        idle_timeout_s: float,
        extra: Mapping[str, str] | None = None,
        boot_primaries: bool = True,
        http_port: int | None = None,
    ) -> AsyncIterator[tuple[str, Keeper]]:
        """A keeper replica on this cloud, in this process, built from settings by `open_keeper` (as
        `swarm-autoscaler keeper` builds it) and running; yields its API's base URL and the keeper. Its
        primaries boot here (the primaries' emulator starts on first use) unless `boot_primaries` is
        False (the caller boots them otherwise: from their real user data on dockerd nodes).
        `http_port`: its API's port (a free one by default); a keeper restarted on the same port is the
        same keeper to its clusters (their autoscalers' listing and launch URLs name it)."""
        from swarm_autoscaler.config.keeper import load_keeper_settings
        from swarm_autoscaler.keeper.app import open_keeper

        port = http_port or free_port()
        env = {**self.keeper_env(idle_timeout_s=idle_timeout_s, http_port=port), **(extra or {})}
        config = load_keeper_settings(self.write_env(f"keeper-{port}.env", env))
        if self.primaries is None and boot_primaries:
            self.boot_keeper_primaries(config.keeper.name)
        self.moto.faults.gate(_primaries_launch_nothing)
        async with open_keeper(config) as keeper:
            stop = asyncio.Event()
            task = asyncio.create_task(keeper.run(stop), name=f"keeper:{port}")
            try:
                yield f"http://127.0.0.1:{port}", keeper
            finally:
                stop.set()
                await task
                self.moto.faults.gate(None)

    def write_env(self, name: str, env: Mapping[str, str]) -> Path:
        """`env` as an env file in this cloud's folder (for a settings loader or a subprocess)."""
        path = Path(self._tmp.name) / name
        path.write_text("".join(f"{k}={quote_env(v)}\n" for k, v in env.items()))
        return path

    def ec2_env(self) -> dict[str, str]:
        """The AUTOSCALER_EC2_* settings that point at this cloud's EC2 and network."""
        assert self.network is not None
        return {
            "AUTOSCALER_EC2_ENDPOINT": self.moto.endpoint,
            "AUTOSCALER_EC2_REGION": self.network.region,
            "AUTOSCALER_EC2_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AUTOSCALER_EC2_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "AUTOSCALER_EC2_SUBNET_IDS": ",".join(self.network.subnet_ids),
            "AUTOSCALER_EC2_SECURITY_GROUP_IDS": self.network.security_group_id,
            "AUTOSCALER_EC2_KEY_NAME": self.network.key_name,
        }

    def ec2(self) -> Any:
        """A boto3 EC2 client on this cloud (for tests and the demo's counts; never the keeper's)."""
        assert self.network is not None
        return boto3.client(
            "ec2",
            endpoint_url=self.moto.endpoint,
            region_name=self.network.region,
            aws_access_key_id=LOCAL_ACCESS_KEY,
            aws_secret_access_key=LOCAL_SECRET_KEY,
        )

    def instances(self, states: tuple[str, ...] = ("pending", "running")) -> dict[str, dict[str, Any]]:
        """Every instance of this cloud's VPC in these states, by id, straight from moto."""
        assert self.network is not None
        filters = [
            {"Name": "instance-state-name", "Values": list(states)},
            {"Name": "vpc-id", "Values": [self.network.vpc_id]},
        ]
        out: dict[str, dict[str, Any]] = {}
        for page in self.ec2().get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    out[inst["InstanceId"]] = inst
        return out

    async def __aexit__(self, *exc: object) -> None:
        if self.primaries is not None:
            self.primaries.stopping = True
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 60)
        self._tasks.clear()
        if self.primaries is not None:
            await self.primaries.close()
        await self._stack.aclose()
        with contextlib.suppress(OSError):
            self._tmp.cleanup()
        release_loopback_prefix(self.prefix)
