"""The machine emulator: makes the daemon's EC2 instances (in a moto server) boot like real machines.

It watches the cloud for instances carrying the ownership tags. After `boot_delay` seconds an instance
"boots": it reads its own user data, finds the `docker swarm join --token T ADDR` line the daemon put
there, and joins the swarm with that token through a `Joiner` (an in-memory swarm, or a real dockerd
node in its own UTS namespace). While its node is active and ready it runs a dask worker named after
its hostname, with the instance type's resources, as a swarm global service would; draining the node
stops the worker; terminating the instance makes the machine leave.

Machines boot concurrently, as EC2's do: each one seen gets its own task that sleeps until its boot
time (`boot_delay` plus a uniform draw in `[0, boot_jitter)`, from when the emulator first saw it), then
joins and starts its worker at once, whatever the other machines are doing. `step()` only finds new and
gone instances and keeps each booted machine's worker in line with its node (drain, activate).

Warm pool: a machine whose user data has no join line but ends with the pool's stop line (a launch
into the warm pool) boots, and stops itself (StopInstances on its own id, as its `shutdown -h now`
would with InstanceInitiatedShutdownBehavior=stop), never joining. A stopped machine leaves like a
terminated one (worker stopped, its dockerd node gone); when it is started again it boots after
`start_boot_delay` (a started machine boots faster than a new one: no image to pull) and joins with
the join line the daemon wrote into its user data before the start.

Two boots. The shortcut above (read the join line, join through a `Joiner`, start an in-process worker)
serves the in-memory swarm only. Its worker publishes what the machine's user data wrote into its worker env
file (`config.worker.worker_env`, which the real boot's worker reads from the file): the type's resources
minus its overhead and `AUTOSCALER_EC2_MEMORY_OVERHEAD_PERCENT` of its memory, as the daemon counts them;
it runs with no memory limit (every in-process worker shares one process, whose memory dask would count
against each of them); a machine launched without that file in its user data (a test's own launch) gets
the same function's figures for the type with the daemon's default overhead. Where the nodes are real
dockerd nodes (`shortcut_allowed=False`), a machine that would take it does not boot, and the log says
why. The real boot (`user_data_boot`, `localcloud.userdata.UserDataBoot`, real dockerd nodes only) runs
the instance's actual user data on its own dockerd node: its own `docker swarm join` joins, its `shutdown`
stops the instance (the warm pool), and the emulator starts no worker: swarm runs the worker global
service's task on the node.

Hostnames: each machine's OS reports either EC2's short hostname (`ip-10-0-1-23`: Ubuntu, Debian) or its
full private DNS name (`ip-10-0-1-23.ec2.internal`: Amazon Linux), and its node and worker take that name.
`full_hostname_share` of the machines (by default every other one, the first included, so at least half)
take the full form; a machine keeps its form across stops and starts (`os_hostnames`), so the daemon's
matching is tested on both (`adapters.hostnames`).

Faults for tests: `never_join` (instance ids or a probability) makes a machine boot but never join.

Why one file of this size: one machine's life (seen, booted by either path, prepared, started again,
stopped, gone) is one state machine over one `Machine` record; split, each half would re-read the other.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import boto3
import dask
import structlog
from distributed import Worker

from swarm_autoscaler.adapters.ec2_support import POOL_STOP_LINE
from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.config.types import MEMORY_OVERHEAD_PERCENT, AllowedType
from swarm_autoscaler.config.worker import WORKER_ENV_FILE, worker_env
from swarm_autoscaler.core.model import Availability, InstanceType, NodeStatus
from swarm_autoscaler.core.ports import Orchestrator
from swarm_autoscaler.runtime.worker import parse_env, profiler_is_unsafe

log = structlog.get_logger("swarm_autoscaler_lab.localcloud.machines")

JOIN_RE = re.compile(r"docker\s+swarm\s+join\s+(--availability\s+pause\s+)?--token\s+(\S+)\s+(\S+)")


class UserDataRunLike(Protocol):
    """What a boot reports (`userdata.UserDataRun`, a frozen dataclass: read-only here too)."""

    @property
    def returncode(self) -> int: ...

    @property
    def output(self) -> str: ...

    @property
    def powered_off(self) -> bool: ...


class UserDataBooter(Protocol):
    """The real boot (`userdata.UserDataBoot`): the machine runs its own user data on its own node."""

    async def boot(self, hostname: str, raw: str | bytes) -> UserDataRunLike: ...


class Joiner(Protocol):
    """How an emulated machine becomes (and stops being) a swarm node. `paused`: the join line says
    `--availability pause` (the dynamic mode's machines join paused)."""

    async def join(self, hostname: str, token: str, manager_address: str, paused: bool = False) -> None: ...

    async def leave(self, hostname: str) -> None: ...


# The heredoc that writes the worker env file in the daemon's user data (`config.worker.worker_env_script`).
WORKER_ENV_RE = re.compile(
    rf"cat > {re.escape(WORKER_ENV_FILE)} <<'(\w+)'\n(.*?)^\1$", re.DOTALL | re.MULTILINE
)
# A machine launched without the daemon's worker env (a test's own launch): the type with no overhead of
# its own (the AMI is never read) and the daemon's default memory overhead.
UNCONFIGURED = AllowedType(ami_id="ami-00000000")


def worker_env_in(user_data: str) -> dict[str, str] | None:
    """The worker env file's variables that the user data writes, or None when it writes none."""
    match = WORKER_ENV_RE.search(user_data)
    return parse_env(match.group(2)) if match else None


def published(env: Mapping[str, str]) -> tuple[dict[str, float], int]:
    """The dask resources and threads a worker started from this worker env publishes (what the worker
    service's entrypoint passes to `dask worker`, `runtime.worker.worker_argv`)."""
    pairs = (item.rsplit("=", 1) for item in env["SWARM_AUTOSCALER_WORKER_RESOURCES"].split())
    return {name: float(amount) for name, amount in pairs}, int(env["SWARM_AUTOSCALER_WORKER_NTHREADS"])


@dataclass
class Machine:
    instance_id: str
    hostname: str
    type_name: str
    seen_at: float
    joined: bool = False
    joined_at: float | None = None
    never_joins: bool = False
    worker: Worker | None = None
    boot_at: float = 0.0  # when it boots (emulator clock)
    booting: asyncio.Task[None] | None = None  # its boot, while under way
    committed: bool = False  # the boot got past its sleep: joining or starting its worker
    worker_up_at: float | None = None  # when its worker first registered (emulator clock)
    prepared: bool = False  # booted into the warm pool and stopped itself
    prepared_at: float | None = None  # when it stopped itself (emulator clock)
    from_user_data: bool = False  # ran its own user data (the real boot): swarm runs its worker


@dataclass
class MachineEmulator:
    """Boots, runs and stops emulated machines. Call `step()` periodically, or `run()` as a task."""

    ec2_endpoint: str
    region: str
    tag_filters: Mapping[str, str]
    orchestrator: Orchestrator
    joiner: Joiner
    scheduler_address: str
    catalogue: Mapping[str, InstanceType]
    boot_delay: float = 3.0
    boot_jitter: float = 0.0  # each machine boots within [boot_delay, boot_delay + boot_jitter)
    start_boot_delay: float = 0.5  # a stopped machine started again boots after this long
    never_join_rate: float = 0.0
    never_join_ids: set[str] = field(default_factory=set)
    # None: each worker publishes its machine's worker env (module doc); a test may set the resources itself
    worker_resources: Callable[[InstanceType], dict[str, float]] | None = None
    security: Any = None  # dask `Security` of the workers, for a tls:// scheduler
    seed: int = 0
    full_hostname_share: float = 0.5  # machines whose OS reports the full private DNS name (Amazon Linux)
    # The real boot (real-dockerd path): each machine runs its user data on its own dockerd node, and its
    # dask worker is the one swarm starts there from the worker service. None = the shortcut (in-memory
    # demo): read the join line, join through `joiner`, start an in-process worker while the node is active.
    user_data_boot: UserDataBooter | None = None
    # False where the nodes are real dockerd nodes (LocalCloud with real_swarm): a machine that would take
    # the shortcut there does not boot (logged), so no test on that path passes on the shortcut unawares.
    shortcut_allowed: bool = True
    clock: Callable[[], float] = lambda: asyncio.get_running_loop().time()
    machines: dict[str, Machine] = field(default_factory=dict)
    joined_total: int = 0
    prepared_total: int = 0  # machines that booted into the warm pool and stopped themselves
    failed_boots: int = 0  # machines whose user data failed and stopped them (the real boot)
    booted: set[str] = field(default_factory=set)  # instance ids that booted at least once
    stopping: bool = False  # set to end `run()` after the current step (a half-done leave is never abandoned)
    # The last listing of the live (pending or running) owned instances, and when it was read (`clock`):
    # a world polled for its state can answer from it instead of listing the whole fleet once more.
    listing: dict[str, tuple[str, str]] = field(default_factory=dict)
    listed_at: float | None = None
    os_hostnames: dict[str, str] = field(default_factory=dict)  # instance id -> the name its OS reports
    # instance id -> the worker env file its user data wrote (the shortcut): kept across a stop and a start,
    # as its volume keeps the file (a started pool machine's user data only joins)
    worker_envs: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._ec2: Any = boto3.client(
            "ec2",
            endpoint_url=self.ec2_endpoint,
            region_name=self.region,
            aws_access_key_id="local",
            aws_secret_access_key="local",  # the local moto server accepts any credentials
        )

    async def run(self, interval: float = 0.5) -> None:
        while not self.stopping:
            try:
                await self.step()
            except Exception as exc:  # the emulator keeps going like real machines would
                log.warning("machine emulator step failed", error=str(exc))
            await asyncio.sleep(interval)

    async def step(self) -> None:
        asked = self.clock()
        live = await asyncio.to_thread(self._describe)
        now = self.clock()
        self.listing, self.listed_at = live, now
        for iid, (dns_name, type_name) in live.items():
            known = self.machines.get(iid)
            if known is not None and known.prepared_at is not None and known.prepared_at < asked:
                # it stopped itself before this listing began and is live again: started from the pool
                # between two steps (never seen stopped), so it boots again below
                self.machines.pop(iid)
            if iid not in self.machines:
                never = iid in self.never_join_ids or self._rng.random() < self.never_join_rate
                machine = Machine(iid, self.os_hostname(iid, dns_name), type_name, now, never_joins=never)
                jitter = self._rng.uniform(0.0, self.boot_jitter) if self.boot_jitter else 0.0  # seeded draws
                machine.boot_at = now + self.boot_delay + jitter  # as before when there is no jitter
                if iid in self.booted:  # started again: its volume kept everything
                    machine.boot_at = now + self.start_boot_delay
                self.machines[iid] = machine
        for iid in [i for i in self.machines if i not in live]:
            await self._shutdown(self.machines.pop(iid))
        active: set[str] | None = None  # listed once per step, and only once a machine has joined
        for machine in self.machines.values():
            if machine.booting is not None and machine.booting.done():
                machine.booting = None  # a failed boot is tried again below
            if machine.booting is not None or machine.never_joins or machine.prepared:
                continue
            if not machine.joined:
                machine.booting = asyncio.create_task(self._boot_and_start(machine))
                continue
            if active is None:
                active = await self._active_hostnames()
            await self._run_worker(machine, machine_hostname(machine.hostname) in active)

    async def close(self) -> None:
        for machine in list(self.machines.values()):
            await self._shutdown(machine)
        self.machines.clear()

    # --- one machine ---------------------------------------------------------------------------

    async def _boot_and_start(self, machine: Machine) -> None:
        """One machine's boot: sleep until its boot time, join, and start its worker if its node is
        active. Cancelled only during the sleep (see `_shutdown`)."""
        try:
            await asyncio.sleep(max(0.0, machine.boot_at - self.clock()))
            machine.committed = True
            await self._boot(machine)
            active = await self._active_hostnames()
            await self._run_worker(machine, machine_hostname(machine.hostname) in active)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next step tries again, like a machine's retrying cloud-init
            log.warning("machine boot failed", hostname=machine.hostname, error=str(exc))
        finally:
            machine.committed = False

    async def _boot(self, machine: Machine) -> None:
        """Join the swarm (once), or stop into the warm pool when the user data says so."""
        if not machine.joined and self.user_data_boot is not None:
            await self._boot_from_user_data(machine)
            return
        if not machine.joined and not self.shortcut_allowed:
            raise RuntimeError(
                "the shortcut boot is for the in-memory swarm: on real dockerd nodes a machine boots from "
                "its user data (LocalCloud.real_boot_on, or LocalCloudOptions.real_boot)"
            )
        if not machine.joined:
            text = await asyncio.to_thread(self._user_data_text, machine.instance_id)
            line = join_line(machine.instance_id, text)
            env = worker_env_in(text)
            if env is not None:
                self.worker_envs[machine.instance_id] = env
            self.booted.add(machine.instance_id)
            if line is None:  # prepared for the warm pool: the machine shuts itself down
                await asyncio.to_thread(self._ec2.stop_instances, InstanceIds=[machine.instance_id])
                machine.prepared, machine.prepared_at = True, self.clock()
                self.prepared_total += 1
                log.info("machine prepared for the warm pool and stopped", hostname=machine.hostname)
                return
            token, address, paused = line
            if paused:
                await self.joiner.join(machine.hostname, token, address, paused=True)
            else:
                await self.joiner.join(machine.hostname, token, address)
            machine.joined = True
            machine.joined_at = self.clock()
            self.joined_total += 1
            log.info("machine joined the swarm", hostname=machine.hostname, instance=machine.instance_id)

    async def _boot_from_user_data(self, machine: Machine) -> None:
        """The real boot: run the instance's user data on its own node; its join is the one that joins."""
        assert self.user_data_boot is not None
        raw = await asyncio.to_thread(self._user_data, machine.instance_id)
        self.booted.add(machine.instance_id)
        machine.from_user_data = True
        run = await self.user_data_boot.boot(machine.hostname, raw)
        if run.powered_off and run.returncode != 0:  # a failed boot stops itself (adapters.boot_scripts)
            await asyncio.to_thread(self._ec2.stop_instances, InstanceIds=[machine.instance_id])
            machine.never_joins = True
            self.failed_boots += 1
            tail = "\n".join(run.output.strip().splitlines()[-3:])
            log.warning("machine boot failed and it stopped itself", hostname=machine.hostname, output=tail)
            return
        if run.powered_off:  # the warm pool's first boot ends with shutdown: InitiatedShutdownBehavior=stop
            await asyncio.to_thread(self._ec2.stop_instances, InstanceIds=[machine.instance_id])
            machine.prepared, machine.prepared_at = True, self.clock()
            self.prepared_total += 1
            log.info("machine ran its user data and stopped", hostname=machine.hostname)
            return
        if run.returncode != 0:
            tail = "\n".join(run.output.strip().splitlines()[-10:])
            raise RuntimeError(f"user data of {machine.instance_id} exited {run.returncode}: {tail}")
        machine.joined = True
        machine.joined_at = self.clock()
        self.joined_total += 1
        log.info(
            "machine ran its user data and joined", hostname=machine.hostname, instance=machine.instance_id
        )

    async def _run_worker(self, machine: Machine, node_active: bool) -> None:
        """A worker runs exactly while the machine's node is active and ready (a global service)."""
        if machine.from_user_data:
            return  # the real boot: swarm runs the worker service's task on the node, not the emulator
        if machine.prepared:
            return
        if node_active and machine.worker is None:
            machine.worker = await self._start_worker(machine)
            if machine.worker_up_at is None:
                machine.worker_up_at = self.clock()
        elif not node_active and machine.worker is not None:
            await self._stop_worker(machine)

    async def _active_hostnames(self) -> set[str]:
        return {
            node.hostname
            for node in await self.orchestrator.list_nodes()
            if node.availability == Availability.ACTIVE and node.status == NodeStatus.READY
        }

    async def _start_worker(self, machine: Machine) -> Worker:
        resources, nthreads = self.worker_publishes(machine)
        # as the worker service does on Python 3.11 (runtime.worker: the profiler can deadlock it); here
        # one deadlock stops every emulated machine, the scheduler and the test at once
        with dask.config.set({"distributed.worker.profile.enabled": not profiler_is_unsafe()}):
            worker = Worker(
                self.scheduler_address,
                name=machine.hostname,
                nthreads=nthreads,
                resources=resources,
                memory_limit=0,
                host="127.0.0.1",
                dashboard=False,
                validate=False,
                security=self.security,
            )
        await worker
        return worker

    def worker_publishes(self, machine: Machine) -> tuple[dict[str, float], int]:
        """The resources and threads of the machine's in-process worker (the shortcut; module doc)."""
        itype = self.catalogue[machine.type_name]
        if self.worker_resources is not None:
            return self.worker_resources(itype), max(1, int(itype.resources.cpus))
        env = self.worker_envs.get(machine.instance_id)
        return published(env or worker_env(itype, UNCONFIGURED, MEMORY_OVERHEAD_PERCENT))

    async def _stop_worker(self, machine: Machine) -> None:
        worker, machine.worker = machine.worker, None
        if worker is not None:
            with contextlib.suppress(Exception):
                await worker.close(timeout=5)

    async def _shutdown(self, machine: Machine) -> None:
        booting, machine.booting = machine.booting, None
        if booting is not None and not booting.done():
            if machine.committed:  # joining or starting its worker: let that finish, then leave
                with contextlib.suppress(Exception):
                    await booting
            else:
                booting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await booting
        await self._stop_worker(machine)
        if machine.joined:
            with contextlib.suppress(Exception):
                await self.joiner.leave(machine.hostname)
            log.info("machine left", hostname=machine.hostname, instance=machine.instance_id)

    def os_hostname(self, instance_id: str, dns_name: str) -> str:
        """The hostname the machine's OS reports (see the module doc), fixed when first asked."""
        name = self.os_hostnames.get(instance_id)
        if name is None:
            seen = len(self.os_hostnames)
            full = (seen * self.full_hostname_share) % 1.0 < self.full_hostname_share
            name = dns_name if full else dns_name.split(".", 1)[0]
            self.os_hostnames[instance_id] = name
        return name

    # --- the cloud, through boto3 (sync; run in a thread) ----------------------------------------

    def _describe(self) -> dict[str, tuple[str, str]]:
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in self.tag_filters.items()]
        filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
        out: dict[str, tuple[str, str]] = {}
        for page in self._ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    dns_name = inst.get("PrivateDnsName") or inst["InstanceId"]
                    out[inst["InstanceId"]] = (dns_name, inst["InstanceType"])
        return out

    def _user_data(self, instance_id: str) -> str:
        attr = self._ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return str(attr.get("UserData", {}).get("Value", ""))

    def _user_data_text(self, instance_id: str) -> str:
        raw = self._user_data(instance_id)
        return base64.b64decode(raw).decode() if raw else ""


def join_line(instance_id: str, text: str) -> tuple[str, str, bool] | None:
    """(token, manager address, joins paused) from the user data's join line; None for a warm-pool
    machine's first boot (no join line, the pool's stop line)."""
    if '"$join_token"' in text:  # a join ticket (adapters.join_tickets): only a real boot can use it
        raise RuntimeError(
            f"instance {instance_id}: its user data joins with a join ticket, which needs the real boot "
            "(real dockerd nodes and a loopback VPC: LocalCloudOptions.vpc_prefix)"
        )
    match = JOIN_RE.search(text)
    if match is None:
        if POOL_STOP_LINE in text:
            return None
        raise RuntimeError(f"instance {instance_id}: no 'docker swarm join' line in its user data")
    return match.group(2), match.group(3), match.group(1) is not None


class MemoryJoiner:
    """Joins machines to a MemorySwarm; leaving marks the node down, as swarm does when a machine dies."""

    def __init__(self, swarm: Any) -> None:
        self.swarm = swarm

    async def join(self, hostname: str, token: str, manager_address: str, paused: bool = False) -> None:
        existing = self.swarm.by_hostname(hostname)
        if existing is not None:
            self.swarm.set_status(hostname, NodeStatus.READY)
            return
        if paused:
            self.swarm.join(hostname, token, paused=True)
        else:
            self.swarm.join(hostname, token)

    async def leave(self, hostname: str) -> None:
        self.swarm.set_status(hostname, NodeStatus.DOWN)
