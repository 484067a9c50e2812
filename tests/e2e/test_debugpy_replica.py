"""debugpy on a swarm replica in its own network namespace, reached with `docker exec` (docs/debugging.md).

The replica is the debug image (`make image DEBUG=1`) as a swarm service on the local cloud's manager, with
no network attached and no host-network override (dockerd runs with `--bridge=none`: its own loopback only): debugpy listens
on the replica's loopback only, and the Debug Adapter Protocol client talks to it through
`docker exec -i <container> python3 -m swarm_autoscaler.runtime.relay 5678`, the pipe the recipe puts
behind `socat` on the manager. Nothing is published.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from typing import Any

import pytest
from tests.daemon.test_debugpy import Dap

from swarm_autoscaler_lab.localcloud.cloud import LocalCloud
from swarm_autoscaler_lab.localcloud.dockerd import _cli_env, _docker_cli
from swarm_autoscaler_lab.localcloud.image import ensure_image

pytestmark = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.timeout(900)]

DEBUG_IMAGE = "swarm-autoscaler:debug"
SERVICE = "autoscaler-debug"


async def test_a_dap_client_attaches_to_a_replica_through_docker_exec(cloud: LocalCloud) -> None:
    manager = cloud.local_swarm.manager
    await asyncio.to_thread(ensure_image, manager, DEBUG_IMAGE, True)
    settings = [
        "AUTOSCALER_CLUSTER_NAME=debug",
        'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {"ami_id": "ami-12345678"}}',
        "AUTOSCALER_EC2_ENDPOINT=http://127.0.0.1:9",
        "AUTOSCALER_EC2_REGION=us-east-1",
        "AUTOSCALER_DASK_SCHEDULER_URL=tcp://127.0.0.1:9",
        "AUTOSCALER_DEBUGPY_PORT=5678",
        "AUTOSCALER_DEBUGPY_WAIT=true",
    ]
    envs = [arg for line in settings for arg in ("--env", line)]
    await manager.docker(
        "service", "create", "--detach", "--name", SERVICE,
        "--restart-condition", "none", "--constraint", "node.role == manager", *envs, DEBUG_IMAGE, "run",
    )  # fmt: skip
    try:
        container = ""
        deadline = time.monotonic() + 60
        while not container and time.monotonic() < deadline:
            container = (await manager.docker("ps", "-q", "-f", f"name={SERVICE}")).strip()
            await asyncio.sleep(0.5)
        assert container, "the replica never started"
        await asyncio.sleep(3)  # debugpy starts listening right after the image's python starts
        seen = await asyncio.to_thread(_attach_and_detach, manager.docker_url, container)
        assert any(m.get("command") == "attach" and m["success"] for m in seen), seen
        # the replica's network namespace is not the manager's: its debugpy port is not on the manager's loopback
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", 5678)) != 0
    finally:
        await manager.docker("service", "rm", SERVICE)


def _attach_and_detach(docker_url: str, container: str) -> list[dict[str, Any]]:
    """initialize, attach, configurationDone, disconnect over `docker exec -i ... relay` (a socket pair)."""
    ours, theirs = socket.socketpair()
    relay = subprocess.Popen(
        [_docker_cli(), "-H", docker_url, "exec", "-i", container,
         "python3", "-m", "swarm_autoscaler.runtime.relay", "5678"],
        stdin=theirs, stdout=theirs, env=_cli_env(),
    )  # fmt: skip
    theirs.close()
    seen: list[dict[str, Any]] = []
    try:
        with ours:
            ours.settimeout(30)
            dap = Dap(ours)
            dap.send("initialize", {"clientID": "pytest", "adapterID": "debugpy", "pathFormat": "path",
                                    "linesStartAt1": True, "columnsStartAt1": True})  # fmt: skip
            assert dap.until("response", "initialize", seen)["success"]
            dap.send("attach", {"justMyCode": True})
            dap.until("event", "initialized", seen)
            dap.send("configurationDone")
            assert dap.until("response", "attach", seen)["success"]
            dap.send("disconnect", {"terminateDebuggee": False})
            assert dap.until("response", "disconnect", seen)["success"]
    finally:
        relay.terminate()
        relay.wait(10)
    return seen
