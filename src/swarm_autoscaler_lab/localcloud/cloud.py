"""The local cloud: a moto EC2 server, a dask scheduler, a swarm (in memory or real dockerd nodes) and the
machine emulator, wired so that the real daemon can run against it unchanged.

`LocalCloud.env()` gives the AUTOSCALER_* settings that point a daemon at it; `LocalCloud.daemon()`
builds that daemon in-process through the same `open_daemon` that `swarm-autoscaler run` uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed import Scheduler

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.ports import Orchestrator
from swarm_autoscaler.daemon.loop import Daemon
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
from swarm_autoscaler_lab.localcloud.machines import MachineEmulator, MemoryJoiner
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.localcloud.metadata import MetadataService
from swarm_autoscaler_lab.localcloud.moto_server import (
    LOCAL_ACCESS_KEY,
    LOCAL_SECRET_KEY,
    LocalNetwork,
    MotoServer,
    provision_network,
)

if TYPE_CHECKING:
    from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm

DEFAULT_TYPES: Mapping[str, Mapping[str, Any]] = {
    "m5.large": {"reserve": 1},
    "m5.xlarge": {},
    "r5.large": {},
}


# The daemon's delays on a local cloud, fast (tests, CI) or not (a demo one watches), without the
# AUTOSCALER_ prefix. One table for every daemon a local cloud runs: `LocalCloud`'s and each keeper
# primary's (`keepercloud`). Fast drain and termination delays are 3 s: the keeper's cloud had 2 s, which
# its e2e tests do not need (they allow 60 s for a scale-down), and 3 s is what the daemon e2e tests ran on.
DAEMON_TIMING: Mapping[bool, Mapping[str, str]] = {
    True: {"POLL_INTERVAL": "1s", "DRAIN_DELAY": "3s", "TERMINATION_DELAY": "3s", "MAX_START_TIME": "60s"},
    False: {"POLL_INTERVAL": "2s", "DRAIN_DELAY": "8s", "TERMINATION_DELAY": "10s", "MAX_START_TIME": "90s"},
}


def daemon_timing(fast: bool) -> dict[str, str]:
    """A copy of the daemon's delays on a local cloud (`DAEMON_TIMING`), keys without AUTOSCALER_."""
    return dict(DAEMON_TIMING[fast])


@dataclass(frozen=True, slots=True)
class LocalCloudOptions:
    fast: bool = False
    real_swarm: bool = False
    cluster_name: str = "demo"
    allowed_types: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: dict(DEFAULT_TYPES))
    min_instances: int = 0
    max_instances: int = 12
    never_join_rate: float = 0.0
    seed: int = 0
    http_port: int = 0
    scheduler_preload: tuple[str, ...] = ()  # modules the scheduler preloads (e.g. the packing plugin)
    # With real_swarm: machines boot as EC2 boots them, from their own user data on their own dockerd
    # node, and their dask workers are the tasks of the worker global service (docker/worker-stack.yml),
    # which the start deploys after loading the worker image (built once, then cached: `make image`).
    # Off: no machine boots until `LocalCloud.real_boot_on()` is entered (the e2e suite's shared cloud,
    # whose tests turn it on for their own machines). The emulator's shortcut (it joins for the machine and
    # runs an in-process worker) is for the in-memory swarm only.
    real_boot: bool = False
    # The VPC's first two octets (`provision_network`). "127.N" (`loopback_prefix()`) carves it from
    # loopback: each machine's PrivateIpAddress is then an address its boot can bind and its dockerd node
    # advertises, so a join ticket's source check (`daemon.join`) and swarm's Status.Addr run as on EC2.
    vpc_prefix: str = "10.0"

    @property
    def boot_delay(self) -> float:
        return 1.0 if self.fast else 3.0

    def timing(self) -> dict[str, str]:
        return daemon_timing(self.fast)


class LocalCloud:
    """Start with `async with LocalCloud(options) as lc:`; everything stops on exit, even on failure."""

    def __init__(self, options: LocalCloudOptions | None = None) -> None:
        self.options = options or LocalCloudOptions()
        if self.options.real_boot and not self.options.real_swarm:
            raise ConfigurationError(
                "LocalCloudOptions.real_boot needs real_swarm (machines are dockerd nodes)"
            )
        self.moto = MotoServer(seed=self.options.seed)
        self.network: LocalNetwork | None = None
        self.scheduler: Scheduler | None = None
        self.orchestrator: Orchestrator | None = None
        self.emulator: MachineEmulator | None = None
        self._swarm: Any = None
        self._joiner: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        # A started `registry.LocalRegistry` (the e2e fixtures set it): the real boot then pulls the team
        # worker image from it, with authentication, instead of loading a tarball into each node.
        self.registry: Any = None
        self.metadata: MetadataService | None = None  # with real_swarm: `localcloud.metadata`
        self._tmp = tempfile.TemporaryDirectory(prefix="swarm-autoscaler-local-")
        self._stack = contextlib.AsyncExitStack()

    @property
    def min_plus_reserve(self) -> int:
        reserve = sum(int(spec.get("reserve", 0)) for spec in self.options.allowed_types.values())
        return self.options.min_instances + reserve

    @property
    def local_swarm(self) -> LocalSwarm:
        """The real dockerd swarm (only with `real_swarm`): its manager runs the stack test's service."""
        from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm

        if not isinstance(self._swarm, LocalSwarm):
            raise TypeError("this local cloud has no real swarm (LocalCloudOptions.real_swarm is off)")
        return self._swarm

    @property
    def scheduler_address(self) -> str:
        assert self.scheduler is not None
        return str(self.scheduler.address)

    async def __aenter__(self) -> LocalCloud:
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
            provision_network, self.moto.endpoint, instance_profile=False, prefix=self.options.vpc_prefix
        )
        # The scheduler serves HTTP (/metrics) even without a dashboard, on 8787 by default: a free port
        # instead, so two local clouds (or any dask on this machine) never collide or warn.
        self.scheduler = await Scheduler(
            host="127.0.0.1",
            port=0,
            dashboard=False,
            dashboard_address="127.0.0.1:0",
            validate=False,
            preload=list(self.options.scheduler_preload),
        )
        self._stack.push_async_callback(self.scheduler.close)
        await self._start_swarm()
        assert self.orchestrator is not None
        self.emulator = MachineEmulator(
            ec2_endpoint=self.moto.endpoint,
            region=self.network.region,
            tag_filters=self.owner_tags(),
            orchestrator=self.orchestrator,
            joiner=self._joiner,
            scheduler_address=self.scheduler_address,
            catalogue=CATALOGUE,
            boot_delay=self.options.boot_delay,
            never_join_rate=self.options.never_join_rate,
            seed=self.options.seed,
            shortcut_allowed=not self.options.real_swarm,
        )
        self._stack.push_async_callback(self.emulator.close)
        if self.options.real_boot:
            await self._start_real_boot()
        self._tasks.append(asyncio.create_task(self.emulator.run(0.3 if self.options.fast else 0.5)))

    async def _start_swarm(self) -> None:
        if not self.options.real_swarm:
            self._swarm = MemorySwarm(cluster_name=self.options.cluster_name)
            self.orchestrator = self._swarm
            self._joiner = MemoryJoiner(self._swarm)
            return
        from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
        from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm
        from swarm_autoscaler_lab.localcloud.dockerd_joiner import DockerdJoiner

        swarm = LocalSwarm(Path(self._tmp.name) / "swarm")
        self._stack.push_async_callback(swarm.close)
        self.metadata = await MetadataService().start()  # each real boot's instance metadata service
        self._stack.push_async_callback(self.metadata.close)
        await swarm.start_manager("ip-10-0-255-1")
        self._swarm = swarm
        orchestrator = SwarmOrchestrator(swarm.manager_url, cluster_name=self.options.cluster_name)
        self._stack.push_async_callback(orchestrator.close)
        self.orchestrator = orchestrator
        self._joiner = DockerdJoiner(swarm)

    @property
    def boots_from_user_data(self) -> bool:
        """Whether a machine launched now boots from its user data (`real_boot`, or inside `real_boot_on`)."""
        return self.emulator is not None and self.emulator.user_data_boot is not None

    @contextlib.asynccontextmanager
    async def real_boot_on(self) -> AsyncIterator[None]:
        """Machines launched while open boot as EC2 boots them, on a cloud started without `real_boot`
        (shared by tests of which only some need the real boot). On exit the worker service is removed,
        and new machines do not boot (the shortcut is refused on real dockerd nodes)."""
        from swarm_autoscaler_lab.localcloud.userdata import WORKER_STACK

        if self.boots_from_user_data:
            yield
            return
        await self._start_real_boot()
        try:
            yield
        finally:
            assert self.emulator is not None
            self.emulator.user_data_boot = None
            await self.local_swarm.manager.docker("stack", "rm", WORKER_STACK)

    async def _start_real_boot(self) -> None:
        """The worker image, the worker service deployed, and every machine booted from its user data.
        With `registry`: the team worker image (docker/worker.Dockerfile, no swarm_autoscaler) pushed once,
        the stack deployed `--with-registry-auth`, and each node pulls it when swarm starts its task (what
        ECR is to real machines). Without: the autoscaler's image loaded into each node first (an AMI that
        bakes it in)."""
        from swarm_autoscaler_lab.localcloud.image import (
            IMAGE,
            ensure_image,
            ensure_worker_image,
            image_tarball,
        )
        from swarm_autoscaler_lab.localcloud.userdata import UserDataBoot, deploy_worker_stack

        assert self.emulator is not None
        swarm = self.local_swarm
        if self.registry is not None:
            await asyncio.to_thread(ensure_worker_image, swarm.manager)
            image = await asyncio.to_thread(self._push_worker_image)
            preload = []
        else:
            await asyncio.to_thread(ensure_image, swarm.manager)
            image, preload = IMAGE, [image_tarball()]
        await asyncio.to_thread(
            deploy_worker_stack,
            swarm,
            cluster_name=self.options.cluster_name,
            scheduler_address=self.scheduler_address,
            image=image,
            cli_env=self.registry.cli_env() if self.registry is not None else None,
        )
        self.emulator.user_data_boot = UserDataBoot(swarm, preload=preload, metadata=self.metadata)

    def _push_worker_image(self) -> str:
        from swarm_autoscaler_lab.localcloud.image import WORKER_IMAGE, worker_image_key

        return str(
            self.registry.push(
                self.local_swarm.manager, WORKER_IMAGE, f"team/dask-worker:{worker_image_key()}"
            )
        )

    def owner_tags(self) -> dict[str, str]:
        from swarm_autoscaler.adapters.ec2 import owner_tags

        return owner_tags(self.options.cluster_name)

    def env(self) -> dict[str, str]:
        """The AUTOSCALER_* settings that point a daemon at this local cloud."""
        assert self.network is not None and self.scheduler is not None
        types = {
            name: {"ami_id": self.network.ami_id, **dict(spec)}
            for name, spec in self.options.allowed_types.items()
        }
        env = {
            "AUTOSCALER_CLUSTER_NAME": self.options.cluster_name,
            "AUTOSCALER_EC2_ENDPOINT": self.moto.endpoint,
            "AUTOSCALER_EC2_REGION": self.network.region,
            "AUTOSCALER_EC2_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AUTOSCALER_EC2_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types),
            "AUTOSCALER_EC2_MIN_INSTANCES": str(self.options.min_instances),
            "AUTOSCALER_EC2_MAX_INSTANCES": str(self.options.max_instances),
            "AUTOSCALER_EC2_SUBNET_IDS": ",".join(self.network.subnet_ids),
            "AUTOSCALER_EC2_SECURITY_GROUP_IDS": self.network.security_group_id,
            "AUTOSCALER_EC2_KEY_NAME": self.network.key_name,
            "AUTOSCALER_DASK_SCHEDULER_URL": self.scheduler_address,
            "AUTOSCALER_HTTP_PORT": str(self.options.http_port),
            "AUTOSCALER_HTTP_HOST": "127.0.0.1",
            "AUTOSCALER_LOG_FORMAT": "console",
        }
        if self.options.real_swarm:
            env["AUTOSCALER_DOCKER_URL"] = self._swarm.manager_url
        env.update({f"AUTOSCALER_{k}": v for k, v in self.options.timing().items()})
        if self.boots_from_user_data:
            # Each machine loads the worker image (about 250 MB) into its own dockerd before its user data
            # runs (an AMI would have it baked in): several at once on a small host take minutes, which the
            # emulator's shortcut never does. Below that, booting machines are ended as broken.
            env["AUTOSCALER_MAX_START_TIME"] = "240s"
        return env

    def join_ticket_env(self, port: int, *, auto: bool = False) -> dict[str, str]:
        """Settings that turn join tickets on for a daemon of this cloud serving its join endpoint (TLS) on
        127.0.0.1:`port` (every loopback source reaches it). Needs a loopback VPC
        (`LocalCloudOptions.vpc_prefix`). `auto`: `AUTOSCALER_EC2_JOIN_URL=auto`, the daemon listening on
        its swarm manager's own address (`join_host`), where `auto` sends the machines, as the README's
        stack publishes the join port on each manager."""
        if not self.options.vpc_prefix.startswith("127."):
            raise ConfigurationError(
                "join tickets on the local cloud need a loopback VPC (LocalCloudOptions.vpc_prefix='127.N'): "
                "a machine's boot must send from its PrivateIpAddress"
            )
        host = self.join_host() if auto else "127.0.0.1"
        return {
            "AUTOSCALER_HTTP_HOST": host,
            "AUTOSCALER_EC2_JOIN_PORT": str(port),
            "AUTOSCALER_EC2_JOIN_URL": "auto" if auto else f"https://127.0.0.1:{port}/v1/join",
        }

    def join_host(self) -> str:
        """The swarm manager's own address (the real swarm's manager advertises it; the in-memory swarm's
        `manager_address`): where `AUTOSCALER_EC2_JOIN_URL=auto` sends the machines."""
        from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm

        if isinstance(self._swarm, LocalSwarm):
            return str(self._swarm.manager.address)
        return str(self._swarm.manager_address).rpartition(":")[0]

    def write_env_file(self, extra: Mapping[str, str] | None = None) -> Path:
        path = Path(self._tmp.name) / "daemon.env"
        lines = [f"{k}={quote_env(v)}" for k, v in {**self.env(), **(extra or {})}.items()]
        path.write_text("\n".join(lines) + "\n")
        return path

    @contextlib.asynccontextmanager
    async def daemon(self, extra: Mapping[str, str] | None = None) -> AsyncIterator[Daemon]:
        """The real daemon, built in-process from settings exactly as `swarm-autoscaler run` does."""
        from swarm_autoscaler.config.settings import load_settings
        from swarm_autoscaler.daemon.app import open_daemon

        settings = load_settings(self.write_env_file(extra))
        override = None if self.options.real_swarm else self.orchestrator
        async with open_daemon(settings, orchestrator=override) as daemon:
            yield daemon

    async def __aexit__(self, *exc: object) -> None:
        if self.emulator is not None:
            # Let the emulator finish its step: cancelling it mid-leave would abandon a dockerd being
            # stopped in a worker thread (already dropped from the swarm's node list, so never torn down).
            self.emulator.stopping = True
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 60)
        self._tasks.clear()
        await self._stack.aclose()
        with contextlib.suppress(OSError):
            self._tmp.cleanup()


def loopback_prefix() -> str:
    """A loopback VPC prefix, `127.N`, that no other local cloud on this machine uses (`loopback`: held
    until this process exits)."""
    return claim_loopback_prefix()


def quote_env(value: str) -> str:
    """`value` as an env file reads it back unchanged."""
    if any(c in value for c in " \"'#{}"):
        return "'" + value.replace("'", "'\"'\"'") + "'"
    return value


def env_without_autoscaler() -> dict[str, str]:
    """The current environment minus AUTOSCALER_* variables (so a user's settings cannot leak in)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
