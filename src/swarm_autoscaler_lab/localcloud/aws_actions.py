"""The AWS actions the product really sends, recorded where they arrive: at the local EC2.

The IAM policy in `docker/iam-policy.json` must list exactly the actions the daemon and the keeper call.
Reading the code for them would miss a path; so every moto server of the lab (through `FaultInjector`)
records, when `AWS_ACTION_LOG_ENV` names a file, each action that arrives from the product's own EC2
(or SQS: `sqs:<Action>`, from the interruption queue's JSON requests)
client (its user agent carries `PRODUCT_USER_AGENT`; the lab's helper clients, which provision networks
or read user data, do not) as one line `ec2:<Action>`. A RunInstances that passes an instance profile
also records `iam:PassRole`, the permission EC2 checks for it. Each process writes a name once; lines are
appended (one `write` each), so the processes of a test run can share the file. `make test` points every
run at one file and then checks it against the policy (`tests/audit`).

Beside the names, each EC2 request's **shape** is kept in `<file>.requests` (one JSON line per shape, per
process): its action, the parameters IAM conditions read (tag specifications, tags, resource and
instance ids, instance profile, market, subnet, groups, image, key) and the tags each instance it names
carries as it arrives (read from moto's own state, in this process). A shape is the action with the tag
keys requested and held, so the file stays small while every kind of request is there; the audit
evaluates each against its role's policy (`tests/audit/test_iam_policy.py`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swarm_autoscaler.adapters.ec2_transport import PRODUCT_USER_AGENT

AWS_ACTION_LOG_ENV = "SWARM_AUTOSCALER_LAB_AWS_ACTION_LOG"
REQUESTS_SUFFIX = ".requests"
_KEPT = re.compile(
    r"^(TagSpecification\.|Tag\.|ResourceId\.|InstanceId|IamInstanceProfile\.|InstanceMarketOptions\.MarketType$"
    r"|SubnetId$|SecurityGroupId\.|ImageId$|KeyName$)"
)
_REGION = re.compile(r"Credential=[^/]+/\d+/([^/]+)/")
_IDS = re.compile(r"^(ResourceId\.\d+|InstanceId(\.\d+)?)$")


def actions_of(action: str, params: Mapping[str, str]) -> set[str]:
    """The IAM actions one EC2 query API request needs."""
    needed = {f"ec2:{action}"}
    if action == "RunInstances" and any(key.startswith("IamInstanceProfile.") for key in params):
        needed.add("iam:PassRole")
    return needed


class ActionLog:
    """Appends each IAM action the product's requests need to `path`, once per process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: set[str] = set()
        self._shapes: set[str] = set()
        self._lock = threading.Lock()

    def record(self, environ: Mapping[str, Any], action: str, params: Mapping[str, str]) -> None:
        self.record_names(environ, actions_of(action, params))
        if PRODUCT_USER_AGENT in str(environ.get("HTTP_USER_AGENT", "")):
            self._record_shape(environ, action, params)

    def _record_shape(self, environ: Mapping[str, Any], action: str, params: Mapping[str, str]) -> None:
        kept = {k: v for k, v in params.items() if _KEPT.match(k)}
        region = _REGION.search(str(environ.get("HTTP_AUTHORIZATION", "")))
        ids = [v for k, v in kept.items() if _IDS.match(k)]
        held = instance_tags(region.group(1) if region else "us-east-1", ids)
        shape = json.dumps(
            [action, sorted(k for k in kept if not _IDS.match(k) and not k.endswith(".Value")),
             sorted({k for tags in held.values() for k in tags})]
        )  # fmt: skip
        with self._lock:
            if shape in self._shapes:
                return
            self._shapes.add(shape)
        line = json.dumps({"action": action, "params": kept, "resource_tags": held}) + "\n"
        fd = os.open(f"{self.path}{REQUESTS_SUFFIX}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def record_names(self, environ: Mapping[str, Any], names: set[str]) -> None:
        """Record these IAM action names (an SQS request's, say) if the product sent the request."""
        if PRODUCT_USER_AGENT not in str(environ.get("HTTP_USER_AGENT", "")):
            return
        with self._lock:
            new = sorted(names - self._seen)
            self._seen.update(new)
        if new:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, "".join(f"{name}\n" for name in new).encode())
            finally:
                os.close(fd)


def action_log_from_env() -> ActionLog | None:
    path = os.environ.get(AWS_ACTION_LOG_ENV)
    return ActionLog(Path(path)) if path else None


def read_action_log(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if line.strip()}


def instance_tags(region: str, ids: list[str]) -> dict[str, dict[str, str]]:
    """The tags of the instances `ids` as moto holds them now (this process's moto); {} for unknown ids."""
    from moto.core.models import DEFAULT_ACCOUNT_ID  # the lab's moto; imported here, where it runs
    from moto.ec2.models import ec2_backends

    found: dict[str, dict[str, str]] = {}
    if not ids:
        return found
    try:
        backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
        rows = backend.describe_tags(filters={"resource-id": ids})
    except Exception:  # a lookup for the audit must never change how the local EC2 answers
        return found
    for row in rows:
        found.setdefault(row["resource_id"], {})[row["key"]] = row["value"]
    return {i: found.get(i, {}) for i in ids}


def read_request_shapes(path: Path) -> list[dict[str, Any]]:
    """The request shapes recorded beside the action log `path` (none when there is no such file)."""
    shapes = Path(f"{path}{REQUESTS_SUFFIX}")
    if not shapes.exists():
        return []
    return [json.loads(line) for line in shapes.read_text().splitlines() if line.strip()]
