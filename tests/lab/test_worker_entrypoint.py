"""docker/worker-entrypoint.sh, the worker service's entrypoint in any image (a team's own included), run
by dash as the container would, with a `python3` stand-in that prints the command it was given: it reads
the worker.env the daemon renders and starts the same `dask worker` command line as the Python
entrypoint, memory limit included; it refuses to start without the file. The real image runs it in the
e2e suite (the team worker image, docker/worker.Dockerfile)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from swarm_autoscaler.config.types import AllowedType, Overhead
from swarm_autoscaler.config.worker import with_worker_env
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler.runtime.worker import read_env_file, worker_argv

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "worker-entrypoint.sh"
# prints its argv, one per line; answers the entrypoint's version question as Python 3.11 would
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = -c ]; then echo True; exit 0; fi
echo "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=${DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED:-}"
for a in "$@"; do echo "$a"; done
"""


def _worker_env(tmp_path: Path) -> Path:
    spec = AllowedType(ami_id="ami-12345678", overhead=Overhead(cpus=0.5, ram_gib=1.0), boot_script="")
    script = with_worker_env({"m5.xlarge": spec}, CATALOGUE)["m5.xlarge"]
    body = script.split("<<'SWARM_AUTOSCALER_EOF'\n", 1)[1].split("SWARM_AUTOSCALER_EOF", 1)[0]
    path = tmp_path / "worker.env"
    path.write_text(body)
    return path


def _run(tmp_path: Path, env_file: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": str(python),
        "SWARM_AUTOSCALER_WORKER_ENV": str(env_file),
        "DASK_SCHEDULER_ADDRESS": "tcp://10.0.0.1:8786",
        "DASK_WORKER_NAME": "ip-10-0-1-23.eu-west-1.compute.internal",
        **extra,
    }
    return subprocess.run(
        ["dash", str(ENTRYPOINT), "--worker-port", "9000"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_the_shell_entrypoint_starts_what_the_python_one_does(tmp_path: Path) -> None:
    env_file = _worker_env(tmp_path)
    done = _run(tmp_path, env_file, DASK_WORKER_HOST="10.0.1.23")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("starting: dask worker tcp://10.0.0.1:8786 --name ip-10-0-1-23")
    assert lines[1] == "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False"  # Python 3.11: off
    argv = lines[lines.index("-m") :]
    assert argv[:2] == ["-m", "distributed.cli.dask_worker"]
    expected = worker_argv(
        read_env_file(env_file),
        {
            "DASK_SCHEDULER_ADDRESS": "tcp://10.0.0.1:8786",
            "DASK_WORKER_NAME": "ip-10-0-1-23.eu-west-1.compute.internal",
            "DASK_WORKER_HOST": "10.0.1.23",
        },
        ["--worker-port", "9000"],
    )
    assert argv[2:] == expected[2:]  # the Python entrypoint's `dask worker` line, word for word
    assert argv[argv.index("--memory-limit") + 1] == str(15 * GIB)  # the RAM it publishes


def test_the_shell_entrypoint_refuses_to_start_without_worker_env(tmp_path: Path) -> None:
    done = _run(tmp_path, tmp_path / "missing.env")
    assert done.returncode == 1 and "was not launched by swarm-autoscaler" in done.stderr
