"""The deployment files: docker/stack.yml's shape and docker/boot.sh as the container runs it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "docker" / "boot.sh"
STACK = ROOT / "docker" / "stack.yml"


def boot_env(**extra: str) -> dict[str, str]:
    """A clean environment in which boot.sh's `python` is the project's interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "PYTHON"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_stack_file_runs_one_daemon_on_a_manager_with_the_socket_and_env_file() -> None:
    stack: dict[str, Any] = yaml.safe_load(STACK.read_text())
    service = stack["services"]["autoscaler"]
    assert "node.role == manager" in service["deploy"]["placement"]["constraints"]
    mounts = service["volumes"]
    assert any(
        (m.get("source"), m.get("target")) == ("/var/run/docker.sock", "/var/run/docker.sock")
        if isinstance(m, dict)
        else m.startswith("/var/run/docker.sock:/var/run/docker.sock")
        for m in mounts
    )
    env_files = service["env_file"]
    assert env_files and all(str(f).endswith(".env") for f in env_files)
    assert "/healthz" in " ".join(service["healthcheck"]["test"])


def test_boot_sh_runs_the_daemon_command(tmp_path: Path) -> None:
    done = subprocess.run(
        ["sh", str(BOOT), "env-template"],
        check=False,
        capture_output=True,
        text=True,
        env=boot_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "AUTOSCALER_CLUSTER_NAME" in done.stdout and "AUTOSCALER_EC2_ALLOWED_TYPES" in done.stdout


def test_boot_sh_run_with_bad_settings_exits_2_without_debugpy(tmp_path: Path) -> None:
    # PYTHONPROFILEIMPORTTIME makes python list every module it imports on stderr
    env = boot_env(AUTOSCALER_POLL_INTERVAL="banana", PYTHONPROFILEIMPORTTIME="1")
    done = subprocess.run(
        ["sh", str(BOOT), "run"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "configuration error" in done.stderr
    assert "AUTOSCALER_POLL_INTERVAL" in done.stderr or "poll_interval" in done.stderr.lower()
    assert "Traceback" not in done.stderr
    assert "debugpy" not in done.stderr  # never imported when AUTOSCALER_DEBUGPY_PORT is unset


@pytest.mark.timeout(60)
def test_boot_sh_starts_debugpy_on_loopback_when_the_port_is_set(tmp_path: Path) -> None:
    port = free_port()
    env = boot_env(AUTOSCALER_DEBUGPY_PORT=str(port), AUTOSCALER_DEBUGPY_WAIT="1")
    proc = subprocess.Popen(
        ["sh", str(BOOT), "env-template"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # debugpy starts an adapter process: stop the whole group
    )
    try:
        deadline = time.monotonic() + 30
        connected = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    connected = True
                    break
            except OSError:
                time.sleep(0.2)
        assert connected, f"nothing listened on 127.0.0.1:{port}; exit={proc.poll()}"
        assert proc.poll() is None  # waiting for the debugger before running the command
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=10)
    assert f"debugpy listening on 127.0.0.1:{port}" in err.decode()
