"""What a machine tells its dask worker: the worker env file its user data writes.

The daemon renders, for each allowed type, a few shell lines that go first in that type's user data
(before the operator's boot script and the swarm join). They write `/etc/swarm-autoscaler/worker.env` on
the machine: the instance type and the resources a worker there publishes, the type's catalogue figures
minus its configured overhead, with `RAM` in bytes and the type's pin `instance-type:<type>=1e9`. The
worker global service (`docker/worker-stack.yml`) mounts that folder read-only, and its entrypoint
(`docker/worker-entrypoint.sh`, or `python -m swarm_autoscaler.runtime.worker`) starts `dask worker` with
those resources and a memory limit of the RAM it publishes, named after the node's hostname so that
`AUTOSCALER_DASK_WORKER_HOSTNAME_PATTERN` finds the machine.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from swarm_autoscaler.config.gpus import gpu_dockerd_script
from swarm_autoscaler.config.types import AllowedType
from swarm_autoscaler.core.model import InstanceType

WORKER_ENV_DIR = "/etc/swarm-autoscaler"
WORKER_ENV_FILE = f"{WORKER_ENV_DIR}/worker.env"
PIN_PREFIX = "instance-type:"  # the dask adapter's pin convention (`adapters.dask.PIN_PREFIX`)
PIN_AMOUNT = 1e9  # so any number of tasks pinned to the type fit on one worker


def worker_resources(
    itype: InstanceType, allowed: AllowedType, memory_percent: float = 0.0
) -> dict[str, float]:
    """The resources a worker on a machine of this type publishes: the catalogue's minus the overhead
    (its RAM minus `memory_percent` of it too: `AUTOSCALER_EC2_MEMORY_OVERHEAD_PERCENT`, as the policy
    counts it, `config.policy`)."""
    res = itype.resources
    over = allowed.overhead
    out: dict[str, float] = {
        "CPU": max(0.0, res.cpus - over.cpus),
        "RAM": float(max(0, res.ram - over.ram_bytes(res.ram, memory_percent))),
    }
    gpus = max(0, res.gpus - over.gpus)
    if gpus:
        out["GPU"] = float(gpus)
    out.update(dict(res.generic))
    out[f"{PIN_PREFIX}{itype.name}"] = PIN_AMOUNT
    return out


def _amount(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)  # exact: RAM is bytes


def worker_env(itype: InstanceType, allowed: AllowedType, memory_percent: float = 0.0) -> dict[str, str]:
    """The worker env file's variables for a machine of this type."""
    resources = worker_resources(itype, allowed, memory_percent)
    return {
        "SWARM_AUTOSCALER_INSTANCE_TYPE": itype.name,
        "SWARM_AUTOSCALER_WORKER_NTHREADS": str(max(1, int(resources["CPU"]))),
        "SWARM_AUTOSCALER_WORKER_RESOURCES": " ".join(f"{k}={_amount(v)}" for k, v in resources.items()),
        # dask's memory limit = the RAM it publishes: the worker spills, pauses and is restarted by its
        # nanny's rules before a task sized to the type takes the machine (and its dockerd) down
        "SWARM_AUTOSCALER_WORKER_MEMORY_LIMIT": _amount(resources["RAM"]),
    }


def worker_env_script(itype: InstanceType, allowed: AllowedType, memory_percent: float = 0.0) -> str:
    """Shell lines that write the worker env file (the first lines of the type's user data)."""
    env = worker_env(itype, allowed, memory_percent)
    lines = "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())
    return (
        "# the dask worker's resources on this machine (added by swarm-autoscaler)\n"
        f"mkdir -p {WORKER_ENV_DIR}\n"
        f"cat > {WORKER_ENV_FILE} <<'SWARM_AUTOSCALER_EOF'\n{lines}SWARM_AUTOSCALER_EOF\n"
    )


def with_worker_env(
    allowed_types: Mapping[str, AllowedType],
    catalogue: Mapping[str, InstanceType],
    memory_percent: float = 0.0,
) -> dict[str, str]:
    """Each allowed type's boot script with the worker env lines first (a type missing from the catalogue
    keeps its script: the policy refuses it anyway)."""
    out = {}
    for name, spec in allowed_types.items():
        known = catalogue.get(name)
        head = ""
        if known is not None:  # a GPU type's machine also gives its GPUs to dockerd (config.gpus)
            gpus = gpu_dockerd_script(known.resources.gpus - spec.overhead.gpus)
            head = worker_env_script(known, spec, memory_percent) + gpus
        script = spec.boot_script.strip("\n")
        if script.startswith("#!"):  # keep the operator's interpreter line first
            first, _, rest = script.partition("\n")
            out[name] = f"{first}\n{head}{rest}"
        else:
            out[name] = f"{head}{script}"
    return out
