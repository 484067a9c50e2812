"""The processes and probes of a chaos run: starting and stopping processes by pid, the world's control
API, and a sampler of the daemon's `/healthz`, the world's state and the daemon's resource use.

Every stop is by pid (SIGTERM, then SIGKILL after `STOP_TIMEOUT_S`); every HTTP call goes to 127.0.0.1
with a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes]) -> float | None:
    """SIGTERM, wait, then SIGKILL: by pid only. Returns the seconds a SIGTERM took, None if it had to kill."""
    if proc.poll() is not None:
        return 0.0
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
        return time.monotonic() - started
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)
        return None


def clean_env() -> dict[str, str]:
    """This environment without AUTOSCALER_* variables (a user's settings must not leak in)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")} | {"NO_COLOR": "1"}


class Http:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, timeout: float = 10.0) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=timeout) as reply:
            return json.loads(reply.read())

    def post(self, path: str, timeout: float = 30.0) -> Any:
        request = urllib.request.Request(self.base + path, data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read())


def process_usage(pid: int) -> dict[str, int] | None:
    """RSS (KiB), threads, open file descriptors and TCP sockets of a live process, from /proc."""
    proc = Path(f"/proc/{pid}")
    try:
        lines = (proc / "status").read_text().splitlines()
        fds = list((proc / "fd").iterdir())
    except OSError:
        return None  # gone (killed or restarting)
    status = dict(line.split(":", 1) for line in lines if ":" in line)
    inodes = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # a descriptor may close while we look
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    tcp = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            rows = (proc / "net" / table).read_text().splitlines()[1:]
            tcp += sum(1 for row in rows if row.split()[9] in inodes)
    return {
        "rss_kib": int(status["VmRSS"].split()[0]),
        "threads": int(status["Threads"]),
        "fds": len(fds),
        "tcp": tcp,
    }


class Sampler(threading.Thread):
    """Polls /healthz every second; every two, the world's state and the daemon's RSS, threads, file
    descriptors and TCP connections; until `halt()`."""

    def __init__(self, health_url: str, world: Http, daemon: DaemonProcess) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.health_url, self.world, self.autoscaler = health_url, world, daemon
        self.health: Counter[int] = Counter()
        self.samples: list[dict[str, Any]] = []
        self.usage: list[dict[str, int]] = []
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        beat = 0
        while not self._halt.wait(1.0):
            self.health[self._health()] += 1
            beat += 1
            if beat % 2 == 0:
                with contextlib.suppress(OSError, ValueError):
                    state = self.world.get("/state")
                    self.samples.append({"t": round(time.monotonic() - self._t0, 1), **state})
                proc = self.autoscaler.proc
                usage = process_usage(proc.pid) if proc is not None and proc.poll() is None else None
                if usage is not None:
                    self.usage.append(usage)

    def _health(self) -> int:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0  # not listening (the daemon is down or restarting)

    def halt(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=10)


class DaemonProcess:
    """`swarm-autoscaler run --env-file F`, its JSON log appended to one file across restarts."""

    def __init__(self, env_file: Path, log: Path) -> None:
        self.env_file, self.log = env_file, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.exe = str(Path(sys.executable).with_name("swarm-autoscaler"))

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [self.exe, "run", "--env-file", str(self.env_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=clean_env(),
            )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL, by pid
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> float | None:
        return stop_process(self.proc) if self.proc is not None else 0.0


def read_log(path: Path) -> tuple[list[float], Counter[str], int]:
    """(tick durations, successful actions by kind, 'scheduler kept' outcomes) from a JSON log."""
    ticks: list[float] = []
    actions: Counter[str] = Counter()
    kept = 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "tick" and "seconds" in event:
            ticks.append(float(event["seconds"]))
        elif event.get("event") == "action":
            actions[str(event.get("kind"))] += 1
            kept += "scheduler kept" in str(event.get("result", ""))
    return ticks, actions, kept
