"""Pieces of the EC2 adapter that need no client: error classes, the capacity back-off, user data,
and the translation of EC2's instance records into model values.

Kept apart from `ec2.py` so each can be read (and tested) on its own.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from botocore.exceptions import (
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.catalogue import VRAM
from swarm_autoscaler.core.model import Instance, InstanceState, InstanceType, PoolPhase, Resources
from swarm_autoscaler.errors import EndpointError

# ------------------------------------------------------------------------------------------ errors

# EC2 and the AWS SDKs name throttling in several ways; all mean "slow down and try again".
THROTTLING_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "EC2ThrottledException",
        "PriorRequestNotComplete",
    }
)
# Refusals for lack of capacity in one zone (or subnet): another subnet (zone) may have room (see
# `ec2_launch` for how a launch reads them). EC2 answers InsufficientInstanceCapacity with HTTP 500, so
# these must be excluded from the "5xx is transient" rule, or every refusal would be retried in place.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "ReservationCapacityExceeded",
        "UnfulfillableCapacity",
        "CapacityNotAvailable",
        "Unsupported",  # the type is not offered in this zone
    }
)
CREDENTIAL_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "OptInRequired",
        "ExpiredToken",
        "RequestExpired",
    }
)
GONE_CODES = frozenset({"InvalidInstanceID.NotFound"})
UNKNOWN_TYPE_CODES = frozenset({"InvalidInstanceType", "InvalidInstanceType.NotFound"})


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def error_message(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', '?')}: {error.get('Message', '')}"
    return str(exc)


def _http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying in place: throttling, 5xx other than capacity refusals, connection trouble."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code in THROTTLING_CODES:
            return True
        return code not in CAPACITY_CODES and _http_status(exc) >= 500
    return isinstance(exc, HTTPClientError | ConnectionError)


def is_capacity(exc: BaseException) -> bool:
    return error_code(exc) in CAPACITY_CODES


_NO_CREDENTIALS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)


def is_endpoint_failure(exc: BaseException) -> bool:
    """The endpoint is unreachable, keeps failing, or rejects (or never got) our credentials."""
    if isinstance(exc, ClientError):
        return error_code(exc) in CREDENTIAL_CODES or is_transient(exc)
    return isinstance(exc, _NO_CREDENTIALS) or is_transient(exc)


def to_endpoint_error(endpoint: str, operation: str, exc: BaseException) -> EndpointError:
    """Translate an SDK failure into EndpointError. Messages never carry the secret key: botocore's
    messages name the URL and the error only."""
    if isinstance(exc, _NO_CREDENTIALS):
        detail = "no usable AWS credentials: set the access key id and secret, or an instance role"
    elif isinstance(exc, ClientError) and error_code(exc) in CREDENTIAL_CODES:
        detail = f"credentials rejected ({error_message(exc)}): check the access key and its IAM policy"
    elif isinstance(exc, HTTPClientError | ConnectionError):
        detail = f"{operation} failed: cannot reach EC2 ({type(exc).__name__}: {exc}); check the endpoint"
    else:
        detail = f"{operation} failed: {error_message(exc)}"
    return EndpointError(endpoint, detail)


# ------------------------------------------------------------------------------------------ user data

USER_DATA_LIMIT = 16 * 1024  # EC2's limit on raw user data, before base64


# The last line of a warm-pool machine's first boot: the boot script has run (images pulled), so the
# machine stops itself (RunInstances sets InstanceInitiatedShutdownBehavior=stop). The machine
# emulator recognises it too.
POOL_STOP_LINE = "shutdown -h now"
_MIME_BOUNDARY = "==swarm-autoscaler=="


def _every_boot(script: str) -> str:
    """`script` as MIME multipart user data whose cloud-config makes cloud-init run it on every boot
    (user data scripts run once per instance by default): a pool machine's user data is rewritten
    before each start, and must run on that boot."""
    b = _MIME_BOUNDARY
    return (
        f'Content-Type: multipart/mixed; boundary="{b}"\nMIME-Version: 1.0\n\n'
        f'--{b}\nContent-Type: text/cloud-config; charset="us-ascii"\n\n'
        "#cloud-config\ncloud_final_modules:\n- [scripts-user, always]\n\n"
        f'--{b}\nContent-Type: text/x-shellscript; charset="us-ascii"\n\n{script}\n--{b}--\n'
    )


def render_pool_user_data(boot_script: str) -> str:
    """A warm-pool machine's first boot: the boot script, then stop (it never joins on that boot)."""
    script = boot_script.strip("\n")
    head = "" if script.startswith("#!") else "#!/bin/bash\nset -eu\n"
    body = f"{script}\n\n" if script else ""
    return _every_boot(
        f"{head}{body}# prepared for the warm pool: stop this machine (added by swarm-autoscaler)\n{POOL_STOP_LINE}\n"
    )


def join_line(token: str, manager_address: str, paused: bool = False) -> str:
    """The swarm join. `paused`: the node joins with availability pause, so swarm places nothing there
    until the daemon takes it in and sets it active (the dynamic mode: `Policy.join_paused`)."""
    flag = "--availability pause " if paused else ""
    return f"docker swarm join {flag}--token {shlex.quote(token)} {shlex.quote(manager_address)}"


def render_start_user_data(token: str, manager_address: str, paused: bool = False) -> str:
    """What a pool machine runs when started: leave the swarm it may have been in (its old node was
    removed when it was stopped), then join afresh. The boot script already ran on its first boot."""
    join = join_line(token, manager_address, paused)
    return _every_boot(
        "#!/bin/bash\nset -u\n# started from the warm pool: join the swarm (added by swarm-autoscaler)\n"
        f"docker swarm leave --force >/dev/null 2>&1 || true\n{join}\n"
    )


def render_user_data(boot_script: str, token: str, manager_address: str, paused: bool = False) -> str:
    """The configured boot script, then the swarm join (`join_line`). A script without a shebang runs
    under bash."""
    script = boot_script.strip("\n")
    head = "" if script.startswith("#!") else "#!/bin/bash\nset -eu\n"
    join = join_line(token, manager_address, paused)
    body = f"{script}\n\n" if script else ""
    return f"{head}{body}# join the swarm as a worker (added by swarm-autoscaler)\n{join}\n"


# ------------------------------------------------------------------------------------------ mapping


# Node labels travel as instance tags with this prefix; the planner gives them to the node once it joins.
LABEL_TAG_PREFIX = "swarm-autoscaler/label/"
# The instance's hostname, tagged right after launch: EC2 drops a terminated instance's private DNS name,
# and the daemon still needs it to recognise that machine's swarm node.
HOSTNAME_TAG = "swarm-autoscaler/hostname"
# The warm pool phase (`PoolPhase`) and, after a start, the start time (epoch seconds): EC2's LaunchTime is
# the last start on AWS, not on every EC2-compatible server, so the adapter keeps it itself.
POOL_TAG = "swarm-autoscaler/pool"
STARTED_AT_TAG = "swarm-autoscaler/started-at"
# "spot" on a machine launched as spot: EC2 reports InstanceLifecycle too, but not every endpoint does
CAPACITY_TAG = "swarm-autoscaler/capacity"
# When EC2 gave notice that it takes the machine back (epoch seconds; see `ec2_interruptions`): a notice
# is read from the queue once, so it is kept where the daemon's restart finds it.
INTERRUPTED_TAG = "swarm-autoscaler/interrupted-at"
# When EC2 recommended rebalancing the machine (a spot machine at raised risk): advice, kept apart.
REBALANCE_TAG = "swarm-autoscaler/rebalance-at"


def node_labels(tags: Mapping[str, str]) -> dict[str, str]:
    """The node labels carried in an instance's tags (the reverse of what `launch` writes)."""
    return {k[len(LABEL_TAG_PREFIX) :]: v for k, v in tags.items() if k.startswith(LABEL_TAG_PREFIX)}


def to_instance(raw: Mapping[str, Any]) -> Instance | None:
    try:
        state = InstanceState(raw["State"]["Name"])
    except ValueError:
        return None  # a state this daemon does not know
    tags = {t["Key"]: t["Value"] for t in raw.get("Tags", ())}
    return Instance(
        id=raw["InstanceId"],
        type_name=raw["InstanceType"],
        state=state,
        launched_at=max(raw["LaunchTime"].timestamp(), _number(tags.get(STARTED_AT_TAG))),
        hostname=machine_hostname(raw.get("PrivateDnsName") or tags.get(HOSTNAME_TAG, "")),
        zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
        subnet_id=raw.get("SubnetId", ""),
        tags=tags,
        labels=node_labels(tags),
        pool=_pool_phase(tags.get(POOL_TAG)),
        spot=raw.get("InstanceLifecycle") == "spot" or tags.get(CAPACITY_TAG) == "spot",
        interrupted_at=_number(tags.get(INTERRUPTED_TAG)) or None,
        rebalance_at=_number(tags.get(REBALANCE_TAG)) or None,
    )


def _number(text: str | None) -> float:
    try:
        return float(text) if text else 0.0
    except ValueError:
        return 0.0


def _pool_phase(text: str | None) -> PoolPhase | None:
    try:
        return PoolPhase(text) if text else None
    except ValueError:
        return None  # a phase this daemon does not know: treated as a machine launched to work


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def to_instance_type(raw: Mapping[str, Any], price_per_hour: float | None) -> InstanceType:
    """An InstanceType from one DescribeInstanceTypes record (memory in MiB there, bytes here); the GPUs'
    memory, when the type has GPUs, becomes the `VRAM` resource (bytes, all GPUs together)."""
    gpu_info = raw.get("GpuInfo", {})
    gpus = sum(g.get("Count", 0) for g in gpu_info.get("Gpus", ()))
    vram_mib = gpu_info.get("TotalGpuMemoryInMiB") or sum(
        g.get("Count", 0) * g.get("MemoryInfo", {}).get("SizeInMiB", 0) for g in gpu_info.get("Gpus", ())
    )
    resources = Resources.of(
        float(raw["VCpuInfo"]["DefaultVCpus"]),
        int(raw["MemoryInfo"]["SizeInMiB"]) * 1024**2,
        gpus,
        **({VRAM: float(int(vram_mib) * 1024**2)} if vram_mib else {}),
    )
    return InstanceType(raw["InstanceType"], resources, price_per_hour)
