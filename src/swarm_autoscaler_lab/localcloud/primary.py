"""One booted primary of an on-demand cluster in the local cloud: what a keeper's primary instance
becomes when its boot script has run.

On AWS the primary's boot script makes it the manager of a swarm of its own, starts a dask scheduler
there, and runs that cluster's autoscaler as a swarm service (the keeper does lifecycle only). Here the
same parts run in this process:

- a swarm of its own (`MemorySwarm`, named after the cluster id, the primary listed as its manager,
  with a join token of its own so that no other cluster's machine can join it);
- a real dask scheduler listening on the primary's private IP (the keeper's local VPC is carved from
  127.0.0.0/8, so that address is a loopback one) on the ports the keeper expects (8786, and 8787 for
  HTTP: `/health`, `/metrics`);
- the real autoscaler daemon for that cluster, built from settings by `open_daemon` exactly as
  `swarm-autoscaler run` builds it, with `AUTOSCALER_CLUSTER_NAME=<cluster id>` and that scheduler;
- a machine emulator for its workers only (the instances tagged with the cluster's ownership tags),
  which join its swarm and connect to its scheduler.

`close()` stops them in the reverse order: the daemon, the workers, the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from distributed import Scheduler

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import Availability, Node, NodeStatus
from swarm_autoscaler.daemon.loop import Daemon
from swarm_autoscaler_lab.localcloud import tls_files
from swarm_autoscaler_lab.localcloud.cloud import quote_env
from swarm_autoscaler_lab.localcloud.machines import MachineEmulator, MemoryJoiner
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

log = structlog.get_logger("swarm_autoscaler_lab.localcloud.primary")

SCHEDULER_PORT = 8786
DASHBOARD_PORT = 8787


@dataclass(frozen=True, slots=True)
class PrimaryBoot:
    """What a primary knows of itself when it boots (from EC2: its id, tags and address, and the
    AUTOSCALER_* lines of its boot script)."""

    instance_id: str
    cluster_id: str
    hostname: str
    private_ip: str
    user_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    credentials_url: str = ""  # the boot script's fetch of its TLS files ("": plain tcp)
    credentials_token: str = ""


@dataclass(frozen=True, slots=True)
class PrimaryOptions:
    """How primaries boot. `daemon_env(boot, scheduler_url)` gives the AUTOSCALER_* settings of the
    cluster's autoscaler (what a real primary's boot script hands its autoscaler service)."""

    ec2_endpoint: str
    region: str
    workdir: Path
    scheduler_port: int = SCHEDULER_PORT
    dashboard_port: int = DASHBOARD_PORT
    worker_boot_delay: float = 1.0
    emulator_interval: float = 0.3


class LocalPrimary:
    """One primary's swarm, scheduler, autoscaler and worker machines. `start()` once, `close()` once."""

    def __init__(self, boot: PrimaryBoot, options: PrimaryOptions, daemon_env: Mapping[str, str]) -> None:
        self.boot = boot
        self.options = options
        self.daemon_env = dict(daemon_env)
        self.swarm = MemorySwarm(
            join_token=f"SWMTKN-{boot.cluster_id}",
            manager_address=f"{boot.private_ip}:2377",
            cluster_name=boot.cluster_id,
        )
        self.scheduler: Scheduler | None = None
        self.daemon: Daemon | None = None
        self.emulator: MachineEmulator | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stack = contextlib.AsyncExitStack()
        self.tls_paths: dict[str, str] = {}
        self._security: tuple[Any, Any] | None = None

    @property
    def scheduler_url(self) -> str:
        scheme = "tls" if self.boot.credentials_url else "tcp"
        return f"{scheme}://{self.boot.private_ip}:{self.options.scheduler_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.boot.private_ip}:{self.options.dashboard_port}"

    async def start(self) -> None:
        """Boot: manager node, scheduler, autoscaler, worker emulator. On failure, whatever started is
        stopped again and the error raised (the emulator retries the boot, as cloud-init would)."""
        try:
            self._add_manager_node()
            await self._fetch_credentials()
            await self._start_scheduler()
            await self._start_daemon()
            self._start_workers()
        except BaseException:
            await self.close()
            raise
        log.info("primary booted", cluster=self.boot.cluster_id, scheduler=self.scheduler_url)

    def _add_manager_node(self) -> None:
        node = Node(
            id=f"manager-{self.boot.cluster_id}",
            hostname=self.boot.hostname,
            availability=Availability.ACTIVE,
            status=NodeStatus.READY,
            is_manager=True,
        )
        self.swarm.nodes[node.id] = node

    async def _fetch_credentials(self) -> None:
        """As the default boot script's curl: the cluster's TLS files, once, with the one-time token."""
        if not self.boot.credentials_url:
            return
        body = await tls_files.fetch(
            self.boot.credentials_url, self.boot.credentials_token, source=self.boot.private_ip
        )
        folder = self.options.workdir / f"{self.boot.cluster_id}-tls"
        self.tls_paths = tls_files.write_files(folder, body["files"])
        if body.get("listing_token"):  # as the boot script's keeper-listing-token secret (0600)
            self.tls_paths.update(tls_files.write_files(folder, {"listing-token": body["listing_token"]}))
        self._security = tls_files.primary_security(self.tls_paths)

    async def _start_scheduler(self) -> None:
        ip = self.boot.private_ip
        self.scheduler = await Scheduler(
            protocol="tls" if self._security else None,
            security=self._security[0] if self._security else None,
            host=ip,
            port=self.options.scheduler_port,
            dashboard=False,  # /health and /metrics are served all the same
            dashboard_address=f"{ip}:{self.options.dashboard_port}",
            validate=False,
        )
        self._stack.push_async_callback(self.scheduler.close)
        port = getattr(self.scheduler.http_server, "port", None)
        if port != self.options.dashboard_port:  # distributed moves to a free port when it is taken
            raise OSError(f"{ip}:{self.options.dashboard_port} is in use (the scheduler's HTTP got {port})")

    async def _start_daemon(self) -> None:
        from swarm_autoscaler.config.settings import load_settings
        from swarm_autoscaler.daemon.app import open_daemon

        env = {
            **self.daemon_env,
            "AUTOSCALER_CLUSTER_NAME": self.boot.cluster_id,
            "AUTOSCALER_DASK_SCHEDULER_URL": self.scheduler_url,
        }
        if self.tls_paths:  # as the default boot script's cluster.env: the workers' certificate
            env["AUTOSCALER_DASK_TLS_CA_FILE"] = self.tls_paths["ca.pem"]
            env["AUTOSCALER_DASK_TLS_CERT_FILE"] = self.tls_paths["worker.pem"]
            env["AUTOSCALER_DASK_TLS_KEY_FILE"] = self.tls_paths["worker-key.pem"]
        if "listing-token" in self.tls_paths:  # the boot script's swarm secret is this file here
            env["AUTOSCALER_EC2_LISTING_TOKEN_FILE"] = self.tls_paths["listing-token"]
        path = self.options.workdir / f"{self.boot.cluster_id}.env"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k}={quote_env(v)}\n" for k, v in env.items()))
        settings = load_settings(path)
        self.daemon = await self._stack.enter_async_context(
            open_daemon(settings, orchestrator=self.swarm, serve_http=False)
        )
        task = asyncio.create_task(self.daemon.run(self._stop), name=f"autoscaler:{self.boot.cluster_id}")
        self._tasks.append(task)

    def _start_workers(self) -> None:
        from swarm_autoscaler.adapters.ec2 import owner_tags

        assert self.scheduler is not None
        self.emulator = MachineEmulator(
            ec2_endpoint=self.options.ec2_endpoint,
            region=self.options.region,
            tag_filters=owner_tags(self.boot.cluster_id),
            orchestrator=self.swarm,
            joiner=MemoryJoiner(self.swarm),
            scheduler_address=self.scheduler_url,
            catalogue=CATALOGUE,
            boot_delay=self.options.worker_boot_delay,
            security=self._security[1] if self._security else None,
        )
        self._tasks.append(asyncio.create_task(self.emulator.run(self.options.emulator_interval)))

    async def close(self) -> None:
        """Stop the autoscaler, then the workers, then the scheduler. Idempotent."""
        self._stop.set()
        if self.emulator is not None:
            self.emulator.stopping = True
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 30)
        self._tasks.clear()
        if self.emulator is not None:
            await self.emulator.close()
        await self._stack.aclose()
        log.info("primary stopped", cluster=self.boot.cluster_id)

    def worker_count(self) -> int:
        """Worker machines booted into this primary's swarm (its manager excluded)."""
        return sum(1 for n in self.swarm.nodes.values() if not n.is_manager and n.status == NodeStatus.READY)
