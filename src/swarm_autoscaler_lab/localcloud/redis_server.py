"""A throw-away redis-server on 127.0.0.1 for tests and the e2e suite.

It runs in a temporary directory with persistence off (`--save '' --appendonly no`), on a free port,
and is always stopped (and its directory removed) when the context manager exits, even on error.
`start()` returns only once the server answers PING. The readiness probe speaks RESP over a plain
socket so that this module needs no redis client library.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

INSTALL_HINT = "run scripts/ensure-services.sh or apt-get install redis-server"


class RedisServerError(RuntimeError):
    """redis-server is missing or did not come up."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ping(port: int, password: str | None, timeout: float = 0.5) -> bool:
    """True when a redis server on 127.0.0.1:`port` answers PING (after AUTH, if a password is set)."""
    request = b"PING\r\n"
    if password:
        request = f"AUTH {password}\r\n".encode() + request
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(request)
            reply = b""
            while b"PONG" not in reply and not reply.startswith(b"-"):
                chunk = sock.recv(256)
                if not chunk:
                    break
                reply += chunk
            return b"+PONG" in reply
    except OSError:
        return False


class RedisServer:
    """A redis-server child process. Use as `with RedisServer() as srv:` or `async with`.

    `url` is `redis://127.0.0.1:<port>/0`, with the password when one is given. Attributes are valid
    between start and stop.
    """

    def __init__(
        self, *, password: str | None = None, executable: str = "redis-server", start_timeout: float = 10.0
    ) -> None:
        self.password = password
        self.executable = executable
        self.start_timeout = start_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        """Start the server and wait until it answers PING. Raises `RedisServerError` with what to do."""
        binary = shutil.which(self.executable)
        if binary is None:
            raise RedisServerError(f"{self.executable} not found on PATH: {INSTALL_HINT}")
        self._dir = Path(tempfile.mkdtemp(prefix="swarm-autoscaler-redis-"))
        try:
            # A free port can be taken between probing and binding: try a few.
            for _attempt in range(3):
                self.port = free_port()
                self._proc = subprocess.Popen(
                    self._command(binary),
                    cwd=self._dir,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                if self._wait_ready():
                    return self
                self._kill()
            raise RedisServerError(f"redis-server did not answer PING on 127.0.0.1:{self.port}")
        except BaseException:
            self.stop()
            raise

    def _command(self, binary: str) -> list[str]:
        assert self._dir is not None
        command = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self._dir)]
        command += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "redis.log"]
        if self.password:
            command += ["--requirepass", self.password]
        return command

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if not self.running:
                return False  # most likely the port was taken: the caller retries on another
            if _ping(self.port, self.password):
                return True
            time.sleep(0.05)
        return False

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def stop(self) -> None:
        """Stop the server and remove its directory. Safe to call more than once."""
        self._kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)
