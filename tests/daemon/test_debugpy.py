"""`swarm-autoscaler run` honours the debugpy settings itself, read from an --env-file: it listens on
loopback, waits for the debugger, and a Debug Adapter Protocol client can initialize, attach and detach."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CLI = str(Path(sys.executable).with_name("swarm-autoscaler"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dap:
    """A minimal DAP client: Content-Length framed JSON over TCP."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.seq = 0

    def send(self, command: str, arguments: dict[str, Any] | None = None) -> int:
        self.seq += 1
        body = json.dumps(
            {"seq": self.seq, "type": "request", "command": command, "arguments": arguments or {}}
        ).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self.seq

    def receive(self) -> dict[str, Any]:
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._read()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        while len(rest) < length:
            rest += self._read()
        self.buf = rest[length:]
        message: dict[str, Any] = json.loads(rest[:length])
        return message

    def _read(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the debug adapter closed the connection")
        return chunk

    def until(self, kind: str, name: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
        """Read messages until a response to command `name` (kind "response") or an event `name`."""
        while True:
            message = self.receive()
            seen.append(message)
            if message["type"] == kind and message.get("command" if kind == "response" else "event") == name:
                return message


def _connect(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"nothing listens on 127.0.0.1:{port}; the daemon exited with {proc.poll()}")
            time.sleep(0.2)


def write_env_file(tmp_path: Path, **extra: str) -> Path:
    """Valid settings whose endpoints are closed ports: the daemon starts, then fails to reach them."""
    env_file = tmp_path / "daemon.env"
    lines = [
        "AUTOSCALER_CLUSTER_NAME=debug-test",
        """AUTOSCALER_EC2_ALLOWED_TYPES='{"m5.large": {"ami_id": "ami-12345678"}}'""",
        f"AUTOSCALER_EC2_ENDPOINT=http://127.0.0.1:{free_port()}",
        "AUTOSCALER_EC2_REGION=us-east-1",
        f"AUTOSCALER_DASK_SCHEDULER_URL=tcp://127.0.0.1:{free_port()}",
        "AUTOSCALER_HTTP_PORT=0",
    ]
    lines += [f"AUTOSCALER_{k}={v}" for k, v in extra.items()]
    env_file.write_text("\n".join(lines) + "\n")
    return env_file


@pytest.mark.timeout(90)
def test_run_waits_for_a_dap_client_that_attaches_and_detaches(tmp_path: Path) -> None:
    port = free_port()
    env_file = write_env_file(tmp_path, DEBUGPY_PORT=str(port), DEBUGPY_WAIT="true")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    out = tmp_path / "daemon.log"
    with out.open("wb") as log:
        proc = subprocess.Popen(
            [CLI, "run", "--env-file", str(env_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # debugpy starts an adapter process: stop the whole group
        )
    try:
        sock = _connect(port, proc)
        listening = [s for s in _listeners(port)]
        assert listening == ["127.0.0.1"], listening  # loopback only
        time.sleep(0.5)
        assert "cannot use" not in out.read_text()  # still waiting: no endpoint was tried yet
        seen: list[dict[str, Any]] = []
        with sock:
            dap = Dap(sock)
            dap.send("initialize", {"clientID": "pytest", "adapterID": "debugpy", "pathFormat": "path",
                                    "linesStartAt1": True, "columnsStartAt1": True})  # fmt: skip
            init = dap.until("response", "initialize", seen)
            assert init["success"], init
            assert init["body"].get("supportsConfigurationDoneRequest"), init
            dap.send("attach", {"justMyCode": True})
            dap.until("event", "initialized", seen)
            dap.send("configurationDone")
            attach = dap.until("response", "attach", seen)
            assert attach["success"], attach
            dap.send("disconnect", {"terminateDebuggee": False})
            assert dap.until("response", "disconnect", seen)["success"]
        # detached: the daemon goes on past the wait and starts (then stops on the unreachable endpoint)
        deadline = time.monotonic() + 30
        while "cannot use" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = out.read_text()
        # the start-up checks ran (the test's EC2 endpoint is unreachable on purpose: one line, then exit)
        assert "debugpy listening" in text and "cannot use" in text, text
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _listeners(port: int) -> list[str]:
    """The local addresses of TCP sockets listening on `port`, from /proc/net/tcp (IPv4)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_run_without_a_debugpy_port_never_imports_debugpy(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "PYTHON"))}
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # python lists every module it imports on stderr
    proc = subprocess.Popen(
        [CLI, "run", "--env-file", str(write_env_file(tmp_path))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        time.sleep(4)  # past start-up: settings read, logging on, the first tick tried
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "swarm_autoscaler.daemon.commands" in err  # the run path was imported
    assert "debugpy" not in err
