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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swarm_autoscaler.adapters.ec2_transport import PRODUCT_USER_AGENT

AWS_ACTION_LOG_ENV = "SWARM_AUTOSCALER_LAB_AWS_ACTION_LOG"


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
        self._lock = threading.Lock()

    def record(self, environ: Mapping[str, Any], action: str, params: Mapping[str, str]) -> None:
        self.record_names(environ, actions_of(action, params))

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
