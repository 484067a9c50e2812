"""Dynamic mode end to end on real dockerd nodes: the daemon (`AUTOSCALER_MODE=dynamic`, built from
settings by `open_daemon`) reads the swarm's service tasks, not dask.

A service whose replicas reserve more CPU than the fleet has (none: the fleet starts empty) stays
pending in swarm; the daemon launches machines for it (moto over HTTP), each boots from its own user data
(the daemon's rendered boot script, run by bash on a dockerd node of its own with the service's image
loaded: its `docker swarm join --availability pause` is the join), the daemon labels the node with its type, and swarm
starts the replicas there (they are pinned to `node.labels.instance-type==m5.large`). Scaled to 0, the
service's tasks stop and the daemon pauses, drains and terminates the machines. While the replicas run
(longer than the drain and termination delays) no node is paused, drained or terminated. After every tick a
fresh read of the real swarm (raw engine JSON through aiodocker, not the adapter under test) checks that
no drained node holds a task of a non-global service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiodocker
import pytest
import pytest_asyncio
from tests.e2e.helpers import hostname_of, instance_state, owned_instances, short_names, start, wait_for

from swarm_autoscaler.core.actions import DrainNode, Launch, RetireWorkers, Terminate
from swarm_autoscaler.core.services import ON_NODE_STATES
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud
from swarm_autoscaler_lab.localcloud.userdata import UserDataBoot

pytestmark = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.timeout(300)]

IMAGE = "busybox-static:dynamic"
SERVICE = "dyn-web"
REPLICAS = 2
CPUS_EACH = 2  # an m5.large's 2 CPUs: one replica per machine in the planner's view
HOLD_S = 8.0  # more than the drain delay plus the termination delay (3 s each on the fast local cloud)
DYNAMIC = {"AUTOSCALER_MODE": "dynamic", "AUTOSCALER_MAX_START_TIME": "120s"}


@pytest_asyncio.fixture(loop_scope="session")
async def image(cloud: LocalCloud, tmp_path: Path) -> AsyncIterator[Path]:
    """A busybox-only image (Debian's busybox-static, `docker import`ed: no registry) in the manager,
    saved as a tarball loaded into every new node before its user data runs; machines boot from their
    user data while the fixture lasts."""
    busybox = shutil.which("busybox")
    assert busybox is not None, "busybox-static is missing: run `bash scripts/ensure-services.sh`"
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        tar.add(busybox, arcname="bin/busybox")
    manager = cloud.local_swarm.manager
    await manager.docker("import", str(rootfs), IMAGE)
    saved = tmp_path / "image.tar"
    await manager.docker("save", "-o", str(saved), IMAGE)
    assert cloud.emulator is not None
    emulator = cloud.emulator
    # the real boot: each machine runs the user data the daemon rendered (the dynamic mode's boot script,
    # whose `docker swarm join --availability pause` makes the node), with the image loaded first
    emulator.user_data_boot = UserDataBoot(cloud.local_swarm, preload=[saved])
    try:
        yield saved
    finally:
        emulator.user_data_boot = None


class DrainWatch:
    """After each tick, a fresh read of the swarm: every drained node and the tasks still on it."""

    def __init__(self, docker_url: str) -> None:
        self.docker = aiodocker.Docker(url=docker_url)
        self.ticks: asyncio.Queue[TickResult] = asyncio.Queue()
        self.checked = 0
        self.drained_seen: set[str] = set()
        self.violations: list[str] = []

    def on_tick(self, result: TickResult | None, seconds: float, error: BaseException | None) -> None:
        if result is not None:
            self.ticks.put_nowait(result)

    async def check(self) -> None:
        nodes, services, tasks = await asyncio.gather(
            self.docker.nodes.list(), self.docker.services.list(), self.docker.tasks.list()
        )
        global_ids = {s["ID"] for s in services if "Global" in (s["Spec"].get("Mode") or {})}
        drained = {
            n["ID"]: n["Description"]["Hostname"] for n in nodes if n["Spec"]["Availability"] == "drain"
        }
        self.drained_seen |= short_names(drained.values())
        for task in tasks:
            node_id = task.get("NodeID") or ""
            state = task["Status"]["State"]
            if node_id in drained and state in ON_NODE_STATES and task["ServiceID"] not in global_ids:
                self.violations.append(f"{drained[node_id]} drained with task {task['ID']} {state}")

    async def run(self, stop: asyncio.Event) -> None:
        """Check after every tick; ticks that queued while a check ran are covered by the next one."""
        while not (stop.is_set() and self.ticks.empty()):
            try:
                await asyncio.wait_for(self.ticks.get(), 0.5)
            except TimeoutError:
                continue
            covered = 1
            while not self.ticks.empty():
                self.ticks.get_nowait()
                covered += 1
            await self.check()
            self.checked += covered

    async def close(self) -> None:
        await self.docker.close()


async def _replicas(lc: LocalCloud) -> list[tuple[str, str]]:
    """(node hostname, state) of the service's tasks that swarm wants running."""
    out = await lc.local_swarm.manager.docker(
        "service",
        "ps",
        SERVICE,
        "--filter",
        "desired-state=running",
        "--format",
        "{{.Node}} {{.CurrentState}}",
    )
    return [(line.split()[0], line.split()[1].lower()) for line in out.splitlines() if line.split()]


def _all_ever(lc: LocalCloud) -> dict[str, dict[str, Any]]:
    return owned_instances(lc, ("pending", "running", "shutting-down", "terminated"))


async def test_service_replicas_launch_machines_run_there_and_scale_back_to_zero(
    cloud: LocalCloud, image: Path, foreign_instance: str
) -> None:
    lc = cloud
    assert (os.cpu_count() or 1) >= CPUS_EACH, "each replica reserves 2 CPUs of this host's dockerd nodes"
    manager = lc.local_swarm.manager
    assert not owned_instances(lc), "the e2e fleet starts at its minimum (0)"
    before = set(_all_ever(lc))
    watch = DrainWatch(lc.local_swarm.manager_url)
    stop_watch = asyncio.Event()
    await manager.docker(
        "service", "create", "--detach", "--name", SERVICE, "--replicas", str(REPLICAS),
        "--reserve-cpu", str(CPUS_EACH), "--reserve-memory", "64m",
        "--constraint", "node.role==worker", "--constraint", "node.labels.instance-type==m5.large",
        "--stop-grace-period", "3s", IMAGE, "/bin/busybox", "sleep", "3600",
    )  # fmt: skip
    try:
        async with lc.daemon(DYNAMIC) as daemon:
            running = await start(daemon)
            chained = daemon.on_tick

            def both(result: TickResult | None, seconds: float, error: BaseException | None) -> None:
                if chained is not None:
                    chained(result, seconds, error)
                watch.on_tick(result, seconds, error)

            daemon.on_tick = both
            watcher = asyncio.create_task(watch.run(stop_watch))
            try:

                async def all_running() -> bool:
                    got = await _replicas(lc)
                    return len(got) == REPLICAS and all(state == "running" for _, state in got)

                await wait_for(all_running, 180, f"{REPLICAS} replicas running on new nodes", step=1.0)
                placed = short_names(host for host, _ in await _replicas(lc))
                launched = {iid: i for iid, i in _all_ever(lc).items() if iid not in before}
                assert launched, "nothing was launched for the pending replicas"
                assert placed <= {hostname_of(i) for i in launched.values()}, (placed, launched)
                assert {i["InstanceType"] for i in launched.values()} == {"m5.large"}  # the constraint's type
                assert len(launched) <= REPLICAS

                # The replicas keep running well past the drain delay (3 s): their nodes are busy, so
                # none is paused, drained or terminated meanwhile (the watch checks every tick too).
                ticks = len(running.record.results)
                await asyncio.sleep(HOLD_S)
                assert len(running.record.results) >= ticks + 3, "too few ticks while the replicas ran"
                assert short_names(host for host, _ in await _replicas(lc)) == placed
                assert await all_running()
                assert not running.record.of(DrainNode) and not running.record.of(RetireWorkers)

                await manager.docker("service", "scale", "--detach", f"{SERVICE}=0")
                await wait_for(lambda: not owned_instances(lc), 150, "the fleet back at its minimum (0)")
                results = running.record.results
                seen = len(results)
                await wait_for(
                    lambda: len(results) > seen and not results[-1].plan.actions,
                    30,
                    "a tick with nothing to do",
                )
            finally:
                await running.halt()
                stop_watch.set()
                await asyncio.wait_for(watcher, 30)
    finally:
        await watch.close()
        with contextlib.suppress(Exception):
            await manager.docker("service", "rm", SERVICE)

    rec = running.record
    assert not watch.violations, watch.violations
    assert watch.checked >= len(rec.results) > 0, (watch.checked, len(rec.results))
    assert sum(a.count for a in rec.of(Launch)) == len(launched)
    terminated = {iid for a in rec.of(Terminate) for iid in a.instance_ids}
    assert terminated == set(launched)
    assert all(instance_state(lc, iid) in ("terminated", "shutting-down") for iid in launched)
    drained = {a.node_id for a in rec.of(DrainNode)}
    assert drained and all(set(a.node_ids) <= drained for a in rec.of(Terminate)), "terminated undrained"
    assert {hostname_of(i) for i in launched.values()} <= watch.drained_seen | {
        a.hostname for a in rec.of(DrainNode)
    }
    assert instance_state(lc, foreign_instance) == "running"


GPU_SERVICE = "dyn-gpu"


async def test_gpu_service_lands_on_the_gpu_machine_bought_for_it(cloud: LocalCloud, image: Path) -> None:
    """A service reserving one GPU (`--generic-resource NVIDIA-GPU=1`, as on a real GPU swarm) is pending:
    the daemon buys a g4dn.xlarge for it (an m5.large has none), whose user data (the daemon's, run on a
    dockerd node of its own) writes the GPU into dockerd's daemon.json and restarts dockerd; swarm then
    places the task there and hands it the GPU's uuid. Stands in for a GPU AMI: a fake `nvidia-smi` lists
    fake uuids and a fake `nvidia-container-runtime` runs runc (`UserDataBoot.fake_gpus`); no GPU is behind
    them, but the generic resource, the default runtime and swarm's placement are dockerd's own."""
    lc = cloud
    manager = lc.local_swarm.manager
    assert lc.network is not None and lc.emulator is not None and lc.emulator.user_data_boot is not None
    lc.emulator.user_data_boot.fake_gpus = 4  # the type publishes 1: the boot script gives swarm the first
    types = {n: {"ami_id": lc.network.ami_id} for n in ("m5.large", "g4dn.xlarge")}
    env = {**DYNAMIC, "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types)}
    before = set(_all_ever(lc))
    await manager.docker(
        "service", "create", "--detach", "--name", GPU_SERVICE, "--generic-resource", "NVIDIA-GPU=1",
        "--constraint", "node.role==worker", "--stop-grace-period", "1s", IMAGE, "/bin/busybox", "sleep", "3600",
    )  # fmt: skip
    try:
        async with lc.daemon(env) as daemon:
            running = await start(daemon)
            try:
                seen: list[str] = []

                async def placed() -> bool:
                    out = await manager.docker(
                        "service", "ps", GPU_SERVICE, "--filter", "desired-state=running",
                        "--format", "{{.Node}} {{.CurrentState}}",
                    )  # fmt: skip
                    seen[:] = [ln.split()[0] for ln in out.splitlines() if "Running" in ln]
                    return bool(seen)

                await wait_for(placed, 180, "the GPU task running on a new node", step=1.0)
                # The node the wait saw: listing again raced the task's state once (Running, then not yet
                # listed so under load), and an IndexError left the GPU machine for the next test.
                host = seen[0]
                launched = [i for iid, i in _all_ever(lc).items() if iid not in before]
                assert [i["InstanceType"] for i in launched] == ["g4dn.xlarge"]
                assert short_names([host]) == {hostname_of(launched[0])}
                node = lc.local_swarm.nodes[host]
                # the node advertises the GPU its boot script found, and runs containers with nvidia
                resources = json.loads(
                    await manager.docker(
                        "node", "inspect", host, "--format", "{{json .Description.Resources}}"
                    )
                )
                named = [g["NamedResourceSpec"] for g in resources.get("GenericResources") or ()]
                short = host.split(".", 1)[0]
                assert named == [{"Kind": "NVIDIA-GPU", "Value": f"GPU-{short}-0"}], resources
                assert await node.docker("info", "--format", "{{.DefaultRuntime}}") == "nvidia"
                cid = await node.docker(
                    "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={GPU_SERVICE}"
                )
                task_env = json.loads(await node.docker("inspect", cid, "--format", "{{json .Config.Env}}"))
                assert f"DOCKER_RESOURCE_NVIDIA-GPU=GPU-{short}-0" in task_env, task_env
                await manager.docker("service", "rm", GPU_SERVICE)
                await wait_for(lambda: not owned_instances(lc), 150, "the GPU machine terminated once idle")
            finally:
                await running.halt()
    finally:
        lc.emulator.user_data_boot.fake_gpus = 0
        with contextlib.suppress(Exception):
            await manager.docker("service", "rm", GPU_SERVICE)


async def test_a_failing_boot_is_replaced_at_once_by_another_type(cloud: LocalCloud, image: Path) -> None:
    """An m5.large whose boot script fails (a broken AMI, say) runs the daemon's user data on its dockerd
    node: the failure line, then `shutdown`, so EC2 stops it (the emulator's stand-in for
    InstanceInitiatedShutdownBehavior=stop). The daemon terminates each such machine within seconds, not
    after AUTOSCALER_MAX_START_TIME (120 s here), backs that (type, subnet) off, and the pending task ends up
    on an m5.xlarge."""
    lc = cloud
    manager = lc.local_swarm.manager
    assert lc.network is not None
    ami = lc.network.ami_id
    types = {
        "m5.large": {"ami_id": ami, "boot_script": "echo no docker on this AMI >&2; exit 3"},
        "m5.xlarge": {"ami_id": ami},
    }
    env = {**DYNAMIC, "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types)}
    before = set(_all_ever(lc))
    await manager.docker(
        "service", "create", "--detach", "--name", SERVICE, "--reserve-cpu", str(CPUS_EACH), "--reserve-memory", "64m",
        "--constraint", "node.role==worker", "--stop-grace-period", "1s", IMAGE, "/bin/busybox", "sleep", "3600",
    )  # fmt: skip
    try:
        async with lc.daemon(env) as daemon:
            running = await start(daemon)
            try:

                async def placed() -> list[str]:
                    return [host for host, state in await _replicas(lc) if state == "running"]

                await wait_for(placed, 180, "the task running after the failed boots", step=1.0)
                launched = {iid: i for iid, i in _all_ever(lc).items() if iid not in before}
                by_host = {hostname_of(i): i["InstanceType"] for i in launched.values()}
                assert [by_host[h] for h in short_names(await placed())] == ["m5.xlarge"]
                failed = {iid for iid, i in launched.items() if i["InstanceType"] == "m5.large"}
                assert failed, "the cheaper m5.large was never tried"
                ended = {
                    iid: t
                    for t, a in running.record.actions
                    if isinstance(a, Terminate)
                    for iid in a.instance_ids
                }
                launches = [t for t, a in running.record.actions if isinstance(a, Launch)]
                assert failed <= set(ended), (failed, ended)
                # each failed machine ends well inside the start timeout (120 s)
                assert max(ended[iid] for iid in failed) - launches[0] < 60, (ended, launches)
                await manager.docker("service", "rm", SERVICE)
                await wait_for(lambda: not owned_instances(lc), 150, "the fleet back at zero")
            finally:
                await running.halt()
    finally:
        with contextlib.suppress(Exception):
            await manager.docker("service", "rm", SERVICE)
