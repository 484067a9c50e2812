"""Pieces of the EC2 adapter that need no client: error classes, the capacity back-off, user data,
and the translation of EC2's instance records into model values.

Kept apart from `ec2.py` so each can be read (and tested) on its own.
"""

from __future__ import annotations

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

from swarm_autoscaler.adapters import boot_scripts
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


# The boot scripts (`boot_scripts`), where the EC2 adapter and its tests have always found them.
USER_DATA_LIMIT = boot_scripts.USER_DATA_LIMIT
POOL_STOP_LINE = boot_scripts.POOL_STOP_LINE
BOOT_FAILED_LINE = boot_scripts.BOOT_FAILED_LINE
join_line = boot_scripts.join_line
render_user_data = boot_scripts.render_user_data
render_pool_user_data = boot_scripts.render_pool_user_data
render_start_user_data = boot_scripts.render_start_user_data
check_user_data = boot_scripts.check_user_data


def stopped_by_itself(raw: Mapping[str, Any]) -> bool:
    """An owned machine launched to join (no warm pool tag) that is stopping or stopped: the daemon
    never stops one, so its boot failed and it stopped itself (`boot_scripts`: a failed boot says why
    on the console and shuts down; RunInstances leaves InstanceInitiatedShutdownBehavior at stop)."""
    tags = {t["Key"]: t["Value"] for t in raw.get("Tags", ())}
    return POOL_TAG not in tags and raw.get("State", {}).get("Name") in ("stopping", "stopped")


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
        private_ip=raw.get("PrivateIpAddress") or "",
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
