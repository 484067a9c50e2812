"""The daemon's image as a real docker swarm service: `docker stack deploy -c docker/stack.yml` on the local
dockerd swarm, against the local cloud (moto, the dask scheduler and redis on loopback).

The steps are those of docs/deployment.md, "Deploy the stack", in the same order: the image (built here without a
registry and cached under build/image), an env file, the stack deployed with two replicas sharing a redis
leader lock, healthy through the image's HEALTHCHECK, a burst scaled up, a rolling `docker service update`
in the middle of it without a double launch, the fleet back down, and `docker service logs` checked for
JSON lines and for secrets.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from distributed import Client, Event
from structlog.testing import capture_logs
from tests.e2e.helpers import REAL_BOOT, owned_instances, wait_for

from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud
from swarm_autoscaler_lab.localcloud.dockerd import LocalNode
from swarm_autoscaler_lab.localcloud.image import IMAGE, ROOT, ensure_image
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

# The first run builds the image (a few minutes: a Debian base, wheels, docker build); later runs load
# the cached tarball from build/image in seconds.
# The machines the stack launches boot as EC2 boots them (the `real_boot` fixture): their own user data on
# their own dockerd node, their dask workers the worker service's tasks.
pytestmark = [*REAL_BOOT, pytest.mark.timeout(900)]

STACK = "autoscaler"
SERVICE = f"{STACK}_autoscaler"
TASKS = 2  # pinned tasks, one m5.large each: the burst needs exactly this many machines
# The burst's tasks wait on a dask Event the test sets once the rolling update is done (and checked to be
# still under way then), so they span it however long it takes, and not a second more.
TASK_TIMEOUT_S = 300.0
# The node the operator adds for the scheduler (docker/scheduler-stack.yml): not one of the daemon's machines
SCHEDULER_NODE = "dask-scheduler-host"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def manager(cloud: LocalCloud) -> LocalNode:
    return cloud.local_swarm.manager


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def image(manager: LocalNode) -> int:
    """Step 1: the image in the manager's engine; its size in bytes. (In a thread: the session's event
    loop runs the dask scheduler and the machine emulator meanwhile.)"""
    return await asyncio.to_thread(ensure_image, manager)


@pytest.fixture(scope="module")
def redis_password() -> Iterator[tuple[RedisServer, str]]:
    password = "pw-" + secrets.token_hex(12)
    with RedisServer(password=password) as server:
        yield server, password


def _env_file(lc: LocalCloud, path: Path, redis_url: str, secret_key: str, http_port: int) -> Path:
    """Step 2: the settings, one VAR=value a line, values verbatim (docker strips no quotes)."""
    env = lc.env()
    env.pop("AUTOSCALER_HTTP_HOST")  # stack.local.yml gives each replica its own loopback address
    env.update(
        AUTOSCALER_DOCKER_URL="unix:///var/run/docker.sock",  # the manager's socket, mounted
        AUTOSCALER_LOG_FORMAT="json",
        AUTOSCALER_HTTP_PORT=str(http_port),
        AUTOSCALER_REDIS_URL=redis_url,
        AUTOSCALER_REDIS_LOCK_TTL="5s",
        AUTOSCALER_EC2_SECRET_ACCESS_KEY=secret_key,  # moto takes any key: a unique one to look for
    )
    path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return path


@pytest_asyncio.fixture(loop_scope="session")
async def stack(
    cloud: LocalCloud, manager: LocalNode, image: int, redis_password: tuple[RedisServer, str], tmp_path: Path
) -> AsyncIterator[dict[str, str]]:
    """Steps 2-3: the env file and `docker stack deploy`; `docker stack rm` afterwards, always."""
    server, password = redis_password
    secret_key = "sk-" + secrets.token_hex(12)
    port = _free_port()
    env_file = _env_file(cloud, tmp_path / "autoscaler.env", server.url, secret_key, port)
    deploy_env = {
        "AUTOSCALER_IMAGE": IMAGE,
        "AUTOSCALER_ENV_FILE": str(env_file),
        "AUTOSCALER_REPLICAS": "2",
        "DOCKER_SOCKET": str(manager.socket_path),
    }
    saved = {k: os.environ.get(k) for k in deploy_env}
    os.environ.update(deploy_env)  # docker stack deploy reads them to fill in stack.yml
    try:
        await manager.docker(
            "stack", "deploy", "--resolve-image", "never",
            "-c", str(ROOT / "docker" / "stack.yml"), "-c", str(ROOT / "docker" / "stack.local.yml"), STACK,
        )  # fmt: skip
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield {"password": password, "secret_key": secret_key, "port": str(port)}
    finally:
        await manager.docker("stack", "rm", STACK)
        await wait_for(lambda: _containers(manager) == [], 60, "the stack's containers gone")


def _containers(manager: LocalNode, *filters: str) -> list[str]:
    args = ["ps", "-q", "--filter", f"label=com.docker.swarm.service.name={SERVICE}"]
    for f in filters:
        args += ["--filter", f]
    return manager.docker_sync(*args).split()


def _healthz(host: str, port: str) -> int:
    with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=3) as reply:
        return int(reply.status)


def _service_logs(manager: LocalNode) -> list[str]:
    """`docker service logs`: the containers' stdout and stderr (the CLI splits them the same way).

    dockerd 20.10's `service logs` has hung here past a minute, once, right after a rolling update, on a
    loaded machine (the replaced tasks' streams); then the same lines are read from each of the service's
    containers with `docker logs`, the same log files."""
    docker = ["/usr/bin/docker", "-H", manager.docker_url]
    cmd = [*docker, "service", "logs", "--raw", "--no-trunc", SERVICE]
    try:
        done = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, check=True
        )
        return [line for line in done.stdout.splitlines() if line.strip()]
    except subprocess.TimeoutExpired:
        print("docker service logs hung: reading each container's logs instead")
    label = f"label=com.docker.swarm.service.name={SERVICE}"
    ids = subprocess.run(
        [*docker, "ps", "-aq", "--filter", label], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    assert ids, "no container of the service"
    lines: list[str] = []
    for cid in ids:
        one = subprocess.run(
            [*docker, "logs", cid],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=30,
            check=True,
        )
        lines += [line for line in one.stdout.splitlines() if line.strip()]
    return lines


async def test_the_stack_deploys_scales_a_burst_rolls_and_logs_json(
    cloud: LocalCloud, manager: LocalNode, image: int, stack: dict[str, str]
) -> None:
    lc = cloud
    print(f"image {IMAGE}: {image / 1e6:.0f} MB")
    assert image < 300e6
    # The runtime alone: none of the extras' packages is in the image (a container with no network).
    probe = "import importlib.util as u; print([m for m in ('moto', 'boto3', 'matplotlib', 'debugpy', 'pytest') if u.find_spec(m)])"
    found = await manager.docker(
        "run", "--rm", "--network", "none", "--entrypoint", "python3", IMAGE, "-c", probe
    )
    assert found == "[]", found
    # Step 4: both replicas healthy through the image's HEALTHCHECK, on one manager, one port each.
    await wait_for(lambda: len(_containers(manager, "health=healthy")) == 2, 120, "two healthy replicas")
    assert [_healthz(f"127.0.1.{slot}", stack["port"]) for slot in (1, 2)] == [200, 200]
    await wait_for(
        lambda: any("this replica is the leader" in line for line in _service_logs(manager)), 30, "a leader"
    )
    assert any("standby" in line for line in _service_logs(manager)), "no replica on standby"

    # Step 5: a burst scales up...
    before = set(owned_instances(lc, ("pending", "running", "shutting-down", "terminated")))
    async with Client(lc.scheduler_address, asynchronous=True) as client:
        pinned = {"CPU": 1.5, "RAM": GIB, "instance-type:m5.large": 1}
        go = Event(f"stack-go-{time.time_ns()}", client=client)
        futures = [
            client.submit(go.wait, TASK_TIMEOUT_S, key=f"stack-{i}", resources=pinned, pure=False)
            for i in range(TASKS)
        ]
        await wait_for(lambda: len(owned_instances(lc)) >= TASKS, 60, f"{TASKS} instances launched")
        # Step 6: a rolling update in the middle of it: each replica is replaced, one at a time.
        old = set(_containers(manager))
        await manager.docker("service", "update", "--force", "--detach=false", SERVICE, timeout=240)
        new = set(_containers(manager, "health=healthy"))
        assert len(new) == 2 and not new & old
        assert not any(f.done() for f in futures), "the burst ended before the rolling update did"
        await go.set()
        assert await asyncio.wait_for(client.gather(futures), 300) == [True] * TASKS
    launched = set(owned_instances(lc, ("pending", "running", "shutting-down", "terminated"))) - before
    assert len(launched) == TASKS, f"a double launch: {len(launched)} instances for {TASKS} pinned tasks"
    # ...and back down to the minimum (zero here).
    await wait_for(lambda: not owned_instances(lc), 90, "the fleet back at zero")

    # Step 7: the logs are JSON lines, and no secret is in them.
    lines = _service_logs(manager)
    assert len(lines) > 10
    # A replica whose start-up check could not reach an endpoint in time (a loaded machine) exits 3 with
    # its one documented line, and swarm starts it again: that line is JSON too (the log format is json).
    startup_errors = 0
    for line in lines:
        record = json.loads(line)  # raises on a line that is not JSON
        assert "event" in record and "level" in record, line
        startup_errors += str(record["event"]).startswith("error: cannot use ")
    print(f"{startup_errors} start-up error line(s) from restarted replicas")
    text = "\n".join(lines)
    assert stack["password"] not in text and stack["secret_key"] not in text
    assert any(json.loads(line).get("event") == "action" for line in lines)


async def test_the_readme_scheduler_stack_serves_the_readme_url(
    cloud: LocalCloud, manager: LocalNode, image: int
) -> None:
    """README step 6 and its step-3 URL, as written: `docker/scheduler-stack.yml` deployed with the image
    (SCHEDULER_IMAGE) lands on the node the operator labelled `dask-scheduler=true`, a swarm worker the
    daemon did not launch (on EC2: a machine without the daemon's instance profile), never on the
    manager; a daemon whose AUTOSCALER_DASK_SCHEDULER_URL is `tcp://<that node's private address>:8786`
    starts (no warning that the packing preload is missing) and reads it in a tick. The node's loopback
    address stands in for its private one; the stack file is deployed unchanged (it uses the machine's
    network, which the local dockerd nodes have)."""
    swarm = cloud.local_swarm
    (node,) = await swarm.add_workers([SCHEDULER_NODE])
    try:
        await asyncio.to_thread(ensure_image, node)
        await manager.docker("node", "update", "--label-add", "dask-scheduler=true", SCHEDULER_NODE)
        await _deploy_the_scheduler_stack(cloud, manager, node)
    finally:
        await swarm.stop_node(SCHEDULER_NODE)
        await manager.docker("node", "rm", "--force", SCHEDULER_NODE)


async def _deploy_the_scheduler_stack(cloud: LocalCloud, manager: LocalNode, node: LocalNode) -> None:
    url = f"tcp://{node.address}:8786"
    env = {**os.environ, "SCHEDULER_IMAGE": IMAGE, "DOCKER_HOST": manager.docker_url}
    compose = str(ROOT / "docker" / "scheduler-stack.yml")
    deploy = [
        "/usr/bin/docker",
        "stack",
        "deploy",
        "--resolve-image",
        "never",
        "-c",
        compose,
        "dask-scheduler",
    ]
    await asyncio.to_thread(subprocess.run, deploy, env=env, check=True, capture_output=True, timeout=120)
    try:

        def answers() -> bool:
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex((node.address, 8786)) == 0

        await wait_for(answers, 120, f"the stack's scheduler listening at {url}", step=1.0)
        placed = await manager.docker(
            "service", "ps", "--filter", "desired-state=running", "--format", "{{.Node}}",
            "dask-scheduler_scheduler",
        )  # fmt: skip
        assert placed.split() == [SCHEDULER_NODE], placed  # the labelled worker, not the manager
        assert not manager.docker_sync(
            "ps", "-q", "--filter", "label=com.docker.stack.namespace=dask-scheduler"
        ), "a scheduler container runs on the manager"
        with capture_logs() as logs:
            async with cloud.daemon({"AUTOSCALER_DASK_SCHEDULER_URL": url}) as daemon:
                result = await daemon.tick_once()
        assert result is not None, "the tick could not read the stack's scheduler"
        assert not [e for e in logs if "packing preload" in str(e.get("event"))], logs
    finally:
        await manager.docker("stack", "rm", "dask-scheduler")
        await wait_for(
            lambda: (
                not node.docker_sync(
                    "ps", "-q", "--filter", "label=com.docker.stack.namespace=dask-scheduler"
                )
            ),
            60,
            "the scheduler stack's container gone",
        )
