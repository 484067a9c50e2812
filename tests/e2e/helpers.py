"""Helpers for the e2e tests: direct looks at moto (never through the daemon), polling, a recorder
of what a daemon did, and the demo run as a real subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.actions import Action
from swarm_autoscaler.daemon.loop import Daemon
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.localcloud import userdata
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud

# A client on this host talking to workers started from the worker image: the image's python is Debian's
# 3.11.2, the host's may be another 3.11 (3.11.7 here), and the image has no numpy. dask warns of the
# mismatch (an error under this suite's filter); the work runs. Marks a test module that opens such a client.
IMAGE_WORKERS_DIFFER = pytest.mark.filterwarnings("ignore::distributed.versions.VersionMismatchWarning")

# A test module on the real swarm whose machines boot from their own user data (the `real_boot` fixture of
# conftest.py) and whose client talks to the worker service's workers: `pytestmark = [*REAL_BOOT, timeout]`.
REAL_BOOT = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.usefixtures("real_boot"), IMAGE_WORKERS_DIFFER]


def ec2_client(lc: LocalCloud) -> Any:
    assert lc.network is not None
    return boto3.client(
        "ec2",
        endpoint_url=lc.moto.endpoint,
        region_name=lc.network.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def owned_instances(
    lc: LocalCloud, states: tuple[str, ...] = ("pending", "running")
) -> dict[str, dict[str, Any]]:
    """Our cluster's instances in these states, by id, straight from moto (not through the daemon)."""
    filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in lc.owner_tags().items()]
    filters.append({"Name": "instance-state-name", "Values": list(states)})
    out: dict[str, dict[str, Any]] = {}
    for reservation in ec2_client(lc).describe_instances(Filters=filters)["Reservations"]:
        for inst in reservation["Instances"]:
            out[inst["InstanceId"]] = inst
    return out


ALL_STATES = ("pending", "running", "shutting-down", "terminated", "stopping", "stopped")


def instance_state(lc: LocalCloud, instance_id: str) -> str:
    reply = ec2_client(lc).describe_instances(InstanceIds=[instance_id])
    return str(reply["Reservations"][0]["Instances"][0]["State"]["Name"])


def hostname_of(inst: dict[str, Any]) -> str:
    """The machine's short hostname (the daemon's key for it)."""
    return machine_hostname(str(inst.get("PrivateDnsName") or inst["InstanceId"]))


def short_names(names: Iterable[str]) -> set[str]:
    """Node or worker names as the daemon keys them: half the local cloud's machines report EC2's full
    private DNS name, as Amazon Linux does (`MachineEmulator.full_hostname_share`)."""
    return {machine_hostname(str(n)) for n in names}


async def wait_for(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float,
    what: str,
    step: float = 0.25,
) -> float:
    """Poll `condition` until true; return the seconds it took; fail with `what` after `timeout`."""
    started = time.monotonic()
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for: {what}")
        await asyncio.sleep(step)


@dataclass
class Record:
    """What a daemon did, tick by tick: successful actions with the wall time they happened."""

    actions: list[tuple[float, Action]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    results: list[TickResult] = field(default_factory=list)

    def of(self, kind: type[Any]) -> list[Any]:
        return [a for _, a in self.actions if isinstance(a, kind)]


def record(daemon: Daemon) -> Record:
    rec = Record()
    previous = daemon.on_tick

    def hook(result: TickResult | None, seconds: float, error: BaseException | None) -> None:
        if previous is not None:
            previous(result, seconds, error)
        if result is None:
            return
        rec.results.append(result)
        now = time.monotonic()
        for outcome in result.outcomes:
            if outcome.ok:
                rec.actions.append((now, outcome.action))
            else:
                rec.failed.append((outcome.kind, outcome.detail))

    daemon.on_tick = hook
    return rec


@dataclass
class Running:
    daemon: Daemon
    record: Record
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 60)


async def start(daemon: Daemon) -> Running:
    rec = record(daemon)
    stop = asyncio.Event()
    return Running(daemon, rec, stop, asyncio.create_task(daemon.run(stop)))


CLI = Path(sys.executable).with_name("swarm-autoscaler")


def run_demo(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], str]:
    """`swarm-autoscaler demo ARGS --json` as a real subprocess in `cwd`, without the caller's
    `AUTOSCALER_*` variables: what it printed, its closing JSON line, and a context for assertions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    done = subprocess.run(
        [str(CLI), "demo", *args, "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=cwd,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1])
    context = f"{result}\nstdout:\n{done.stdout[-3000:]}\nstderr tail:\n{done.stderr[-2000:]}"
    return done, result, context


def phase(name: str, started: float, phases: dict[str, float]) -> float:
    """Record and print how long the phase `name` took since `started`; return the time now."""
    now = time.monotonic()
    phases[name] = now - started
    print(f"phase {name}: {phases[name]:.1f}s", flush=True)
    return now


WORKER_STACK = userdata.WORKER_STACK
WORKER_SERVICE = f"{WORKER_STACK}_worker"


def deploy_worker_service(lc: LocalCloud) -> None:
    """docker/worker-stack.yml deployed on the local swarm's manager (`userdata.deploy_worker_stack`)."""
    userdata.deploy_worker_stack(
        lc.local_swarm, cluster_name=lc.options.cluster_name, scheduler_address=lc.scheduler_address
    )


@contextlib.asynccontextmanager
async def booting_from_user_data(lc: LocalCloud) -> AsyncIterator[None]:
    """While open, the local cloud's machines boot as EC2 boots them (`LocalCloud.real_boot_on`): each new
    machine runs its own user data on its own dockerd node, and its dask worker is the worker service's
    task. The worker service's last log lines are printed on the way out, for a failure's report."""
    async with lc.real_boot_on():
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                logs = await lc.local_swarm.manager.docker("service", "logs", "--tail", "40", WORKER_SERVICE)
                print(logs, flush=True)
