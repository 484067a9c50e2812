"""`swarm-autoscaler run/plan/status` as subprocesses against a local cloud started in the test process
(moto EC2 over HTTP, a real dask scheduler): unreachable endpoints give one clear line and a non-zero
exit, SIGTERM stops `run` cleanly.

The local cloud's swarm lives in this process's memory, which a subprocess cannot reach and no docker
engine runs here; so what `plan` and `status` print is tested in-process, through the same printers
(`commands.print_plan` / `print_status`) on a daemon built by `open_daemon` whose orchestrator is the
in-memory swarm.
"""

from __future__ import annotations

import asyncio
import io
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from rich.console import Console

from swarm_autoscaler.core.model import GIB
from swarm_autoscaler.daemon.commands import print_plan, print_status
from swarm_autoscaler.daemon.tick import run_tick
from swarm_autoscaler.localcloud.cloud import LocalCloud, LocalCloudOptions, env_without_autoscaler

pytestmark = pytest.mark.timeout(120)

CLI = str(Path(sys.executable).with_name("swarm-autoscaler"))


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


def one_error_line(code: int, out: str, err: str, names: str) -> str:
    assert code != 0, (out, err)
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert names in errors[0], errors[0]
    return errors[0]


async def test_run_with_an_unreachable_ec2_endpoint_says_so_in_one_line(lc: LocalCloud) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    code, out, err = await cli(lc, "run", {"AUTOSCALER_EC2_ENDPOINT": endpoint})
    line = one_error_line(code, out, err, endpoint)
    assert "EC2" in line


async def test_status_with_an_unreachable_dask_scheduler_says_so_in_one_line(lc: LocalCloud) -> None:
    address = f"tcp://127.0.0.1:{closed_port()}"
    code, out, err = await cli(lc, "status", {"AUTOSCALER_DASK_SCHEDULER_URL": address})
    line = one_error_line(code, out, err, address)
    assert "dask scheduler" in line


async def test_plan_with_an_unreachable_docker_socket_says_so_in_one_line(
    lc: LocalCloud, tmp_path: Path
) -> None:
    url = f"unix://{tmp_path}/docker.sock"
    code, out, err = await cli(lc, "plan", {"AUTOSCALER_DOCKER_URL": url})
    line = one_error_line(code, out, err, url)
    assert "docker" in line


async def test_run_stops_on_sigterm_and_exits_0(lc: LocalCloud, tmp_path: Path) -> None:
    # no docker engine here: the daemon runs and its ticks fail (logged), which must not stop the loop
    env_file = lc.write_env_file({"AUTOSCALER_DOCKER_URL": f"unix://{tmp_path}/docker.sock"})
    proc = await asyncio.create_subprocess_exec(
        CLI,
        "run",
        "--env-file",
        str(env_file),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env_without_autoscaler(),
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not any("tick observed nothing" in line for line in seen):
                raw = await proc.stdout.readline()
                assert raw, "".join(seen)
                seen.append(raw.decode())
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = "".join(seen) + rest.decode()
    assert proc.returncode == 0, output
    assert "stopped" in output and "Traceback" not in output


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

    from swarm_autoscaler.core.model import Availability, NodeMarks, Plan
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
    from swarm_autoscaler.localcloud.engine_api import EngineApi
    from swarm_autoscaler.localcloud.memswarm import MemorySwarm

    options = LocalCloudOptions(fast=True, cluster_name="stop-test")
    async with LocalCloud(options) as cloud:
        assert isinstance(cloud.orchestrator, MemorySwarm)
        async with EngineApi(cloud.orchestrator, write_latency=3600.0) as engine:
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
