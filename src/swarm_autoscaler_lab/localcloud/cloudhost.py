"""The chaos world: a "cloud host" process that a real `swarm-autoscaler run` process drives.

One process holds the whole world, so the daemon can be killed and restarted without losing it: moto's EC2
(with the project's fault injector), a real dask scheduler, the machine emulator booting the daemon's
instances into an in-memory swarm, that swarm served over an imitation of the Docker Engine API
(`dockerapi`), and a dask client playing the user (a backlog of short tasks, then a cancellation).

Guards live here, never in the daemon. Right before a TerminateInstances reaches moto, and right before a
node is drained or removed, the guard asks the scheduler what the machine's worker is doing *at that
moment*; when it is processing a task or holds a result that exists on no other worker, the action is
recorded as a hit (`GuardHit`). The daemon's logs are never the oracle.

The world is slow and uneven on purpose, from a seeded RNG (the seed is printed): joins take
`boot_delay` plus up to `boot_jitter` seconds, some DescribeInstances calls are slowed, the docker API
answers after a random latency and some node updates meet a concurrent writer ("update out of
sequence"), and the scheduler refuses to retire some workers: each worker named in a retire request, with probability
`keep_rate`, receives a result that only it holds just as the request arrives (a user's late result) and the
scheduler keeps it, as dask does when it cannot move a unique result. The user holds such a result for
`hold_s` seconds.

The process around it, with its control API, is `cloudhost_main` (`python -m
swarm_autoscaler_lab.localcloud.cloudhost_main --ready FILE`).

Why one file of this size: the guards must see the whole world at the moment of an action, so the world
and its guards live in one process and one module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import boto3
from aiohttp import web
from distributed import Client as _Client
from distributed import Scheduler
from distributed.utils_comm import scatter_to_workers as _scatter_to_workers

from swarm_autoscaler.adapters.ec2 import owner_tags
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import Node, NodeStatus
from swarm_autoscaler_lab.localcloud.chaos_procs import stop_process
from swarm_autoscaler_lab.localcloud.cloudhost_services import ServiceLoad
from swarm_autoscaler_lab.localcloud.dockerapi import DockerApi
from swarm_autoscaler_lab.localcloud.ec2_strict import chaos_strict, fired
from swarm_autoscaler_lab.localcloud.machines import MachineEmulator, MemoryJoiner
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY, MotoServer
from swarm_autoscaler_lab.localcloud.moto_server import provision_network as _provision

GUARD_TIMEOUT_S = 10.0
LAG_PROBE_S = 0.1
LISTING_MAX_AGE_S = 2.5
MOTO_READY_TIMEOUT_S = 60.0
_MOTO_MODULE = "swarm_autoscaler_lab.localcloud.moto_proc"
# distributed ships no type hints for these; treat them as dynamic in one place.
Client: Any = _Client
scatter_to_workers: Any = _scatter_to_workers


@dataclass(frozen=True, slots=True)
class WorldOptions:
    """How the world is built and how unkind it is. Times are seconds."""

    seed: int = 0
    cluster_name: str = "chaos"
    allowed_types: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: {"m5.large": {"reserve": 1}, "m5.xlarge": {}}
    )
    min_instances: int = 0
    max_instances: int = 14
    max_start_time: float = 8.0
    boot_delay: float = 3.0
    boot_jitter: float = 9.0
    emulator_interval: float = 0.5
    keep_rate: float = 0.25
    hold_s: float = 12.0
    docker_latency: tuple[float, float] = (0.01, 0.15)
    conflict_rate: float = 0.05
    slow_ec2_rate: float = 0.25
    slow_ec2_max: float = 2.0
    moto_process: bool = False  # moto in a process of its own (`moto_proc`), off this process's GIL
    dynamic: bool = False  # the daemon's dynamic mode: swarm services, not dask tasks (`cloudhost_services`)
    # EC2's rules where moto is generous, for the daemon's requests (`ec2_strict`): the chaos test's worlds
    # turn it on; off by default, as its room (3 machines of a type per zone, 28 vCPUs) would cap a bench's
    # fleet (the peer bench's waves200 got 9 machines under a maximum of 20 while it was on by default)
    strict_ec2: bool = False

    @property
    def min_plus_reserve(self) -> int:
        return self.min_instances + sum(int(s.get("reserve", 0)) for s in self.allowed_types.values())


def _spawn_moto(options: WorldOptions, ready: Path, guard_url: str) -> subprocess.Popen[bytes]:
    """Start `moto_proc` (its output goes to a log beside its ready file)."""
    args = ["--ready", str(ready), "--guard", guard_url, "--seed", str(options.seed)]
    args += ["--slow-rate", str(options.slow_ec2_rate), "--slow-max", str(options.slow_ec2_max)]
    args += ["--strict"] if options.strict_ec2 else []
    with (ready.parent / "moto.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", _MOTO_MODULE, *args], stdout=log, stderr=subprocess.STDOUT
        )


@dataclass(frozen=True, slots=True)
class GuardHit:
    """A disruptive action that reached a machine whose worker was busy or held a unique result."""

    kind: str  # "terminate", "drain" or "remove"
    hostname: str
    target: str  # instance id or node id
    processing: int
    unique_results: int
    at: float  # seconds since the world started


def _work(seconds: float) -> int:
    """One backlog task: a short wait, as a worker thread would spend on I/O."""
    time.sleep(seconds)
    return 1


class CloudHost:
    """The world. `async with CloudHost(options) as world:`; everything stops on exit."""

    def __init__(self, options: WorldOptions) -> None:
        self.options = options
        self.started = time.monotonic()
        self.moto = MotoServer(seed=options.seed)
        self.swarm = MemorySwarm()
        self.hits: list[GuardHit] = []
        self.faults: Counter[str] = Counter()
        self.disruptions: Counter[str] = Counter()
        self._rng = random.Random(options.seed)
        self._thread_rng = random.Random(options.seed + 1)
        self._thread_lock = threading.Lock()
        self._backlog: list[Any] = []
        self._held: list[tuple[float, str]] = []
        self._late: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._machines: asyncio.Task[None] | None = None
        self._stack = contextlib.AsyncExitStack()
        self.scheduler: Any = None
        self.client: Any = None
        self.emulator: MachineEmulator | None = None
        self.docker_url = ""
        self.done = 0
        self._ec2: Any = None
        self.ec2_endpoint = ""
        self._moto_control = ""  # the moto process's control URL (`moto_process`)
        self.loop_lags: list[tuple[float, float]] = []  # (when, how late) each probe's short sleep woke
        self.services = ServiceLoad(self.swarm, lambda: self.emulator) if options.dynamic else None
        # A network partition (`partition`): the hosts whose nodes look down, and every disruption of one
        # of them while it lasts (the safety stop must allow none).
        self.partitioned: set[str] = set()
        self.partition_disruptions: Counter[str] = Counter()

    async def __aenter__(self) -> CloudHost:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- building the world --------------------------------------------------------------------

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.options.moto_process:
            await self._start_moto_process()
        else:
            self.moto.start()
            self._stack.callback(self.moto.stop)
            self.moto.faults.be_strict(chaos_strict() if self.options.strict_ec2 else None)
            self.ec2_endpoint = self.moto.endpoint
            self.moto.faults.watch(self._on_ec2_call)
        self.network = await asyncio.to_thread(_provision, self.ec2_endpoint, instance_profile=False)
        self.scheduler = await Scheduler(
            host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0", validate=False
        )
        self._stack.push_async_callback(self.scheduler.close)
        self._install_retire_hook()
        low, high = self.options.docker_latency
        api = DockerApi(
            self.swarm,
            guard=self._guard_node,
            latency=lambda: self._rng.uniform(low, high),
            conflict_rate=self.options.conflict_rate,
            seed=self.options.seed,
            services=self.services.services if self.services is not None else None,
        )
        self.docker_url = await api.start()
        self._api = api
        self._stack.push_async_callback(api.close)
        self.client = await Client(self.scheduler.address, asynchronous=True, set_as_default=False)
        self._stack.push_async_callback(self.client.close)
        self.emulator = MachineEmulator(
            ec2_endpoint=self.ec2_endpoint,
            region=self.network.region,
            tag_filters=owner_tags(self.options.cluster_name),
            orchestrator=self.swarm,
            joiner=MemoryJoiner(self.swarm),
            scheduler_address=str(self.scheduler.address),
            catalogue=CATALOGUE,
            boot_delay=self.options.boot_delay,
            boot_jitter=self.options.boot_jitter,
            seed=self.options.seed,
        )
        self._stack.push_async_callback(self.emulator.close)
        self._machines = asyncio.create_task(self.emulator.run(self.options.emulator_interval))
        self._tasks.append(asyncio.create_task(self._watch_world()))
        self._tasks.append(asyncio.create_task(self._probe_lag()))
        if self.services is not None:
            self._tasks.append(asyncio.create_task(self.services.run()))

    async def _start_moto_process(self) -> None:
        """moto in its own process (`moto_proc`): its TerminateInstances guard calls back here, over
        loopback, and the world's EC2 faults are injected there."""
        guard = web.Application()
        guard.router.add_post("/guard/terminate", self._guard_terminate_route)
        runner = web.AppRunner(guard, access_log=None)
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        guard_url = f"http://127.0.0.1:{runner.addresses[0][1]}/guard/terminate"
        workdir = Path(tempfile.mkdtemp(prefix="chaos-moto-"))
        self._stack.callback(shutil.rmtree, workdir, True)
        ready = workdir / "moto.json"
        proc = await asyncio.to_thread(_spawn_moto, self.options, ready, guard_url)
        self._stack.callback(stop_process, proc)
        deadline = time.monotonic() + MOTO_READY_TIMEOUT_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the moto process did not come up (exit {proc.poll()})")
            await asyncio.sleep(0.1)
        info = json.loads(ready.read_text())
        self.ec2_endpoint, self._moto_control = info["endpoint"], info["control"]

    async def _guard_terminate_route(self, request: web.Request) -> web.Response:
        await self._guard_terminate(list((await request.json())["instance_ids"]))
        return web.json_response({})

    async def close(self) -> None:
        if self.emulator is not None:
            # The emulator finishes its step (a worker half started would escape emulator.close()).
            self.emulator.stopping = True
            if self._machines is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._machines, 30)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 30)
        self._tasks.clear()
        await self._stack.aclose()

    def daemon_env(self) -> dict[str, str]:
        """The AUTOSCALER_* settings that point a daemon at this world (timing left to the caller)."""
        types = {n: {"ami_id": self.network.ami_id, **dict(s)} for n, s in self.options.allowed_types.items()}
        return {
            "AUTOSCALER_CLUSTER_NAME": self.options.cluster_name,
            "AUTOSCALER_EC2_ENDPOINT": self.ec2_endpoint,
            "AUTOSCALER_EC2_REGION": self.network.region,
            "AUTOSCALER_EC2_ACCESS_KEY_ID": LOCAL_ACCESS_KEY,
            "AUTOSCALER_EC2_SECRET_ACCESS_KEY": LOCAL_SECRET_KEY,
            "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types),
            "AUTOSCALER_EC2_MIN_INSTANCES": str(self.options.min_instances),
            "AUTOSCALER_EC2_MAX_INSTANCES": str(self.options.max_instances),
            "AUTOSCALER_EC2_SUBNET_IDS": ",".join(self.network.subnet_ids),
            "AUTOSCALER_EC2_SECURITY_GROUP_IDS": self.network.security_group_id,
            "AUTOSCALER_EC2_KEY_NAME": self.network.key_name,
            "AUTOSCALER_DASK_SCHEDULER_URL": str(self.scheduler.address),
            "AUTOSCALER_DOCKER_URL": self.docker_url,
            "AUTOSCALER_MAX_START_TIME": f"{self.options.max_start_time:g}s",
        } | ({"AUTOSCALER_MODE": "dynamic"} if self.options.dynamic else {})

    # --- guards --------------------------------------------------------------------------------

    def worker_load(self, hostname: str) -> tuple[int, int] | None:
        """(tasks processing, results held by no other worker) of the worker on `hostname`, read from the
        scheduler now; None when no worker of that name is connected. Dynamic mode: the service tasks on
        its node instead (`cloudhost_services`)."""
        if self.services is not None:
            return self.services.load(hostname)
        for ws in self.scheduler.workers.values():
            if str(ws.name) == hostname:
                unique = sum(1 for ts in ws.has_what if len(ts.who_has or ()) <= 1)
                return len(ws.processing), unique
        return None

    def _check(self, kind: str, hostname: str, target: str) -> None:
        self.disruptions[kind] += 1
        if hostname in self.partitioned:
            self.partition_disruptions[kind] += 1
            logging.getLogger("chaos.guard").warning("PARTITIONED HOST DISRUPTED %s %s", kind, hostname)
        load = self.worker_load(hostname)
        if load is not None and (load[0] or load[1]):
            hit = GuardHit(kind, hostname, target, load[0], load[1], round(self._now(), 2))
            self.hits.append(hit)
            logging.getLogger("chaos.guard").warning("GUARD HIT %s", asdict(hit))

    async def _guard_node(self, kind: str, node: Node) -> None:
        self._check(kind, node.hostname, node.id)

    async def _guard_terminate(self, instance_ids: list[str]) -> None:
        assert self.emulator is not None
        for iid in instance_ids:
            machine = self.emulator.machines.get(iid)
            self._check("terminate", machine.hostname if machine else "", iid)

    def _on_ec2_call(self, action: str, params: dict[str, str]) -> None:
        """In a moto request thread: slow some reads; check every termination on the loop, at once."""
        if action == "DescribeInstances":
            with self._thread_lock:
                delay = self._thread_rng.uniform(0, self.options.slow_ec2_max)
                slow = self._thread_rng.random() < self.options.slow_ec2_rate
            if slow:
                self.faults["slow_ec2"] += 1
                time.sleep(delay)
        elif action == "TerminateInstances":
            ids = [v for k, v in sorted(params.items()) if k.startswith("InstanceId.")]
            future = asyncio.run_coroutine_threadsafe(self._guard_terminate(ids), self._loop)
            future.result(timeout=GUARD_TIMEOUT_S)

    # --- a scheduler that keeps some workers ----------------------------------------------------

    def _install_retire_hook(self) -> None:
        original = self.scheduler.handlers["retire_workers"]

        async def retire_workers(workers: list[str] | None = None, **kwargs: Any) -> Any:
            if not workers:
                return await original(workers=workers, **kwargs)
            kept = await self._keep_some(sorted(workers))
            rest = [w for w in workers if w not in kept]
            return await original(workers=rest, **kwargs) if rest else {}

        self.scheduler.handlers["retire_workers"] = retire_workers

    async def _keep_some(self, workers: list[str]) -> set[str]:
        """Each of `workers`, with probability `keep_rate`, gets a late result only it holds, and is kept."""
        chosen = [a for a in workers if self._rng.random() < self.options.keep_rate]
        placed = await asyncio.gather(*(self._late_result(a) for a in chosen), return_exceptions=True)
        kept = {a for a, ok in zip(chosen, placed, strict=True) if ok is True}
        self.faults["retire_kept"] += len(kept)
        return kept

    async def _late_result(self, address: str) -> bool:
        """Put a result on the worker at `address` that only it holds and the user wants, as a finished
        task would leave it. The client's scatter only reaches running workers, and idle workers are often
        cordoned here, so this does what the scheduler's scatter does, for that worker alone."""
        key = f"late-result-{self._rng.getrandbits(64):016x}"
        _, who_has, nbytes = await scatter_to_workers(
            [address], {key: os.urandom(64)}, rpc=self.scheduler.rpc
        )
        self.scheduler.update_data(who_has=who_has, nbytes=nbytes, client=self.client.id)
        self._held.append((self._now() + self.options.hold_s, key))
        return True

    async def _watch_world(self) -> None:
        """Release the kept results once held long enough; note every machine that joined late."""
        assert self.emulator is not None
        while True:
            await asyncio.sleep(0.5)
            now = self._now()
            due = [key for until, key in self._held if until <= now]
            self._held = [(until, key) for until, key in self._held if until > now]
            if due:
                self.scheduler.client_releases_keys(keys=due, client=self.client.id)
            for m in list(self.emulator.machines.values()):
                if m.joined_at is not None and m.joined_at - m.seen_at > self.options.max_start_time:
                    self._late.add(m.instance_id)

    async def _probe_lag(self) -> None:
        """The world's event-loop lag: how late a 0.1 s sleep wakes up. A loaded world answers the
        daemon's calls late, which the daemon sees as a slow API; the report says how loaded it was."""
        while True:
            asked = time.monotonic()
            await asyncio.sleep(LAG_PROBE_S)
            woke = time.monotonic()
            self.loop_lags.append((woke - self.started, max(0.0, woke - asked - LAG_PROBE_S)))

    def lag_summary(self) -> dict[str, float]:
        """Median, p95 and max of the world's loop lag (seconds) since it started."""
        lags = sorted(lag for _, lag in self.loop_lags) or [0.0]
        return {
            "median": round(lags[len(lags) // 2], 3),
            "p95": round(lags[min(len(lags) - 1, int(0.95 * len(lags)))], 3),
            "max": round(lags[-1], 3),
        }

    # --- the user --------------------------------------------------------------------------------

    async def submit_backlog(self, n: int, low: float, high: float) -> int:
        if self.services is not None:
            return self.services.submit(n)
        seconds = [round(self._rng.uniform(low, high), 3) for _ in range(n)]
        futures = self.client.map(_work, seconds, pure=False)
        self._backlog.extend(futures)
        self._tasks.append(asyncio.create_task(self._collect(futures)))
        return len(futures)

    async def _collect(self, futures: list[Any]) -> None:
        """Drop each result once it is done, as a user gathering results would."""
        pending = set(futures)
        while pending:
            done = {f for f in pending if f.done()}
            self.done += sum(1 for f in done if f.status == "finished")
            pending -= done
            self._backlog = [f for f in self._backlog if f not in done]
            await asyncio.sleep(0.2)

    def partition(self, share: float, on: bool) -> int:
        """A network partition between the swarm's managers and its workers: `on`, the nodes of `share`
        of the ready nodes of live machines (drawn by the seed) look down; their machines and dask workers
        run on. A ready node whose machine is already gone from EC2's listing is not drawn: a boot under
        way when the daemon ended its machine still joins and leaves moments later, and removing that
        node is no disruption of a partitioned machine (seed 877425 drew one, and the guard counted its
        removal). Off, they are ready again. Returns how many nodes it took down (0 when lifted)."""
        if not on:
            for host in self.partitioned:
                if self.swarm.by_hostname(host) is not None:
                    self.swarm.set_status(host, NodeStatus.READY)
            self.partitioned = set()
            return 0
        assert self.emulator is not None
        live = {machine.hostname for machine in self.emulator.machines.values()}
        ready = sorted(
            n.hostname
            for n in self.swarm.nodes.values()
            if n.status == NodeStatus.READY and n.hostname in live
        )
        self._rng.shuffle(ready)
        taken = ready[: math.ceil(share * len(ready))]
        for host in taken:
            self.swarm.set_status(host, NodeStatus.DOWN)
        self.partitioned = set(taken)
        self.faults["partition"] += 1
        return len(taken)

    async def cancel(self) -> int:
        """Cancel the whole backlog; returns how many workers were busy just before."""
        if self.services is not None:
            return self.services.cancel()
        busy = sum(1 for ws in self.scheduler.workers.values() if ws.processing)
        futures, self._backlog = self._backlog, []
        await self.client.cancel(futures)
        return busy

    # --- views ---------------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self.started

    async def state(self) -> dict[str, Any]:
        """The fleet as the world sees it, and the leak check's three findings."""
        assert self.emulator is not None
        live = await self._live()
        hosts = {self.emulator.machines[i].hostname for i in live if i in self.emulator.machines}
        nodes = list(self.swarm.nodes.values())
        workers = list(self.scheduler.workers.values())
        return {
            "live": len(live),
            "never_joined": sorted(i for i in live if not self._joined(i)),
            "nodes_without_instance": sorted(n.hostname for n in nodes if n.hostname not in hosts),
            "nodes": len(nodes),
            "nodes_down": sum(1 for n in nodes if n.status != NodeStatus.READY),
            "workers": len(workers),
            "busy_workers": self.services.busy_nodes()
            if self.services is not None
            else sum(1 for ws in workers if ws.processing),
            "backlog": self.services.backlog() if self.services is not None else len(self._backlog),
            "done": self.done,
            "min_plus_reserve": self.options.min_plus_reserve,
            "loop_lag_max_5s": round(
                max((lag for t, lag in self.loop_lags if t > self._now() - 5), default=0), 3
            ),
        }

    async def _live(self) -> list[str]:
        """The live instances, from the emulator's listing when it is at most `LISTING_MAX_AGE_S` old:
        each listing of a fleet of 100 costs moto (in this process) about a tenth of a second of the
        GIL, and the world is polled every second; reading it again each time overloaded the world."""
        assert self.emulator is not None
        at = self.emulator.listed_at
        if at is not None and self.emulator.clock() - at <= LISTING_MAX_AGE_S:
            return list(self.emulator.listing)
        return await asyncio.to_thread(self._live_instances)

    def _joined(self, instance_id: str) -> bool:
        assert self.emulator is not None
        machine = self.emulator.machines.get(instance_id)
        return machine is not None and machine.joined

    def _live_instances(self) -> list[str]:
        # One client for every read (a client costs more to build than the read; the world is polled).
        with self._thread_lock:
            if self._ec2 is None:
                self._ec2 = boto3.client(
                    "ec2",
                    endpoint_url=self.ec2_endpoint,
                    region_name=self.network.region,
                    aws_access_key_id=LOCAL_ACCESS_KEY,
                    aws_secret_access_key=LOCAL_SECRET_KEY,
                )
            ec2 = self._ec2
        filters = [
            {"Name": f"tag:{k}", "Values": [v]} for k, v in owner_tags(self.options.cluster_name).items()
        ]
        filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
        reply = ec2.describe_instances(Filters=filters)
        return [i["InstanceId"] for r in reply["Reservations"] for i in r["Instances"]]

    def report(self) -> dict[str, Any]:
        """Guard hits, disruptions seen, and how often each fault fired."""
        assert self.emulator is not None
        faults = {name: 0 for name in ("slow_ec2", "retire_kept")} | dict(self.faults)
        calls = self.moto.faults.calls()
        if self._moto_control:
            with urllib.request.urlopen(self._moto_control + "/calls", timeout=10) as reply:
                served = json.loads(reply.read())
            calls, faults["slow_ec2"] = served["calls"], int(served["slowed"])
            faults |= served.get("strict", {})
        else:
            faults |= fired(self.moto.faults.strict)
        faults["late_join"] = len(self._late)
        faults["update_out_of_sequence"] = self._api.conflicts
        return {
            "seed": self.options.seed,
            "hits": [asdict(h) for h in self.hits],
            "disruptions": dict(self.disruptions),
            "partition_disruptions": dict(self.partition_disruptions),
            "faults": faults,
            "joined_total": self.emulator.joined_total,
            "docker_requests": self._api.requests,
            "ec2_calls": calls,
            "loop_lag": self.lag_summary(),
        }
