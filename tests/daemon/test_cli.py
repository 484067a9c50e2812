"""`swarm-autoscaler run/plan/status` as subprocesses against a local cloud started in the test process
(moto EC2 over HTTP, a real dask scheduler, a real redis-server): every endpoint that is unreachable or
wrong at start gives one line naming it and its variable, exit 3 (2 for the HTTP port, a setting to
change), and no log line before it. `run` stopping on SIGTERM needs a docker engine: tests/e2e.

The local cloud's swarm lives in this process's memory, which a subprocess cannot reach and no docker
engine runs here; so what `plan` and `status` print is tested in-process, through the same printers
(`commands.print_plan` / `print_status`) on a daemon built by `open_daemon` whose orchestrator is the
in-memory swarm.
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import pytest
from rich.console import Console

from swarm_autoscaler.core.model import GIB
from swarm_autoscaler.daemon.commands import EXIT_ENDPOINT, print_plan, print_status
from swarm_autoscaler.daemon.tick import run_tick
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions, env_without_autoscaler
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

CLI = str(Path(sys.executable).with_name("swarm-autoscaler"))
REDIS_PASSWORD = "cli-Secret-pw"


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
async def lc() -> AsyncIterator[LocalCloud]:
    async with LocalCloud(LocalCloudOptions(fast=True, cluster_name="cli-test")) as cloud:
        yield cloud


async def cli(lc: LocalCloud, command: str, extra: Mapping[str, str]) -> tuple[int, str, str]:
    env_file = lc.write_env_file(extra)
    proc = await asyncio.create_subprocess_exec(
        CLI,
        command,
        "--env-file",
        str(env_file),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env_without_autoscaler(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def one_error_line(code: int, out: str, err: str, names: str, exit_code: int = EXIT_ENDPOINT) -> str:
    """The whole output of a refused start: the documented exit code and one line on standard error (no
    log line before it, no traceback, no warning repeated)."""
    assert code == exit_code, (code, out, err)
    assert "Traceback" not in out + err
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(("error: cannot use ", "configuration error: ")), lines[0]
    assert names in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password=REDIS_PASSWORD) as server:
        yield server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no request lines on the test's stderr
        return None


@pytest.fixture
def web_page() -> Iterator[str]:
    """Some other HTTP server (a static web page): not EC2, not a dask scheduler."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_run_with_an_unreachable_ec2_endpoint_says_so_in_one_line(lc: LocalCloud) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_EC2_ENDPOINT": endpoint})
    line = one_error_line(code, out, err, f"cannot use {endpoint} (AUTOSCALER_EC2_ENDPOINT)")
    assert "cannot reach EC2" in line


async def test_run_with_the_ec2_endpoint_at_some_other_web_server_says_so_in_one_line(
    lc: LocalCloud, web_page: str
) -> None:
    endpoint = f"http://{web_page}"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_EC2_ENDPOINT": endpoint})
    line = one_error_line(code, out, err, f"cannot use {endpoint} (AUTOSCALER_EC2_ENDPOINT)")
    assert "the answer is not the EC2 API's" in line and "ParseError" not in line


async def test_status_with_an_unreachable_dask_scheduler_says_so_in_one_line(lc: LocalCloud) -> None:
    address = f"tcp://127.0.0.1:{closed_port()}"
    code, out, err = await cli(lc, "status", {"AUTOSCALER_DASK_SCHEDULER_URL": address})
    one_error_line(code, out, err, f"cannot use dask scheduler {address} (AUTOSCALER_DASK_SCHEDULER_URL)")


async def test_run_with_an_unreachable_dask_scheduler_says_so_in_one_line(lc: LocalCloud) -> None:
    address = f"tcp://127.0.0.1:{closed_port()}"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_DASK_SCHEDULER_URL": address})
    one_error_line(code, out, err, f"cannot use dask scheduler {address} (AUTOSCALER_DASK_SCHEDULER_URL)")


async def test_plan_with_an_unreachable_docker_socket_says_so_in_one_line(
    lc: LocalCloud, tmp_path: Path
) -> None:
    url = f"unix://{tmp_path}/docker.sock"
    code, out, err = await cli(lc, "plan", {"AUTOSCALER_DOCKER_URL": url})
    one_error_line(code, out, err, f"cannot use docker engine {url} (AUTOSCALER_DOCKER_URL)")


@pytest.mark.parametrize("where", ["missing socket", "closed port"])
async def test_run_with_an_unreachable_docker_engine_exits_at_start_in_one_line(
    lc: LocalCloud, tmp_path: Path, where: str
) -> None:
    url = (
        f"unix://{tmp_path}/docker.sock" if where == "missing socket" else f"tcp://127.0.0.1:{closed_port()}"
    )
    code, out, err = await cli(lc, "run", {"AUTOSCALER_DOCKER_URL": url})
    line = one_error_line(code, out, err, f"cannot use docker engine {url} (AUTOSCALER_DOCKER_URL)")
    assert "list nodes failed" in line


@pytest.mark.parametrize(
    ("variable", "scheme", "says"),
    [
        ("AUTOSCALER_DOCKER_URL", "tcp", "is this a docker engine API?"),
        ("AUTOSCALER_REDIS_URL", "redis", "Connection closed by server"),
        ("AUTOSCALER_DASK_SCHEDULER_URL", "tcp", "is a dask scheduler up and listening there?"),
    ],
)
async def test_run_with_an_endpoint_at_some_other_web_server_exits_at_start_in_one_line(
    lc: LocalCloud, web_page: str, variable: str, scheme: str, says: str
) -> None:
    url = f"{scheme}://{web_page}" + ("/0" if scheme == "redis" else "")
    code, out, err = await cli(lc, "run", {variable: url})
    line = one_error_line(code, out, err, f"{url} ({variable})")
    assert says in line and "DOCTYPE" not in line


async def test_run_with_an_unreachable_redis_exits_at_start_in_one_line(lc: LocalCloud) -> None:
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{closed_port()}/0"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_REDIS_URL": url})
    line = one_error_line(code, out, err, "(AUTOSCALER_REDIS_URL)")
    assert "Connection refused" in line or "ConnectionError" in line
    assert REDIS_PASSWORD not in out + err


async def test_an_unreachable_endpoint_in_json_log_mode_is_one_json_line(lc: LocalCloud) -> None:
    """With `AUTOSCALER_LOG_FORMAT=json` the refused start is one JSON object with the keys of every log
    line, so a collector reading JSON lines reads it; the redis password is in neither stream."""
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{closed_port()}/0"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_REDIS_URL": url, "AUTOSCALER_LOG_FORMAT": "json"})
    assert (code, out) == (EXIT_ENDPOINT, "") and "Traceback" not in err
    (line,) = err.splitlines()
    record = json.loads(line)
    assert set(record) == {"event", "level", "timestamp"} and record["level"] == "error"
    assert record["event"].startswith("error: cannot use ") and "(AUTOSCALER_REDIS_URL)" in record["event"]
    assert REDIS_PASSWORD not in out + err


async def test_run_with_a_wrong_redis_password_exits_at_start_in_one_line(
    lc: LocalCloud, redis_server: RedisServer
) -> None:
    wrong = "not-the-password"
    url = f"redis://:{wrong}@127.0.0.1:{redis_server.port}/0"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_REDIS_URL": url})
    line = one_error_line(code, out, err, f"127.0.0.1:{redis_server.port}/0 (AUTOSCALER_REDIS_URL)")
    assert "authentication failed" in line and "check the password in the URL" in line
    assert wrong not in out + err and REDIS_PASSWORD not in out + err


async def test_run_without_the_redis_password_exits_at_start_in_one_line(
    lc: LocalCloud, redis_server: RedisServer
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_REDIS_URL": url})
    line = one_error_line(code, out, err, "(AUTOSCALER_REDIS_URL)")
    assert "authentication failed" in line


async def test_run_with_the_http_port_in_use_exits_2_naming_the_variable(lc: LocalCloud) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = await cli(lc, "run", {"AUTOSCALER_HTTP_PORT": str(port)})
    line = one_error_line(code, out, err, f"AUTOSCALER_HTTP_PORT: cannot listen on 127.0.0.1:{port}", 2)
    assert "OSError" not in line


async def test_plan_and_status_print_the_plan_with_reasons_and_the_tables(lc: LocalCloud) -> None:
    from distributed import Client

    async with lc.daemon() as daemon, Client(lc.scheduler_address, asynchronous=True) as client:  # type: ignore[no-untyped-call]
        futures = [
            client.submit(sum, [i], key=f"cli-small-{i}", resources={"CPU": 1.0, "RAM": float(GIB)})
            for i in range(3)
        ]
        futures.append(client.submit(sum, [0], key="cli-impossible", resources={"CPU": 512.0}))
        for _ in range(100):  # what `plan` and `status` run: a tick that acts on nothing
            result = await run_tick(
                daemon.ports, daemon.policy, daemon.catalogue, daemon.clock(), leader=False
            )
            if len(result.snapshot.unrunnable) == len(futures):
                break
            await asyncio.sleep(0.05)
        assert result.outcomes == () and not result.acted
        plan_text, status_text = io.StringIO(), io.StringIO()
        print_plan(result, Console(file=plan_text, width=250))
        print_status(result, Console(file=status_text, width=250))
        for f in futures:
            await f.cancel()

    printed_plan = plan_text.getvalue()
    assert "plan (nothing was done)" in printed_plan
    assert "Launch" in printed_plan and "pending task(s) need new capacity" in printed_plan
    assert "unplaceable cli-impossible" in printed_plan
    assert f"pending tasks: {len(futures)}" in printed_plan
    printed_status = status_text.getvalue()
    for title in (
        "instances (0)",
        "nodes (0)",
        "workers (0)",
        "buckets: ",
        f"unrunnable tasks: {len(futures)}",
    ):
        assert title in printed_status, printed_status


def test_status_names_each_machines_bucket() -> None:
    from tests.builders import assemble, machine, make_policy

    from swarm_autoscaler.core.actions import Plan
    from swarm_autoscaler.core.model import Availability, NodeMarks
    from swarm_autoscaler.daemon.tick import TickResult

    snapshot = assemble(
        machine(1),
        machine(2, worker=False, availability=Availability.DRAIN, marks=NodeMarks(True, drained_since=1.0)),
    )
    result = TickResult(snapshot, make_policy(), Plan(), (), acted=False)
    out = io.StringIO()
    print_status(result, Console(file=out, width=250))
    rows: dict[str, str] = {}
    for (
        line
    ) in out.getvalue().splitlines():  # instances, then nodes, then workers: keep the first row per key
        if "ip-10-0-0-" in line:
            rows.setdefault(line.split("│")[1].strip(), line)
    assert "active" in rows["i-0001"] and "drained" in rows["i-0002"]
    assert "active" in rows["ip-10-0-0-1"] and "drained" in rows["ip-10-0-0-2"]


async def test_run_exits_within_seconds_of_sigterm_even_mid_act(tmp_path: Path) -> None:
    """The real process, its swarm adapter talking HTTP to the local cloud's in-memory swarm, whose node
    updates hang: SIGTERM arrives while an update is in flight, and the process exits at once."""
    from swarm_autoscaler_lab.localcloud.dockerapi import DockerApi
    from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

    options = LocalCloudOptions(fast=True, cluster_name="stop-test")
    async with LocalCloud(options) as cloud:
        assert isinstance(cloud.orchestrator, MemorySwarm)
        async with DockerApi(cloud.orchestrator, write_latency=3600.0) as engine:
            extra = {"AUTOSCALER_DOCKER_URL": engine.url, "AUTOSCALER_EC2_MIN_INSTANCES": "1"}
            proc = await asyncio.create_subprocess_exec(
                CLI,
                "run",
                "--env-file",
                str(cloud.write_env_file(extra)),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env_without_autoscaler(),
            )
            try:
                # launch, boot, join: then the daemon labels and marks the node, and that update hangs
                await asyncio.wait_for(engine.write_seen.wait(), 60)
                await asyncio.sleep(0.2)
                sent = asyncio.get_running_loop().time()
                proc.send_signal(signal.SIGTERM)
                out, _ = await asyncio.wait_for(proc.communicate(), 30)
                took = asyncio.get_running_loop().time() - sent
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    output = out.decode()
    print(f"SIGTERM mid-act -> exit in {took:.2f} s")
    assert proc.returncode == 0, output
    assert took < 10.0, output
    assert "stopping mid-tick" in output and "Traceback" not in output
