"""The dask worker's entrypoint in the worker global service (`docker/worker-stack.yml`).

`python -m swarm_autoscaler.runtime.worker [extra dask worker options]` reads the env file the machine's
user data wrote (`/etc/swarm-autoscaler/worker.env`, mounted read-only; override with
`SWARM_AUTOSCALER_WORKER_ENV`) and replaces itself with

    dask worker $DASK_SCHEDULER_ADDRESS --name $DASK_WORKER_NAME --nthreads N --resources "CPU=.. RAM=.. ..."

`DASK_SCHEDULER_ADDRESS` comes from the service; `DASK_WORKER_NAME` is the node's hostname (the service
sets it from `{{.Node.Hostname}}`; the container's own hostname otherwise). Without the env file the
worker refuses to start: a machine not launched by the daemon never runs an unpinned worker.

On Python 3.11 (the image's) the worker's statistical profiler is off (`worker_environ` sets `PROFILER_VARIABLE`): it calls
`sys._current_frames()` every 10 ms, and on 3.11 that call can deadlock the whole process when a garbage
collection starts inside it (CPython gh-106883, dask/distributed#8616; not fixed in 3.11). A worker that
deadlocks holds its tasks forever and never answers a retirement, so its node is never let go. Set
`DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED` in the service to decide otherwise.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_ENV = "/etc/swarm-autoscaler/worker.env"
# dask's setting for the worker's profiler, as an environment variable
PROFILER_VARIABLE = "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"


def profiler_is_unsafe(version: tuple[int, int] | None = None) -> bool:
    """Whether dask's worker profiler can deadlock this interpreter (CPython 3.11: see the module)."""
    return (version or (sys.version_info.major, sys.version_info.minor)) == (3, 11)


def worker_environ(environ: Mapping[str, str], version: tuple[int, int] | None = None) -> dict[str, str]:
    """The worker process's environment: `environ`, with the profiler off where it can deadlock (unless
    the service sets the variable itself)."""
    out = dict(environ)
    if profiler_is_unsafe(version):
        out.setdefault(PROFILER_VARIABLE, "False")
    return out


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines (values shell-quoted, as the user data writes them); comments and blanks skipped."""
    return parse_env(path.read_text())


def parse_env(text: str) -> dict[str, str]:
    """The env file's variables from its text (`read_env_file`)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        words = shlex.split(value)
        out[key.strip()] = words[0] if words else ""
    return out


def worker_argv(env_file: Mapping[str, str], environ: Mapping[str, str], extra: Sequence[str]) -> list[str]:
    """The `dask worker` command line for this machine."""
    scheduler = environ.get("DASK_SCHEDULER_ADDRESS", "")
    if not scheduler:
        raise SystemExit("DASK_SCHEDULER_ADDRESS is not set (the worker service sets it)")
    name = environ.get("DASK_WORKER_NAME") or socket.gethostname()
    host = environ.get("DASK_WORKER_HOST", "")
    return [
        "dask", "worker", scheduler, "--name", name,
        "--nthreads", env_file.get("SWARM_AUTOSCALER_WORKER_NTHREADS", "1"), "--nworkers", "1",
        "--resources", env_file["SWARM_AUTOSCALER_WORKER_RESOURCES"],
        "--memory-limit", env_file.get("SWARM_AUTOSCALER_WORKER_MEMORY_LIMIT", "0"), "--no-dashboard", *(["--host", host] if host else []), *extra,
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    path = Path(os.environ.get("SWARM_AUTOSCALER_WORKER_ENV", DEFAULT_ENV))
    if not path.is_file():
        raise SystemExit(f"{path} is missing: this machine was not launched by swarm-autoscaler")
    args = worker_argv(read_env_file(path), os.environ, list(sys.argv[1:] if argv is None else argv))
    environ = worker_environ(os.environ)
    print(
        "starting:",
        shlex.join(args),
        f"({PROFILER_VARIABLE}={environ.get(PROFILER_VARIABLE, '')})",
        flush=True,
    )
    os.execvpe(args[0], args, environ)


if __name__ == "__main__":
    main()
