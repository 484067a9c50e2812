"""The deployed stack end to end: the daemon as the service of docker/stack.yml (with stack.local.yml)
and the dask worker as the global service of docker/worker-stack.yml, both deployed with `docker stack
deploy` on the local swarm's manager. Queued pinned tasks make the daemon launch machines; each boots
from its user data on its own dockerd node (`localcloud.userdata`) and joins; swarm starts the worker
service's task there; the tasks run on those workers; the fleet drains and terminates back to its
minimum (zero). Each phase's duration is printed.

What stands in for AWS: as in `test_worker_service.py` (moto for EC2, a dockerd per machine, the image
loaded into each new node before its user data runs, the dask scheduler in the test's process).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path

import pytest
from distributed import Client
from tests.e2e.helpers import (
    WORKER_STACK,
    booting_from_user_data,
    hostname_of,
    owned_instances,
    phase,
    short_names,
    wait_for,
)

from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud
from swarm_autoscaler_lab.localcloud.dockerd import _cli_env, _docker_cli
from swarm_autoscaler_lab.localcloud.image import IMAGE, ROOT
from swarm_autoscaler_lab.localcloud.redis_server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.timeout(900)]

DAEMON, WORKERS = "autoscaler", WORKER_STACK


def _deploy(lc: LocalCloud, files: list[str], stack: str, extra: dict[str, str]) -> None:
    env = {**_cli_env(), "DOCKER_HOST": lc.local_swarm.manager_url, **extra}
    cmd = [_docker_cli(), "stack", "deploy", "--resolve-image", "never"]
    for name in files:
        cmd += ["-c", str(ROOT / "docker" / name)]
    done = subprocess.run([*cmd, stack], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


async def test_the_deployed_stack_scales_up_runs_on_swarm_started_workers_and_back_down(
    cloud: LocalCloud, tmp_path: Path
) -> None:
    lc = cloud
    assert lc.emulator is not None and lc.scheduler is not None
    manager = lc.local_swarm.manager
    phases: dict[str, float] = {}
    t = time.monotonic()
    emulator = lc.emulator
    scheduler = lc.scheduler
    before = set(owned_instances(lc, ("pending", "running", "shutting-down", "terminated")))
    try:
        async with booting_from_user_data(lc):  # the image loaded, the worker service deployed
            t = phase("image and worker service", t, phases)
            env = lc.env()  # with the real boot's 240 s to start
            env.pop("AUTOSCALER_HTTP_HOST")  # stack.local.yml gives each replica its own loopback address
            env.update(
                AUTOSCALER_DOCKER_URL="unix:///var/run/docker.sock",  # the manager's socket, mounted
                AUTOSCALER_HTTP_PORT=str(free_port()),
            )
            env_file = tmp_path / "autoscaler.env"
            env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))  # docker reads values verbatim
            _deploy(
                lc,
                ["stack.yml", "stack.local.yml"],
                DAEMON,
                {
                    "AUTOSCALER_IMAGE": IMAGE,
                    "AUTOSCALER_ENV_FILE": str(env_file),
                    "AUTOSCALER_REPLICAS": "1",
                    "DOCKER_SOCKET": str(manager.socket_path),
                },
            )
            t = phase("deploy the daemon", t, phases)
            async with Client(lc.scheduler_address, asynchronous=True) as client:
                futures = [  # time.sleep: the worker image can import it
                    client.submit(
                        time.sleep,
                        1.0,
                        key=f"stack-{i}",
                        pure=False,
                        resources={"CPU": 2, "RAM": GIB, "instance-type:m5.large": 1},
                    )
                    for i in range(2)
                ]
                await wait_for(lambda: bool(scheduler.workers), 300, "a swarm-started worker on a new node")
                t = phase("scale up (the deployed daemon launches, machines boot and join)", t, phases)
                await asyncio.wait_for(client.gather(futures), 300)
                ran_on = await client.who_has(futures)
                names = short_names(scheduler.workers[a].name for addrs in ran_on.values() for a in addrs)
                t = phase("tasks run", t, phases)
            launched = {
                iid: inst
                for iid, inst in owned_instances(
                    lc, ("pending", "running", "shutting-down", "terminated")
                ).items()
                if iid not in before
            }
            hostnames = {hostname_of(i) for i in launched.values()}
            assert names and names <= hostnames, (names, hostnames)
            assert all(
                m.worker is None for m in emulator.machines.values()
            )  # swarm's workers, not the emulator's
            ps = await manager.docker("service", "ps", f"{WORKERS}_worker", "--format", "{{.Node}}")
            assert names <= short_names(ps.split()), ps
            await wait_for(lambda: not owned_instances(lc), 240, "the fleet back at its minimum (0)")
            await wait_for(lambda: not scheduler.workers, 60, "every dask worker gone")
            phase("drain and terminate to the minimum", t, phases)
    finally:
        with contextlib.suppress(Exception):
            print(await manager.docker("service", "logs", "--tail", "30", f"{DAEMON}_autoscaler"), flush=True)
        with contextlib.suppress(Exception):  # (the worker stack went with the real boot)
            await manager.docker("stack", "rm", DAEMON)

        def containers_left() -> bool:
            label = "label=com.docker.stack.namespace"
            return not manager.docker_sync("ps", "-q", "--filter", f"{label}={DAEMON}").split()

        await wait_for(
            containers_left, 60, "the daemon stack's containers gone"
        )  # test_stack reuses its name
    print("phases:", {k: round(v, 1) for k, v in phases.items()}, flush=True)
