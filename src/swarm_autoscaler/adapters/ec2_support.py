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

from swarm_autoscaler.core.model import Instance, InstanceState, InstanceType, Resources
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
# Refusals for lack of capacity in one zone: another subnet (zone) may have room. EC2 answers
# InsufficientInstanceCapacity with HTTP 500, so these must be excluded from the "5xx is transient"
# rule, or every refusal would be retried in place for nothing.
CAPACITY_CODES = frozenset(
    {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity", "Unsupported"}
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


def render_user_data(boot_script: str, token: str, manager_address: str) -> str:
    """The configured boot script, then the swarm join. A script without a shebang runs under bash."""
    script = boot_script.strip("\n")
    head = "" if script.startswith("#!") else "#!/bin/bash\nset -eu\n"
    join = f"docker swarm join --token {shlex.quote(token)} {shlex.quote(manager_address)}"
    body = f"{script}\n\n" if script else ""
    return f"{head}{body}# join the swarm as a worker (added by swarm-autoscaler)\n{join}\n"


# ------------------------------------------------------------------------------------------ mapping


# Node labels travel as instance tags with this prefix; the planner gives them to the node once it joins.
LABEL_TAG_PREFIX = "swarm-autoscaler/label/"
# The instance's hostname, tagged right after launch: EC2 drops a terminated instance's private DNS name,
# and the daemon still needs it to recognise that machine's swarm node.
HOSTNAME_TAG = "swarm-autoscaler/hostname"


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
        launched_at=raw["LaunchTime"].timestamp(),
        hostname=(raw.get("PrivateDnsName") or tags.get(HOSTNAME_TAG, "")).split(".", 1)[0],
        zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
        subnet_id=raw.get("SubnetId", ""),
        tags=tags,
        labels=node_labels(tags),
    )


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def to_instance_type(raw: Mapping[str, Any], price_per_hour: float | None) -> InstanceType:
    """An InstanceType from one DescribeInstanceTypes record (memory in MiB there, bytes here)."""
    gpus = sum(g.get("Count", 0) for g in raw.get("GpuInfo", {}).get("Gpus", ()))
    resources = Resources(
        cpus=float(raw["VCpuInfo"]["DefaultVCpus"]),
        ram=int(raw["MemoryInfo"]["SizeInMiB"]) * 1024**2,
        gpus=gpus,
    )
    return InstanceType(raw["InstanceType"], resources, price_per_hour)
