"""Boot a local dockerd node from an instance's real user data, as EC2 and cloud-init would.

The real-dockerd path of the local cloud (`--swarm`, the e2e suite) uses this instead of the emulator's
shortcut (read the join line, join, start a dask worker in-process): the user data the daemon (or the
keeper) gave the instance is decoded as cloud-init decodes it and run by bash inside the node's own
namespaces, with `DOCKER_HOST` pointing at the node's dockerd. So the `docker swarm join` (or `init`) in it
is the one that makes the node, and whatever runs on the node afterwards is what swarm starts there.

API (for the machine emulator and for the keeper's primaries):
- `user_data_scripts(raw)`: the scripts cloud-init would run, from the user data as EC2 returns it
  (base64) or as text; a `#!` script, or MIME multipart (each `text/x-shellscript` part; `text/cloud-config`
  parts are read for nothing and skipped). Text that is neither is skipped, as cloud-init does.
- `await run_user_data(node, raw)`: run those scripts on `node` (a started `LocalNode`); returns a
  `UserDataRun` (exit code, output, whether the script asked to power off).

What stands in for a real machine (and what does not run here):
- Namespaces: the script runs under `nsenter` into the UTS namespace of the node's dockerd (so `hostname`
  is the node's) and in a private mount namespace (`unshare --mount`) where `/etc/swarm-autoscaler` is the
  node's own folder (`node_etc(node)`), so files the user data writes there are per machine, and dockerd sees
  them at that folder (a service mounts `{{.Node.Hostname}}`'s folder: see docs/worker-service.md). The
  network namespace is the host's: every node is a loopback address (LOCAL-SWARM rules).
- `docker`: a shim first on PATH runs the node's docker CLI and adds `--advertise-addr`/`--listen-addr`
  with the node's loopback address to `swarm join` and `swarm init` (an EC2 machine has one private
  address, so the real command needs none).
- `UserDataBoot(machine_mounts=True)`: the node's dockerd itself sees the node's folder at
  `/etc/swarm-autoscaler` and has its own `/var/run/docker.sock` (`dockerd.MACHINE_MOUNTS`), so user
  data written for a real machine (the keeper's default primary boot script) runs unchanged.
  A machine whose private IP (in its hostname) is a loopback one advertises it (`machine_addresses=True`:
  it must); with `metadata`, its boot reads that IP from a stand-in for the instance metadata service
  (`localcloud.metadata`), and a join ticket's `curl --interface` sends from it.
- `service_env`: the shim adds these variables to every `docker service create` and `docker run` of the
  user data: what every container of an EC2 machine reaches without being told (the keeper's e2e test
  gives the instance metadata service's address, moto's, where EC2 has 169.254.169.254).
- `shutdown`, `poweroff`, `halt`, `reboot`: shims that only record the request (`UserDataRun.powered_off`);
  the caller stops the instance in EC2, as InstanceInitiatedShutdownBehavior=stop would.
- `/etc/docker` is the node's own folder (its dockerd's `--config-file` is `daemon.json` there), and
  `systemctl restart docker` is a shim that restarts the node's dockerd with the same flags (in the
  script's namespaces; not for `machine_mounts` nodes), so a boot script that writes `daemon.json` and
  restarts dockerd (a GPU machine's, `config.gpus`) runs unchanged.
- `fake_gpus=N` (`UserDataBoot`): an `nvidia-smi` shim lists N GPUs with fake uuids (`GPU-<host>-<i>`)
  and an `nvidia-container-runtime` shim runs `runc`: what the NVIDIA driver and Container Toolkit of a
  GPU AMI give a boot script. No GPU is behind them; swarm's generic resources and placement are real.
- Images: no registry here, so `preload` loads image tarballs into the node first (a real AMI has them
  baked in, or pulls them from a registry).
- The script runs as root on this machine's file system (outside `/etc/swarm-autoscaler`): test boot scripts
  must be harmless here. cloud-init itself (modules, per-boot semantics, logs) does not run.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import email
import email.policy
import ipaddress
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler_lab.localcloud.dockerd import LocalNode, LocalSwarm, _cli_env, _docker_cli
from swarm_autoscaler_lab.localcloud.image import IMAGE, ROOT
from swarm_autoscaler_lab.localcloud.metadata import MetadataService

ETC = Path("/etc/swarm-autoscaler")
ETC_DOCKER = Path("/etc/docker")
_POWER = ("shutdown", "poweroff", "halt", "reboot")


def _as_text(raw: str | bytes) -> str:
    data = raw.encode() if isinstance(raw, str) else raw
    stripped = data.strip()
    if stripped and not stripped.startswith((b"#", b"Content-Type", b"MIME-Version")):
        with contextlib.suppress(binascii.Error, ValueError):
            data = base64.b64decode(stripped, validate=True)
    return data.decode(errors="replace")


def user_data_scripts(raw: str | bytes) -> list[str]:
    """The shell scripts cloud-init would run for this user data, in order (see the module docstring)."""
    text = _as_text(raw)
    if text.lstrip().startswith(("Content-Type:", "MIME-Version:")):
        message = email.message_from_string(text, policy=email.policy.default)
        scripts = []
        for part in message.walk():
            if part.get_content_type() == "text/x-shellscript":
                body = part.get_payload(decode=True)
                scripts.append(body.decode(errors="replace") if isinstance(body, bytes) else str(body))
        return scripts
    return [text] if text.startswith("#!") else []


def node_etc(node: LocalNode) -> Path:
    """The node's own `/etc/swarm-autoscaler` (its user data writes there; services mount it from here)."""
    return node.etc


@dataclass(frozen=True, slots=True)
class UserDataRun:
    returncode: int
    output: str
    powered_off: bool  # the script ran shutdown/poweroff: the caller stops (or terminates) the instance


def _systemctl(node: LocalNode) -> str:
    """`systemctl restart docker` on a machine: stop the node's dockerd (by its pidfile, gone once it
    exited), start it again with the same flags, wait until it answers. Anything else is ignored."""
    pidfile = shlex.quote(str(node.pidfile))
    args = " ".join(shlex.quote(a) for a in node.dockerd_args())
    return (
        "#!/bin/bash\n# stand-in for systemd's docker.service on this machine (the node's dockerd)\n"
        'case "$1 ${2%.service}" in "restart docker") ;; *) echo "systemctl $* ignored here"; exit 0;; esac\n'
        f"pid=$(cat {pidfile} 2>/dev/null || true)\n"
        f'if [ -n "$pid" ]; then kill -TERM "$pid"; n=0; while [ -e {pidfile} ] && [ "$n" -lt 600 ]; do '
        "n=$((n + 1)); sleep 0.1; done; fi\n"
        f"setsid {args} >> {shlex.quote(str(node.log_path))} 2>&1 < /dev/null &\n"
        'n=0; until docker info >/dev/null 2>&1; do n=$((n + 1)); [ "$n" -lt 600 ] || exit 1; sleep 0.1; done\n'
    )


def _shims(node: LocalNode, service_env: Mapping[str, str], fake_gpus: int = 0) -> Path:
    bin_dir = node.folder / "userdata-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    docker = bin_dir / "docker"
    envs = " ".join(shlex.quote(f"--env={k}={v}") for k, v in service_env.items())
    docker.write_text(
        "#!/bin/bash\n"
        "# stand-in for an EC2 machine's single address: swarm join/init advertise the node's loopback address\n"
        'if [ "${1:-}" = swarm ] && { [ "${2:-}" = join ] || [ "${2:-}" = init ]; }; then\n'
        "  sub=$2; shift 2\n"
        f'  exec {_docker_cli()} swarm "$sub" --advertise-addr {node.address} '
        f'--listen-addr {node.swarm_addr} "$@"\n'
        "fi\n"
        + (
            "# stand-in for what every container of an EC2 machine reaches (its metadata service)\n"
            'if [ "${1:-}" = service ] && [ "${2:-}" = create ]; then\n'
            f'  shift 2; exec {_docker_cli()} service create {envs} "$@"\n'
            "fi\n"
            'if [ "${1:-}" = run ]; then\n'
            f'  shift; exec {_docker_cli()} run {envs} "$@"\n'
            "fi\n"
            if service_env
            else ""
        )
        + f'exec {_docker_cli()} "$@"\n'
    )
    for name in _POWER:
        (bin_dir / name).write_text(f'#!/bin/bash\necho "$0 $*" >> {node.folder / "powered-off"}\n')
    (bin_dir / "systemctl").write_text(_systemctl(node))
    for fake in ("nvidia-smi", "nvidia-container-runtime"):
        (bin_dir / fake).unlink(missing_ok=True)
    if fake_gpus:
        short = node.hostname.split(".", 1)[0]
        uuids = "".join(f"echo GPU-{short}-{i}\n" for i in range(fake_gpus))
        (bin_dir / "nvidia-smi").write_text(
            f"#!/bin/bash\n# a GPU AMI's driver, faked: {fake_gpus} GPUs\n{uuids}"
        )
        (bin_dir / "nvidia-container-runtime").write_text('#!/bin/bash\nexec runc "$@"\n')
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir


def _run_sync(
    node: LocalNode,
    scripts: Sequence[str],
    env: Mapping[str, str],
    timeout: float,
    service_env: Mapping[str, str],
    fake_gpus: int = 0,
) -> UserDataRun:
    pid = node.pid()
    if pid is None:
        raise EndpointError(f"dockerd {node.hostname}", "the node's dockerd is not running")
    bin_dir = _shims(node, service_env, fake_gpus)
    etc = node_etc(node)
    etc.mkdir(parents=True, exist_ok=True)
    ETC.mkdir(parents=True, exist_ok=True)  # the mount point (empty on this machine; bound per node)
    ETC_DOCKER.mkdir(parents=True, exist_ok=True)  # docker.io makes it; bound per node, never written
    marker = node.folder / "powered-off"
    marker.unlink(missing_ok=True)
    full_env = {
        **_cli_env(),
        **env,
        "DOCKER_HOST": node.docker_url,
        "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
    }
    outputs: list[str] = []
    code = 0
    for index, script in enumerate(scripts):
        path = node.folder / f"user-data-{index}.sh"
        path.write_text(script)
        path.chmod(0o700)
        cmd = [
            "nsenter", f"--target={pid}", "--uts", "--",
            "unshare", "--mount", "--propagation", "private", "--",
            "bash", "-c", f'mount --bind "$1" {ETC} && mount --bind "$3" {ETC_DOCKER} && exec "$2"',
            "user-data", str(etc), str(path), str(node.config_file.parent),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, env=full_env, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise EndpointError(f"dockerd {node.hostname}", f"user data ran over {timeout}s") from exc
        outputs.append(done.stdout + done.stderr)
        code = done.returncode
        if code != 0:
            break
    return UserDataRun(code, "".join(outputs), marker.exists())


async def run_user_data(
    node: LocalNode,
    raw: str | bytes,
    *,
    env: Mapping[str, str] | None = None,
    preload: Sequence[Path] = (),
    timeout: float = 300.0,
    service_env: Mapping[str, str] | None = None,
    fake_gpus: int = 0,
) -> UserDataRun:
    """Run `raw` (user data, base64 or text) on `node` as its machine's first boot would.

    `preload`: image tarballs `docker load`ed into the node first (the AMI's images). `env`: extra
    environment for the scripts. `service_env`: environment the docker shim adds to every `docker
    service create` and `docker run` of the scripts (what an EC2 machine's containers reach without being
    told, such as the metadata service: `AWS_EC2_METADATA_SERVICE_ENDPOINT`). Blocking work runs in a
    thread."""
    for tarball in preload:
        await node.docker("load", "-i", str(tarball), timeout=300)
    scripts = user_data_scripts(raw)
    return await asyncio.to_thread(
        _run_sync, node, scripts, dict(env or {}), timeout, dict(service_env or {}), fake_gpus
    )


def address_of(hostname: str) -> str | None:
    """The private IP in an EC2 hostname (`ip-127-5-0-4` or `ip-127-5-0-4.ec2.internal` -> `127.5.0.4`),
    if it is a loopback one."""
    label = hostname.split(".", 1)[0]
    if not label.startswith("ip-"):
        return None
    try:
        ip = ipaddress.IPv4Address(label[3:].replace("-", "."))
    except ValueError:
        return None
    return str(ip) if ip.is_loopback else None


class UserDataBoot:
    """The machine emulator's real boot (`MachineEmulator.user_data_boot`): a machine that boots becomes a
    new dockerd node of `swarm` named after its hostname, and runs its user data there."""

    def __init__(
        self,
        swarm: LocalSwarm,
        preload: Sequence[Path] = (),
        timeout: float = 300.0,
        *,
        machine_addresses: bool = False,
        machine_mounts: bool = False,
        service_env: Mapping[str, str] | None = None,
        fake_gpus: int = 0,
        metadata: MetadataService | None = None,
    ) -> None:
        """A node advertises its machine's private IP, read from its hostname, whenever that is a
        loopback one (a VPC carved from 127.0.0.0/8, as the local clouds' are), else the swarm's next
        loopback address; `machine_addresses`: it must (a machine without one does not boot).
        `metadata`: each boot reads its private IP from this stand-in for the instance metadata service
        (`AWS_EC2_METADATA_SERVICE_ENDPOINT` in the boot's environment: `localcloud.metadata`). `machine_mounts`: the node's dockerd sees the machine's own
        `/etc/swarm-autoscaler` and `/var/run/docker.sock` (`dockerd.MACHINE_MOUNTS`). `service_env`:
        see `run_user_data`. `fake_gpus`: every machine has that many fake GPUs (module doc); only a GPU
        type's user data asks for them."""
        self.swarm = swarm
        self.preload = tuple(preload)
        self.timeout = timeout
        self.machine_addresses = machine_addresses
        self.machine_mounts = machine_mounts
        self.service_env = dict(service_env or {})
        self.fake_gpus = fake_gpus
        self.metadata = metadata

    async def boot(self, hostname: str, raw: str | bytes) -> UserDataRun:
        node = self.swarm.nodes.get(hostname)
        preload: Sequence[Path] = ()
        if node is None:
            address = address_of(hostname)
            if self.machine_addresses and address is None:
                raise EndpointError(f"dockerd {hostname}", "no loopback private IP in the hostname")
            node = await self.swarm.add_node(hostname, address=address, machine_mounts=self.machine_mounts)
            preload = self.preload
        env = {}
        if self.metadata is not None:
            env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = self.metadata.endpoint(hostname)
        return await run_user_data(
            node,
            raw,
            env=env,
            preload=preload,
            timeout=self.timeout,
            service_env=self.service_env,
            fake_gpus=self.fake_gpus,
        )


WORKER_STACK = "dask"  # the worker global service is `<stack>_worker`


def deploy_worker_stack(
    swarm: LocalSwarm,
    *,
    cluster_name: str,
    scheduler_address: str,
    image: str = IMAGE,
    stack: str = WORKER_STACK,
    cli_env: Mapping[str, str] | None = None,
) -> None:
    """`docker stack deploy` of docker/worker-stack.yml on `swarm`'s manager: the dask worker as a global
    service on the nodes labelled ours, each task mounting its own node's `/etc/swarm-autoscaler` (node
    folders are `<base>/<hostname>`: `node_etc`), where its user data wrote the worker env file. Deployed
    `--with-registry-auth`, as docs/worker-service.md says: with `cli_env` logged in to a registry
    (`LocalRegistry.cli_env`), swarm hands those credentials to every node that pulls `image`. Blocking."""
    env = {
        **(cli_env or _cli_env()),
        "DOCKER_HOST": swarm.manager_url,
        "WORKER_IMAGE": image,
        "AUTOSCALER_CLUSTER_NAME": cluster_name,
        "DASK_SCHEDULER_ADDRESS": scheduler_address,
        "WORKER_ENV_DIR": f"{swarm.base_dir}/{{{{.Node.Hostname}}}}/etc-swarm-autoscaler",
    }
    compose = str(ROOT / "docker" / "worker-stack.yml")
    cmd = [_docker_cli(), "stack", "deploy", "--with-registry-auth", "-c", compose, stack]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    if done.returncode != 0:
        raise EndpointError(
            f"dockerd {swarm.manager_url}", f"docker stack deploy {stack}: {done.stderr.strip()}"
        )


def node_swarm_state(node: LocalNode) -> str:
    """`inactive`, `pending`, `active`, ... as the node's dockerd reports it."""
    return node.docker_sync("info", "-f", "{{.Swarm.LocalNodeState}}").strip()


__all__ = [
    "ETC",
    "WORKER_STACK",
    "UserDataBoot",
    "UserDataRun",
    "address_of",
    "deploy_worker_stack",
    "node_etc",
    "node_swarm_state",
    "run_user_data",
    "user_data_scripts",
]
