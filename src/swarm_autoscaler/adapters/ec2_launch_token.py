"""Copies are not ours: every machine we launch carries, in a tag, the `ClientToken` of its RunInstances.

A console "launch more like this" (or any RunInstances that copies a machine's tags) gives the copy
every tag of the original, the ownership and deployment tags too: by its tags alone the copy is one of
ours, which the daemon would count, drain or terminate as broken (its node never joins), and which the
keeper would take for a cluster's primary or worker. So every launch of the daemon and of the keeper
writes its idempotency token (`ClientToken`, one per RunInstances call) in `LAUNCH_TOKEN_TAG`, in the
launch's own tag specification (the IAM policies allow the key only at create, never on a retag). EC2
keeps the token an instance was launched with and returns it with the instance (`Instance.ClientToken`
in DescribeInstances; a stop and start keeps it, so a warm-pool machine keeps it); a copy is made by a
RunInstances of its own, whose token is another (the console makes one per launch, and a launch with
the original's token would be EC2's idempotent replay of the original, not a new machine), while its
tag is the original's. Hence the rule (`copied`):

- a machine carrying the tag is ours only when its ClientToken equals the tag;
- a machine without the tag (launched before this check existed) is judged by its other tags, as before.

A machine that fails it is logged once (`LaunchTokens.foreign`: one warning line naming the instance and
why) and is never listed, counted, stopped, started, tagged or terminated.

Fail-safe: the rule rests on EC2 returning the token of our own launches. If a launch's answer shows a
machine of ours failing it (`LaunchTokens.answered`), the check is off for this process, with one error
line: otherwise every machine launched from then on would be left alone, and launched again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog

LAUNCH_TOKEN_TAG = "swarm-autoscaler/launch-token"
_TOLD_AT_MOST = 4096  # instance ids remembered as already logged (a bound, not a target)

log = structlog.get_logger("swarm_autoscaler.adapters.ec2_launch_token")


def with_launch_token(call: Mapping[str, Any], token: str) -> dict[str, Any]:
    """RunInstances parameters `call` with `ClientToken=token` and the token in the instance's tags
    (`TagSpecifications`, resource type `instance`), leaving `call` as it was."""
    specs = [
        dict(spec, Tags=[*spec["Tags"], {"Key": LAUNCH_TOKEN_TAG, "Value": token}])
        if spec["ResourceType"] == "instance"
        else spec
        for spec in call.get("TagSpecifications", ())
    ]
    return {**call, "ClientToken": token, "TagSpecifications": specs}


def copied(raw: Mapping[str, Any]) -> str | None:
    """Why the instance record `raw` (DescribeInstances' shape) is a copy of one of ours, or None when
    it is not (it carries no launch-token tag, or its ClientToken is the tag's)."""
    token = next((t["Value"] for t in raw.get("Tags", ()) if t["Key"] == LAUNCH_TOKEN_TAG), None)
    if token is None:
        return None
    launched_with = raw.get("ClientToken") or ""
    if launched_with == token:
        return None
    return (
        f"its {LAUNCH_TOKEN_TAG} tag is {token!r} but EC2 says it was launched with ClientToken "
        f"{launched_with!r}: a copy of one of our machines (the console's 'launch more like this' copies "
        "every tag), never ours to count or touch"
    )


class LaunchTokens:
    """The check of one process (see the module docstring): `foreign(raw)` logs each copy once."""

    def __init__(self) -> None:
        self.checking = True
        self._told: set[str] = set()

    def foreign(self, raw: Mapping[str, Any]) -> bool:
        """True when `raw` is a copy of one of ours (`copied`), logging it the first time."""
        if not self.checking:
            return False
        why = copied(raw)
        if why is None:
            return False
        instance_id = str(raw.get("InstanceId", ""))
        if instance_id not in self._told:
            if len(self._told) >= _TOLD_AT_MOST:
                self._told.clear()
            self._told.add(instance_id)
            log.warning("a machine carrying our tags is left alone", instance_id=instance_id, why=why)
        return True

    def answered(self, raws: Iterable[Mapping[str, Any]]) -> None:
        """Check the instances a launch of ours just answered: each must pass `copied`. One that does
        not means EC2 does not return the token as this check assumes: the check is turned off."""
        for raw in raws:
            why = copied(raw)
            if why is not None and self.checking:
                self.checking = False
                log.error(
                    "EC2 did not return a launch's ClientToken with its instance: the launch-token check "
                    "(copies of our machines are not ours) is off until this process restarts",
                    instance_id=raw.get("InstanceId", ""), why=why,
                )  # fmt: skip
