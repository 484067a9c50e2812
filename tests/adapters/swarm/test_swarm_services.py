"""`SwarmServicesWorkload` (dynamic mode) against a real local docker swarm (see conftest.py): services
created with the docker CLI (reservations, constraints, generic resources, a global one), read back
through aiodocker as the planner's workload; fences and retirements pause real nodes."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tarfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from tests.builders import CATALOGUE, make_policy
from tests.fakes import FakeCloud, SteppedClock

from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.adapters.swarm_services import OWN_SERVICE_LABEL, SwarmServicesWorkload
from swarm_autoscaler.core.actions import DrainNode, HostIdle, NodeOurs, Plan, Retired, RetireWorkers
from swarm_autoscaler.core.model import GIB, OWNERSHIP_LABEL, Availability, Resources, Snapshot, TypePolicy
from swarm_autoscaler.core.ports import WorkloadView
from swarm_autoscaler.core.services import ServiceTask
from swarm_autoscaler.daemon.act import ActConfig, Ports, act
from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm

pytestmark = pytest.mark.swarm

IMAGE = "busybox-static:local"
WORKERS = ("ip-10-0-0-2", "ip-10-0-0-3")


def busybox_tar(folder: Path) -> Path:
    """A root filesystem of Debian's busybox-static alone (no registry: `docker import`)."""
    busybox = shutil.which("busybox")
    assert busybox is not None, "busybox-static is missing: run `bash scripts/ensure-services.sh`"
    path = folder / "busybox.tar"
    with tarfile.open(path, "w") as tar:
        tar.add(busybox, arcname="bin/busybox")
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def services(
    local_swarm: LocalSwarm, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalSwarm]:
    tar = busybox_tar(tmp_path_factory.mktemp("image"))
    await asyncio.gather(*(node.docker("import", str(tar), IMAGE) for node in local_swarm.nodes.values()))
    created: list[str] = []

    async def create(name: str, *args: str) -> None:
        await local_swarm.manager.docker(
            "service", "create", "--detach", "--name", name, *args, IMAGE, "/bin/busybox", "sleep", "3600"
        )
        created.append(name)

    await create("big", "--reserve-cpu", "64", "--reserve-memory", "1g")
    await create("pinned", "--reserve-cpu", "0.5", "--constraint", "node.labels.instance-type==g4dn.xlarge")
    await create("gpu", "--generic-resource", "gpu=1")
    await create("zoned", "--constraint", "node.labels.zone==eu")
    await create(
        "small", "--reserve-cpu", "0.25", "--reserve-memory", "64m", "--constraint", "node.role==worker"
    )
    await create("agent", "--mode", "global")
    await create("daemon", "--label", f"{OWN_SERVICE_LABEL}=1", "--constraint", "node.role==worker")
    try:
        yield local_swarm
    finally:
        for name in created:
            await local_swarm.manager.docker("service", "rm", name)
        await _set_all_active(local_swarm)


async def _set_all_active(swarm: LocalSwarm) -> None:
    for hostname in WORKERS:
        await swarm.manager.docker("node", "update", "--availability", "active", hostname)


def workload(swarm: LocalSwarm) -> SwarmServicesWorkload:
    policy = make_policy(types=(TypePolicy("m5.large"), TypePolicy("g4dn.xlarge")))
    return SwarmServicesWorkload(swarm.manager_url, "c1", CATALOGUE, policy, poll=0.2)


async def until(read: Callable[[], object], check: Callable[[object], bool], timeout: float = 60.0) -> object:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await read()  # type: ignore[misc]
        if check(value) or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.5)


async def test_pending_tasks_are_read_with_reservations_and_constraints(services: LocalSwarm) -> None:
    async with workload(services) as w:

        async def tasks() -> dict[str, ServiceTask]:
            return {t.service: t for t in (await w.read())[1] if t.desired == "running"}

        def settled(value: object) -> bool:
            by = value  # type: ignore[assignment]
            return (
                isinstance(by, dict)
                and all(s in by for s in ("big", "pinned", "gpu", "zoned", "small", "daemon"))
                and by["small"].state == "running"
                and by["big"].state == "pending"
            )

        by = await until(tasks, settled)
        assert isinstance(by, dict)
        assert by["big"].needs == Resources.of(64, GIB)
        assert "insufficient resources" in by["big"].message
        assert by["pinned"].constraints == ("node.labels.instance-type==g4dn.xlarge",)
        assert by["gpu"].needs == Resources.of(gpus=1)
        assert by["agent"].global_service and by["daemon"].ours

        view = await w.observe()
        assert isinstance(view, WorkloadView)
        pending = {t.key: t for t in view.unrunnable}
        assert pending[by["big"].id].needs.cpus == 64
        assert pending[by["pinned"].id].pinned_type == "g4dn.xlarge"
        assert pending[by["zoned"].id].pinned_type == "node.labels.zone==eu"
        assert by["daemon"].id not in pending and by["agent"].id not in pending
        small = by["small"]
        busy = [w_ for w_ in view.workers if w_.processing]
        assert [t.key for w_ in busy for t in w_.processing] == [
            small.id
        ]  # the agent and daemon do not count
        assert busy[0].address == small.node_id
        assert busy[0].resources.cpus > 0  # an untyped node: what its engine reports


async def test_a_fence_refuses_a_busy_host_and_pauses_an_idle_one(services: LocalSwarm) -> None:
    async with workload(services) as w:
        view = await w.observe()
        busy = next(x for x in view.workers if x.processing)
        idle = next(x for x in view.workers if not x.processing)
        await services.manager.docker("node", "update", "--label-add", f"{OWNERSHIP_LABEL}=c1", idle.hostname)
        fence = await w.fence([busy.hostname, idle.hostname])
        assert fence.refused == (busy.hostname,)
        nodes = {n.node.hostname: n.node for n in (await w.read())[0]}
        assert nodes[idle.hostname].availability == Availability.PAUSE  # ours: paused
        assert nodes[busy.hostname].availability == Availability.ACTIVE  # not ours: never touched
        await w.unfence([busy.hostname, idle.hostname])
        nodes = {n.node.hostname: n.node for n in (await w.read())[0]}
        assert nodes[idle.hostname].availability == Availability.ACTIVE
        await services.manager.docker("node", "update", "--label-rm", OWNERSHIP_LABEL, idle.hostname)


async def test_retire_pauses_a_node_and_its_worker_then_reads_retiring(services: LocalSwarm) -> None:
    async with workload(services) as w:
        view = await w.observe()
        idle = next(x for x in view.workers if not x.processing)
        assert await w.retire([idle.address]) == (idle.address,)
        workers = {x.hostname: x for x in await w.list_workers()}
        assert workers[idle.hostname].retiring
        nodes = {n.node.hostname: n.node for n in (await w.read())[0]}
        assert nodes[idle.hostname].availability == Availability.PAUSE
        await _set_all_active(services)


async def test_wait_for_change_wakes_on_a_new_pending_task(services: LocalSwarm) -> None:
    async with workload(services) as w:
        await w.observe()
        await services.manager.docker("service", "scale", "--detach", "big=2")
        assert await w.wait_for_change(30.0)
        await services.manager.docker("service", "scale", "--detach", "big=1")


async def test_a_task_that_lands_after_the_plan_stops_the_retirement_and_the_drain(
    services: LocalSwarm,
) -> None:
    """The re-checks of `act` on fresh reads of the real swarm: planned while the node was empty, the
    retirement (a pause) and the drain are skipped once a task runs there; gone again, both are done."""
    orchestrator = SwarmOrchestrator(services.manager_url, cluster_name="c1")
    manager = services.manager
    host = ""
    try:
        async with workload(services) as w:
            idle = next(x for x in (await w.observe()).workers if not x.processing)
            host, node_id = idle.hostname, idle.address
            await manager.docker("node", "update", "--label-add", f"{OWNERSHIP_LABEL}=c1", host)
            view = await w.observe()
            snapshot = Snapshot(
                time.time(), CATALOGUE, (), await orchestrator.list_nodes(), view.workers, view.unrunnable
            )
            plan = Plan(
                actions=(
                    RetireWorkers((node_id,), "idle", (HostIdle(host),)),
                    DrainNode(
                        node_id, host, "empty", expect=(HostIdle(host), NodeOurs(node_id), Retired(host))
                    ),
                )
            )
            ports = Ports(FakeCloud(SteppedClock(), {}), orchestrator, w)

            await manager.docker(
                "service", "create", "--detach", "--name", "late", "--constraint", f"node.hostname=={host}",
                "--stop-grace-period", "1s", IMAGE, "/bin/busybox", "sleep", "3600",
            )  # fmt: skip

            async def on_host() -> list[str]:
                out = await manager.docker(
                    "node",
                    "ps",
                    host,
                    "--filter",
                    "desired-state=running",
                    "--format",
                    "{{.Name}} {{.CurrentState}}",
                )
                return [line for line in out.splitlines() if line.startswith("late.") and "Running" in line]

            assert await until(on_host, bool)
            first = await act(plan, snapshot, ports, config=ActConfig("c1"))
            assert [o.kind for o in first] == ["skipped", "skipped"], first
            assert "has work or unique results now" in first[1].detail
            nodes = {n.node.hostname: n.node for n in (await w.read())[0]}
            assert nodes[host].availability == Availability.ACTIVE  # neither paused nor drained

            await manager.docker("service", "rm", "late")

            async def gone() -> bool:
                return not any(x.processing for x in await w.list_workers() if x.hostname == host)

            assert await until(gone, bool)
            second = await act(plan, snapshot, ports, config=ActConfig("c1"))
            assert [(o.ok, o.detail) for o in second] == [(True, "retired 1"), (True, "drained")], second
            nodes = {n.node.hostname: n.node for n in (await w.read())[0]}
            assert nodes[host].availability == Availability.DRAIN
    finally:
        with contextlib.suppress(Exception):
            await manager.docker("service", "rm", "late")
        await _set_all_active(services)
        if host:
            with contextlib.suppress(Exception):
                await manager.docker("node", "update", "--label-rm", OWNERSHIP_LABEL, host)
        await orchestrator.close()
