"""The warm pool's EC2 calls, for `Ec2Cloud`: starting and stopping owned instances.

Joining on start: a pool machine's first boot runs the boot script and stops itself without joining
(`render_pool_user_data`). Before each start the adapter rewrites the stopped machine's user data
(ModifyInstanceAttribute, allowed only while stopped) with a fresh swarm join (`render_start_user_data`:
leave any old swarm, then join; cloud-init runs it on every boot; with join URLs a fresh join ticket and
its nonce tag instead of the token, `ec2_join`), tags the instance as started
(`PoolPhase.START`, with the start time, which becomes `Instance.launched_at`) and starts it. The
planner removes a machine's node when it stops it, so a stopped machine leaves no down node behind;
the started machine joins as a new node.

Refusals: a StartInstances refused for lack of capacity backs off the (type, subnet) pair exactly as a
refused launch does (`unavailable(now)` reports it); the planner then offers none of that pair's pool
machines and launches instead. One StartInstances per (type, subnet), so one refusal blocks no other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.ec2_join import JoinHost, join_user_data
from swarm_autoscaler.adapters.ec2_support import (
    POOL_TAG,
    STARTED_AT_TAG,
    chunks,
    error_message,
    is_capacity,
    to_endpoint_error,
    to_instance,
)
from swarm_autoscaler.core.backoff import CapacityBackoff
from swarm_autoscaler.core.model import Instance, PoolPhase, Unavailable
from swarm_autoscaler.core.ports import LaunchResult
from swarm_autoscaler.errors import AutoscalerError, ConfigurationError

STOP_BATCH = 50
_STOPPABLE = ("pending", "running")


class PoolHost(JoinHost, Protocol):
    """What these calls need of `Ec2Cloud` (beyond the join's: `ec2_join.JoinHost`)."""

    _cluster: str
    _backoff: CapacityBackoff

    def now(self) -> float: ...

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]: ...

    async def _describe_ids(self, ids: list[str]) -> list[dict[str, Any]]: ...


async def _owned_records(self: PoolHost, ids: list[str], operation: str) -> list[dict[str, Any]]:
    """The records of `ids` (one describe), refusing any that is not ours."""
    found = await self._describe_ids(ids)
    foreign = sorted(raw["InstanceId"] for raw in found if not self._owned(raw))
    if foreign:
        raise ConfigurationError(
            f"refusing to {operation} {foreign}: not tagged as owned by cluster {self._cluster!r}"
        )
    return found


async def stop_instances(self: PoolHost, instance_ids: Sequence[str]) -> None:
    """Stop the live ones among these owned instances, in batches (see `Cloud.stop_instances`)."""
    ids = list(dict.fromkeys(instance_ids))
    if not ids:
        return
    try:
        found = await _owned_records(self, ids, "stop")
        live = [raw["InstanceId"] for raw in found if raw["State"]["Name"] in _STOPPABLE]
        for batch in chunks(live, STOP_BATCH):
            await self._call("stop_instances", InstanceIds=batch)
    except (ClientError, BotoCoreError) as exc:
        raise to_endpoint_error(self.endpoint, "StopInstances", exc) from None


async def start_instances(self: PoolHost, instance_ids: Sequence[str]) -> LaunchResult:
    """Rewrite each stopped machine's user data with a fresh join, tag it started, start it (see
    the module doc and `Cloud.start_instances`)."""
    ids = list(dict.fromkeys(instance_ids))
    if not ids:
        return LaunchResult()
    try:
        found = await _owned_records(self, ids, "start")
        user_data, join_tags = await join_user_data(self, None)  # a fresh ticket for each start
    except AutoscalerError as exc:
        if isinstance(exc, ConfigurationError):
            raise
        return LaunchResult(error=f"cannot read the swarm join command: {exc}")
    except (ClientError, BotoCoreError) as exc:
        raise to_endpoint_error(self.endpoint, "StartInstances", exc) from None
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for raw in found:
        if raw["State"]["Name"] == "stopped":
            groups.setdefault((raw["InstanceType"], raw.get("SubnetId", "")), []).append(raw)
    started: list[Instance] = []
    refused: list[Unavailable] = []
    for (type_name, subnet), records in groups.items():
        try:
            started += await _start_group(self, records, user_data, join_tags)
        except (ClientError, BotoCoreError) as exc:
            if is_capacity(exc):
                refused.append(self._backoff.refused(type_name, subnet, self.now()))
                continue
            return LaunchResult(
                tuple(started), tuple(refused), f"StartInstances failed: {error_message(exc)}"
            )
        self._backoff.succeeded(type_name, subnet)
    return LaunchResult(tuple(started), tuple(refused))


async def _start_group(
    self: PoolHost, records: list[dict[str, Any]], user_data: str, join_tags: Mapping[str, str]
) -> list[Instance]:
    ids = [raw["InstanceId"] for raw in records]
    for instance_id in ids:  # while stopped: the next boot runs the join
        # The raw script: UserData.Value is a blob, which botocore base64-encodes on the wire, and EC2
        # decodes once. Encoding it here too would store base64 text that cloud-init does not run.
        await self._call(
            "modify_instance_attribute", InstanceId=instance_id, UserData={"Value": user_data.encode()}
        )
    now = self.now()
    tags = [{"Key": POOL_TAG, "Value": PoolPhase.START.value}, {"Key": STARTED_AT_TAG, "Value": f"{now:.3f}"}]
    tags += [{"Key": k, "Value": v} for k, v in join_tags.items()]  # the join ticket's nonce
    await self._call("create_tags", Resources=ids, Tags=tags)
    await self._call("start_instances", InstanceIds=ids)
    out = []
    for raw in records:
        merged = {t["Key"]: t["Value"] for t in raw.get("Tags", ())} | {t["Key"]: t["Value"] for t in tags}
        record = dict(
            raw, State={"Name": "pending"}, Tags=[{"Key": k, "Value": v} for k, v in merged.items()]
        )
        instance = to_instance(record)
        if instance is not None:
            out.append(instance)
    return out
