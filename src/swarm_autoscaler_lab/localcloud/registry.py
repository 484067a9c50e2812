"""A real private registry on a loopback address, with authentication: what ECR or a team's registry is
to the machines.

`LocalRegistry` runs Debian's `docker-registry` (the distribution registry, 2.8) in a temporary folder,
listening on `127.0.0.<n>:5000` (plain HTTP: dockerd treats registries on 127.0.0.0/8 as insecure by
default, so no TLS is needed), with htpasswd authentication (bcrypt, written by `htpasswd` from
apache2-utils) for one user and a random password. Both packages come from scripts/ensure-services.sh.

- `login(node)`: `docker login` against a node, the credentials kept in the registry's own CLI folder
  (`cli_env()`'s DOCKER_CONFIG, never root's ~/.docker): what an operator does on the manager before
  `docker stack deploy --with-registry-auth` (run with `cli_env()`), which hands the credentials to swarm
  so every node pulls with them.
- `push(node, image, name)`: tag and push `image` from `node`'s engine once; returns the reference
  (`127.0.0.<n>:5000/<name>`). Nodes then pull it when swarm schedules a task there, instead of a tarball
  `docker load`ed into each new node.

Always stopped (by the pid it started, never by name) and its folder removed when the context exits.
Traffic stays on the loopback address.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud.dockerd import LocalNode, _cli_env, _docker_cli

INSTALL_HINT = "run scripts/ensure-services.sh (apt-get install docker-registry apache2-utils)"
DEFAULT_ADDRESS = "127.0.0.250"  # away from the swarm nodes' 127.0.0.11, .12, ...
PORT = 5000
USER = "swarm"

_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: {address}:{port}
auth:
  htpasswd:
    realm: swarm-autoscaler-local
    path: {htpasswd}
"""


def missing() -> list[str]:
    """What is not installed for a local registry (empty when it can run)."""
    return [tool for tool in ("docker-registry", "htpasswd") if shutil.which(tool) is None]


class LocalRegistry:
    """A `docker-registry` child process with htpasswd auth. `with LocalRegistry() as reg:`."""

    def __init__(self, address: str = DEFAULT_ADDRESS, port: int = PORT) -> None:
        self.address = address
        self.port = port
        self.user = USER
        self.password = secrets.token_hex(12)
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._logged_in: set[str] = set()
        self._pushed: dict[str, str] = {}

    @property
    def host(self) -> str:
        """`address:port`: the registry part of an image reference."""
        return f"{self.address}:{self.port}"

    def start(self) -> Self:
        lacking = missing()
        if lacking:
            raise ConfigurationError(f"a local registry needs {', '.join(lacking)}: {INSTALL_HINT}")
        self._dir = Path(tempfile.mkdtemp(prefix="swarm-autoscaler-registry-"))
        htpasswd = self._dir / "htpasswd"
        subprocess.run(
            ["htpasswd", "-Bbc", str(htpasswd), self.user, self.password],
            check=True,
            capture_output=True,
            timeout=30,
        )
        config = self._dir / "config.yml"
        config.write_text(
            _CONFIG.format(root=self._dir / "data", address=self.address, port=self.port, htpasswd=htpasswd)
        )
        with (self._dir / "registry.log").open("wb") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        """Until `GET /v2/` answers 401 (up, and asking for credentials)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ConfigurationError(f"docker-registry exited at start:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1).close()
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code == 401:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise ConfigurationError(
            f"docker-registry not up on {self.host} within {timeout:g}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        path = self._dir / "registry.log" if self._dir else None
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def cli_env(self) -> dict[str, str]:
        """The docker CLI's environment with this registry's credentials folder (after `login`)."""
        assert self._dir is not None, "the registry is not started"
        return {**_cli_env(), "DOCKER_CONFIG": str(self._dir / "docker-config")}

    def docker(self, node: LocalNode, *args: str, timeout: float = 120.0, stdin: str | None = None) -> str:
        """The docker CLI against `node`, with this registry's credentials folder."""
        cmd = [_docker_cli(), "-H", node.docker_url, *args]
        done = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, env=self.cli_env(), timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise ConfigurationError(
                f"`docker {' '.join(args[:2])}` on {node.hostname}: {done.stderr.strip()}"
            )
        return done.stdout.strip()

    def login(self, node: LocalNode) -> None:
        """`docker login` against `node` (once per node), the password on standard input."""
        if node.docker_url in self._logged_in:
            return
        self.docker(
            node, "login", "--username", self.user, "--password-stdin", self.host, stdin=self.password
        )
        self._logged_in.add(node.docker_url)

    def push(self, node: LocalNode, image: str, name: str) -> str:
        """Push `image` from `node`'s engine as `<host>/<name>` (once per name); the reference."""
        ref = f"{self.host}/{name}"
        if self._pushed.get(ref) == image:
            return ref
        self.login(node)
        self.docker(node, "tag", image, ref)
        self.docker(node, "push", "--quiet", ref, timeout=600)
        self._pushed[ref] = image
        return ref

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
