"""A real local docker swarm for the swarm adapter tests: a manager and two workers, one per session.

Needs root and dockerd (`bash scripts/ensure-services.sh` installs docker.io). When not root the
tests are skipped (the skips show in the summary); as root with dockerd missing they fail, saying so.
The teardown always runs, then checks that the machine is as it was: no dockerd or containerd of this
swarm left, no docker_gwbridge, no mounts under the swarm folder, the iptables FORWARD policy unchanged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from swarm_autoscaler_lab.localcloud.dockerd import LocalSwarm, check_install

MANAGER = "ip-10-0-0-1"  # test_swarm_adapter.py names the same nodes
WORKERS = ("ip-10-0-0-2", "ip-10-0-0-3")


def forward_policy() -> str | None:
    """The iptables FORWARD chain policy line (None when iptables is not installed)."""
    if shutil.which("iptables") is None:
        return None
    done = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=False)
    return next((line for line in done.stdout.splitlines() if line.startswith("-P ")), done.stderr.strip())


def leftovers(folder: Path, policy_before: str | None) -> list[str]:
    """Everything a torn-down swarm under `folder` must not leave behind."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if str(folder).encode() in cmdline:
                found.append(f"process {proc.name}: " + cmdline.replace(b"\0", b" ").decode())
    if (
        subprocess.run(["ip", "link", "show", "docker_gwbridge"], capture_output=True, check=False).returncode
        == 0
    ):
        found.append("docker_gwbridge still exists")
    found += [
        f"mount {line}" for line in Path("/proc/self/mounts").read_text().splitlines() if str(folder) in line
    ]
    if folder.exists():
        found.append(f"{folder} still exists")
    if forward_policy() != policy_before:
        found.append(f"iptables FORWARD policy changed: {policy_before} -> {forward_policy()}")
    return found


def require_swarm_support() -> None:
    if os.geteuid() != 0:
        pytest.skip("the local swarm needs root (dockerd, unshare, mounts): run the tests as root")
    problems = check_install()
    if problems:
        pytest.fail(
            "cannot run the swarm tests: " + "; ".join(problems) + ". Run `bash scripts/ensure-services.sh`."
        )


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def local_swarm(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSwarm]:
    require_swarm_support()
    policy_before = forward_policy()
    folder = tmp_path_factory.mktemp("swarm") / "s"  # short: unix socket paths are limited to 107 bytes
    swarm = LocalSwarm(folder, dispatcher_heartbeat="1s")
    try:
        await swarm.start_manager(MANAGER)
        await swarm.add_workers(list(WORKERS))
        await swarm.wait_nodes([MANAGER, *WORKERS])
        yield swarm
    finally:
        await swarm.close()
        left = leftovers(folder, policy_before)
    assert not left, f"the local swarm teardown left: {left}"
