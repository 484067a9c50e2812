"""A real docker swarm on this machine: one dockerd per node, following `/work/shared/LOCAL-SWARM.md`.

Each node is a dockerd in its own folder (socket, data-root, exec-root, pidfile, log, config file
and engine key, so nothing is read from or written to /etc/docker), in its own UTS namespace carrying
the node's hostname (`unshare --uts`), advertising its own loopback address (127.0.0.11, .12, ...).
Every dockerd runs with `SAFE_FLAGS`, so it never touches the machine's firewall, forwarding or bridges.

Contract:
- Needs root and the `dockerd`, `docker`, `unshare`, `ip` and `umount` commands (`check_install`).
- One `LocalSwarm` per machine at a time: a machine-wide lock file serialises users, and a swarm left
  behind by a process that died is cleaned up when the next one starts.
- `LocalSwarm` owns `base_dir`: it is created on start and removed by `close()`.
- Teardown (`close`, `__aexit__`, `__exit__`, and an atexit hook) always runs every step: swarm leave
  --force on each node, stop each dockerd by the pid in its pidfile (checked to be ours), delete
  `docker_gwbridge`, unmount what is left under the node folders, remove the folder.
- Blocking work (the docker CLI, waiting for processes) runs in threads; the API is async.

Why one file of this size: the teardown contract above covers every process, mount and interface that
the start creates, so both live in one place; the joining of nodes is in `dockerd_joiner`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from swarm_autoscaler.errors import ConfigurationError, EndpointError

SAFE_FLAGS = (
    "--bridge=none",
    "--iptables=false",
    "--ip6tables=false",
    "--ip-masq=false",
    "--ip-forward=false",
)
SWARM_PORT = 2377
# With `machine_mounts`, a node's dockerd runs in a mount namespace of its own where two paths are the
# machine's, as on a real machine: `/etc/swarm-autoscaler` is the node's folder (`LocalNode.etc`: what
# its user data writes there, services bind-mount it) and `/run` is a tmpfs of its own holding the
# node's `/var/run/docker.sock` (a service mounting the docker socket gets its node's dockerd). The
# mounts die with the namespace; nothing on this machine's /run or /etc changes (the empty mount point
# /etc/swarm-autoscaler is created once).
MACHINE_MOUNTS = (
    'hostname "$0" && mount -t tmpfs -o mode=755 tmpfs /run'
    ' && mount --bind "$1" /etc/swarm-autoscaler && shift && exec "$@"'
)
REQUIRED_COMMANDS = ("dockerd", "docker", "unshare", "ip", "umount")
RUN_DOCKER = Path("/run/docker")
DEFAULT_LOCK = Path("/tmp/swarm-autoscaler-localswarm.lock")
_ENV_DROP = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


def check_install() -> list[str]:
    """What is missing to run a local swarm (empty when everything is there)."""
    problems = [f"command {name!r} not found" for name in REQUIRED_COMMANDS if shutil.which(name) is None]
    if os.geteuid() != 0:
        problems.append("not running as root")
    return problems


def require_install() -> None:
    """Raise `ConfigurationError` naming what is missing and how to get it."""
    problems = check_install()
    if problems:
        raise ConfigurationError(
            "cannot start a local docker swarm: "
            + "; ".join(problems)
            + ". Run `bash scripts/ensure-services.sh`"
            " as root (it installs docker.io with apt)."
        )


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def _docker_cli() -> str:
    # The CLI shipped with docker.io matches its dockerd; any other docker CLI negotiates the API down.
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")


@dataclass(eq=False)
class LocalNode:
    """One dockerd standing in for one machine. `address` is its own loopback address."""

    hostname: str
    address: str
    folder: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # A machine's own files as its dockerd sees them (`add_node(machine_mounts=True)`): see `MACHINE_MOUNTS`.
    machine_mounts: bool = False

    @property
    def socket_path(self) -> Path:
        return self.folder / "docker.sock"

    @property
    def docker_url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def swarm_addr(self) -> str:
        return f"{self.address}:{SWARM_PORT}"

    @property
    def etc(self) -> Path:
        """The node's own `/etc/swarm-autoscaler` (its dockerd sees it there with `machine_mounts`)."""
        return self.folder / "etc-swarm-autoscaler"

    @property
    def config_file(self) -> Path:
        """The dockerd's configuration file: the node's `/etc/docker/daemon.json` (its user data sees that
        folder there, `userdata`), which a GPU machine's boot script writes before restarting dockerd."""
        return self.folder / "etc-docker" / "daemon.json"

    @property
    def exec_root(self) -> Path:
        return self.folder / "exec"

    @property
    def pidfile(self) -> Path:
        return self.folder / "docker.pid"

    @property
    def log_path(self) -> Path:
        return self.folder / "dockerd.log"

    def dockerd_args(self) -> list[str]:
        return [
            "dockerd",
            f"--host={self.docker_url}",
            f"--data-root={self.folder / 'root'}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.pidfile}",
            f"--config-file={self.config_file}",
            *SAFE_FLAGS,
            *(["--host=unix:///var/run/docker.sock"] if self.machine_mounts else []),
        ]

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no dockerd log)"
        return "\n".join(text.splitlines()[-lines:])

    def docker_sync(self, *args: str, timeout: float = 60.0) -> str:
        """Run the docker CLI against this node; raise `EndpointError` with its stderr on failure."""
        cmd = [_docker_cli(), "-H", self.docker_url, *args]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=_cli_env(), check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise EndpointError(
                self._endpoint, f"`docker {' '.join(args)}` timed out after {timeout}s"
            ) from exc
        if done.returncode != 0:
            raise EndpointError(self._endpoint, f"`docker {' '.join(args)}` failed: {done.stderr.strip()}")
        return done.stdout.strip()

    async def docker(self, *args: str, timeout: float = 60.0) -> str:
        return await asyncio.to_thread(self.docker_sync, *args, timeout=timeout)

    async def join(self, token: str, manager_addr: str, *, paused: bool = False) -> None:
        """Join the swarm whose manager listens on `manager_addr`, advertising this node's own address;
        `paused`: with availability pause (`docker swarm join --availability pause`)."""
        pause = ("--availability", "pause") if paused else ()
        await self.docker(
            "swarm", "join", *pause, "--token", token, "--advertise-addr", self.address,
            "--listen-addr", self.swarm_addr, manager_addr,
        )  # fmt: skip

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until dockerd answers `/_ping` on its socket; fail early if it exited."""
        deadline = time.monotonic() + timeout
        while not await _ping(self.socket_path):
            if self.process is not None and self.process.poll() is not None:
                raise EndpointError(
                    self._endpoint, f"dockerd exited with {self.process.returncode}; log:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise EndpointError(
                    self._endpoint, f"no answer after {timeout:.0f}s; log:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.1)

    def pid(self) -> int | None:
        """The dockerd pid from its pidfile (or from the process we started), if that process is ours."""
        candidates: list[int] = []
        with contextlib.suppress(OSError, ValueError):
            candidates.append(int(self.pidfile.read_text().strip()))
        if self.process is not None:
            candidates.append(self.process.pid)
        return next((p for p in candidates if _is_ours(p, self.folder)), None)

    @property
    def _endpoint(self) -> str:
        return f"dockerd {self.hostname} ({self.docker_url})"


async def _ping(socket_path: Path) -> bool:
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
    except OSError:
        return False
    try:
        writer.write(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readline(), 5.0)
        return b" 200 " in head
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _is_ours(pid: int, folder: Path) -> bool:
    """True when `pid` is alive and its command line names `folder` (guards against reused pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(folder).encode() in cmdline


def _mounts_under(folder: Path) -> list[str]:
    prefix = str(folder) + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 1:
            point = parts[1].encode().decode("unicode_escape")  # /proc/mounts escapes spaces as \040
            if point.startswith(prefix):
                found.append(point)
    return sorted(set(found), key=len, reverse=True)


def unmount_under(folder: Path) -> None:
    """Unmount everything mounted below `folder` (swarm leaves nsfs mounts under exec-roots)."""
    for point in _mounts_under(folder):
        done = subprocess.run(["umount", point], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _terminate(pid: int, folder: Path, grace: float) -> None:
    """SIGTERM `pid`, then SIGKILL it after `grace` seconds; only while it is still ours."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _is_ours(pid, folder) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if _is_ours(pid, folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _stop_node_processes(node: LocalNode, grace: float = 20.0) -> None:
    """Stop the node's dockerd by its pidfile pid, then its containerd if dockerd left it behind."""
    pid = node.pid()
    if pid is not None:
        _terminate(pid, node.folder, grace)
    if node.process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=1.0)
    for pidfile in node.exec_root.glob("containerd/*.pid"):
        with contextlib.suppress(OSError, ValueError):
            _terminate(int(pidfile.read_text().strip()), node.folder, 5.0)


def _leave(node: LocalNode) -> None:
    """`swarm leave --force` on the node, if its dockerd still runs; a failure is ignored."""
    if node.pid() is not None:
        with contextlib.suppress(EndpointError):
            node.docker_sync("swarm", "leave", "--force", timeout=20.0)


def _teardown(nodes: list[LocalNode], base_dir: Path) -> None:
    """Leave, stop every node's processes, delete `docker_gwbridge`, unmount and remove `base_dir`.
    Each step runs on every node at once: a dockerd stopping waits for its containers (seconds each),
    and the nodes are independent; every node has left before any is stopped, as before."""
    _each_at_once(_leave, nodes)
    _each_at_once(_stop_node_processes, nodes)
    delete_gwbridge()
    unmount_under(base_dir)
    shutil.rmtree(base_dir, ignore_errors=True)


def _each_at_once(step: Callable[[LocalNode], None], nodes: list[LocalNode]) -> None:
    """`step` on every node in its own thread; returns when all are done. A step that raises does not
    stop the others (each step ignores its own expected failures; anything else is raised here after)."""
    if len(nodes) <= 1:
        for node in nodes:
            step(node)
        return
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="swarm-teardown") as pool:
        futures = [pool.submit(step, node) for node in nodes]
    for future in futures:
        future.result()


def teardown_folder(base_dir: Path) -> None:
    """Best-effort cleanup of a swarm folder whose owner is gone: every step runs, errors are ignored."""
    nodes = [LocalNode(p.name, "", p) for p in base_dir.iterdir() if p.is_dir()] if base_dir.is_dir() else []
    _teardown(nodes, base_dir)


def delete_gwbridge() -> None:
    """Delete the `docker_gwbridge` link swarm creates, if present."""
    if (
        subprocess.run(["ip", "link", "show", "docker_gwbridge"], capture_output=True, check=False).returncode
        == 0
    ):
        subprocess.run(["ip", "link", "delete", "docker_gwbridge"], capture_output=True, check=False)


class _MachineLock:
    """A machine-wide flock so only one local swarm runs at a time; records the owner's folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    async def acquire(self, base_dir: Path, timeout: float) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    owner = self._read(fd)  # before closing: reading a closed fd says nothing useful
                    os.close(fd)
                    raise ConfigurationError(
                        f"another local swarm holds {self.path} ({owner}): wait for it or stop it"
                    ) from None
                await asyncio.sleep(0.5)
        stale = self._read(fd)
        if stale and Path(stale) != base_dir:
            # The previous owner died without tearing down (killed): clean up after it.
            await asyncio.to_thread(teardown_folder, Path(stale))
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(base_dir).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def _read(fd: int) -> str:
        return os.pread(fd, 4096, 0).decode(errors="replace").strip()


class LocalSwarm:
    """A swarm of local dockerd nodes under `base_dir` (which this object owns and removes).

    Usage: `async with LocalSwarm(dir) as swarm: await swarm.start_manager("ip-10-0-0-1"); ...`.
    `start_manager` takes the machine lock, starts the first node and inits the swarm; `add_node`
    starts a dockerd without joining it; `add_workers` starts and joins several nodes concurrently.
    """

    def __init__(
        self,
        base_dir: Path | str,
        *,
        start_timeout: float = 60.0,
        first_address: int = 11,
        lock_path: Path = DEFAULT_LOCK,
        lock_timeout: float = 90.0,
        dispatcher_heartbeat: str | None = None,
    ) -> None:
        self.base_dir = Path(base_dir).absolute()
        self.start_timeout = start_timeout
        self.nodes: dict[str, LocalNode] = {}
        self._next_address = first_address
        self._lock = _MachineLock(lock_path)
        self._lock_timeout = lock_timeout
        self._manager: LocalNode | None = None
        self._worker_token = ""
        self._closed = False
        self._heartbeat = dispatcher_heartbeat
        self._made_run_docker = False

    # ------------------------------------------------------------------ what other components need

    @property
    def manager(self) -> LocalNode:
        if self._manager is None:
            raise ConfigurationError("the local swarm has no manager yet: call start_manager() first")
        return self._manager

    @property
    def manager_url(self) -> str:
        """The manager's docker socket URL (`unix://...`)."""
        return self.manager.docker_url

    @property
    def manager_addr(self) -> str:
        """The manager's swarm address, host:port, as `docker swarm join` wants it."""
        return self.manager.swarm_addr

    @property
    def worker_token(self) -> str:
        _ = self.manager
        return self._worker_token

    # ------------------------------------------------------------------ lifecycle

    async def start_manager(self, hostname: str) -> LocalNode:
        """Take the machine lock, start the first dockerd and `swarm init` on its own address."""
        if self._manager is not None:
            raise ConfigurationError(f"the local swarm already has manager {self._manager.hostname}")
        require_install()
        await self._lock.acquire(self.base_dir, self._lock_timeout)
        atexit.register(self.close_sync)
        self._prepare()
        node = await self.add_node(hostname)
        init = ["swarm", "init", "--advertise-addr", node.address, "--listen-addr", node.swarm_addr]
        if self._heartbeat:  # a short heartbeat makes the manager see a stopped node as down sooner
            init += ["--dispatcher-heartbeat", self._heartbeat]
        await node.docker(*init)
        self._worker_token = await node.docker("swarm", "join-token", "-q", "worker")
        self._manager = node
        return node

    async def add_node(
        self, hostname: str, *, address: str | None = None, machine_mounts: bool = False, folder: str = ""
    ) -> LocalNode:
        """Start a dockerd for `hostname` on the next loopback address (or `address`, a loopback one
        such as a machine's private IP in a VPC carved from 127.0.0.0/8) and wait until it answers.
        `machine_mounts`: see `MACHINE_MOUNTS`. `folder`: its folder's name (default: from the hostname;
        give one for a second node whose hostname has the same first label). The node is not joined: call
        `node.join(swarm.worker_token, swarm.manager_addr)`."""
        if self._closed:
            raise ConfigurationError("the local swarm is closed")
        if hostname in self.nodes:
            raise ConfigurationError(f"a local node named {hostname} already exists")
        if address is not None and not address.startswith("127."):
            raise ConfigurationError(f"a local node's address must be a loopback one, got {address}")
        if address is None:
            address = f"127.0.0.{self._next_address}"
            self._next_address += 1
        where = self.base_dir / folder if folder else self._folder_of(hostname)
        node = LocalNode(hostname, address, where, machine_mounts=machine_mounts)
        self.nodes[hostname] = node
        self._spawn(node)
        await node.wait_ready(self.start_timeout)
        return node

    def _folder_of(self, hostname: str) -> Path:
        """The node's folder, named by its hostname's first label: a full private DNS name
        (`ip-10-0-1-23.ec2.internal`, as Amazon Linux reports) would make containerd's socket paths
        longer than a unix socket may be (104 bytes). `<base>/<hostname>` links to it, so the services'
        `{{.Node.Hostname}}` folder template still finds it."""
        short = hostname.split(".", 1)[0]
        folder = self.base_dir / short
        if short != hostname:  # the link may point at the folder before it exists (the spawn makes it)
            self.base_dir.mkdir(parents=True, exist_ok=True)
            link = self.base_dir / hostname
            if not link.is_symlink():
                link.symlink_to(short)
        return folder

    async def add_workers(self, hostnames: list[str]) -> list[LocalNode]:
        """Start and join several worker nodes concurrently."""

        async def one(hostname: str) -> LocalNode:
            node = await self.add_node(hostname)
            await node.join(self.worker_token, self.manager_addr)
            return node

        return list(await asyncio.gather(*(one(h) for h in hostnames)))

    async def wait_nodes(self, hostnames: list[str], status: str = "ready", timeout: float = 60.0) -> None:
        """Wait until the manager lists every one of `hostnames` with this status (ready, down)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = await self.node_statuses()
            if all(seen.get(h) == status for h in hostnames):
                return
            if time.monotonic() > deadline:
                raise EndpointError(self.manager_url, f"nodes not {status} after {timeout:.0f}s: {seen}")
            await asyncio.sleep(0.25)

    async def node_statuses(self) -> dict[str, str]:
        """hostname -> status as the manager sees it (the last entry wins for a reused hostname)."""
        out = await self.manager.docker("node", "ls", "--format", "{{.Hostname}} {{.Status}}")
        pairs = (line.split(maxsplit=1) for line in out.splitlines() if line.strip())
        return {p[0]: p[1].lower() for p in pairs if len(p) == 2}

    async def stop_node(self, hostname: str) -> None:
        """Leave the swarm (forcibly), stop the dockerd and unmount what it left. The swarm entry of the
        node stays on the manager (as down) until it is removed there."""
        node = self.nodes.pop(hostname, None)
        if node is None:
            raise ConfigurationError(f"no local node named {hostname} (have {sorted(self.nodes)})")
        await asyncio.to_thread(self._stop_node_sync, node)

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Full teardown; idempotent, every step runs even when an earlier one fails."""
        if self._closed:
            return
        self._closed = True
        try:
            nodes = list(self.nodes.values())
            self.nodes.clear()
            _teardown(nodes, self.base_dir)
            if self._made_run_docker:  # dockerd makes /run/docker/plugins whatever its exec-root
                for empty in (RUN_DOCKER / "plugins", RUN_DOCKER):
                    with contextlib.suppress(OSError):
                        empty.rmdir()
        finally:
            self._lock.release()
            atexit.unregister(self.close_sync)

    async def __aenter__(self) -> LocalSwarm:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close_sync()

    # ------------------------------------------------------------------ steps

    def _prepare(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._made_run_docker = not RUN_DOCKER.exists()

    @staticmethod
    def _spawn(node: LocalNode) -> None:
        node.folder.mkdir(parents=True)
        # Never read /etc/docker/daemon.json, and keep the engine key (its ID) per node, not in /etc/docker.
        config = {"deprecated-key-path": str(node.folder / "key.json")}
        node.config_file.parent.mkdir()
        node.config_file.write_text(json.dumps(config) + "\n")
        # sh runs in the new UTS namespace: set the hostname there, then become dockerd (same pid).
        cmd = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', node.hostname]
        if node.machine_mounts:
            node.etc.mkdir(parents=True, exist_ok=True)
            Path("/etc/swarm-autoscaler").mkdir(parents=True, exist_ok=True)  # the mount point
            cmd = [
                "unshare", "--uts", "--mount", "--propagation", "private", "--",
                "sh", "-c", MACHINE_MOUNTS, node.hostname, str(node.etc),
            ]  # fmt: skip
        with node.log_path.open("wb") as log:
            node.process = subprocess.Popen(
                [*cmd, *node.dockerd_args()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_cli_env(),
                start_new_session=True,  # a Ctrl-C in the terminal goes to the tests, not to dockerd
            )

    @staticmethod
    def _stop_node_sync(node: LocalNode) -> None:
        _leave(node)
        _stop_node_processes(node)
        unmount_under(node.folder)
