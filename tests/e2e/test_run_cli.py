"""`swarm-autoscaler run` as an operator starts it, against the local cloud with a real dockerd swarm manager
(its docker engine is what `run` checks last at start): it logs that every endpoint answered, ticks, serves
/healthz, and stops on SIGTERM with exit 0 and no traceback. (The refused starts, one line each, are in
tests/daemon/test_cli.py: they need no docker engine.)"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, env_without_autoscaler

pytestmark = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.timeout(120)]

CLI = str(Path(sys.executable).with_name("swarm-autoscaler"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


async def test_run_starts_after_its_checks_ticks_and_stops_on_sigterm_with_exit_0(cloud: LocalCloud) -> None:
    port = free_port()
    env_file = cloud.write_env_file({"AUTOSCALER_HTTP_PORT": str(port)})
    proc = await asyncio.create_subprocess_exec(
        CLI,
        "run",
        "--env-file",
        str(env_file),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env_without_autoscaler() | {"NO_COLOR": "1"},
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not any("] tick " in line for line in seen):
                raw = await proc.stdout.readline()
                assert raw, "".join(seen)
                seen.append(raw.decode())
        assert "started: every endpoint answered" in "".join(seen)
        assert await asyncio.to_thread(healthz, port) == 200
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = "".join(seen) + rest.decode()
    assert proc.returncode == 0, output
    assert "stopped" in output and "Traceback" not in output
    assert "tick failed" not in output and "tick observed nothing" not in output
