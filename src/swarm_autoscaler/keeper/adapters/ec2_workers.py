"""`Ec2Workers`: the keeper's `WorkerLauncher` port on EC2 (see `keeper/ports.py`, `keeper/launches.py`).

The keeper is the only holder of the power to launch a keeper cluster's workers: the primaries' IAM role
has no `ec2:RunInstances` (docs/security.md, "Tenant credentials: the decision"). A cluster's autoscaler
asks the keeper (`POST /v1/primaries/<id>/launches`); the keeper checks the cluster's scope, maximum,
budget and types, then launches here with parameters the tenant does not choose:

- the AMI of the keeper's worker type (`AUTOSCALER_KEEPER_WORKER_TYPES`), the keeper's security groups
  and key pair, a subnet among the keeper's;
- **no instance profile**, and IMDSv2 required with a hop limit of 1 (a worker runs user code);
- the tags: `Name`, the keeper's custom tags, the node labels asked for (`swarm-autoscaler/label/*`),
  the warm-pool and spot marks, the join ticket's nonce when the autoscaler sent one
  (`swarm-autoscaler/join-nonce`: its join desk checks the ticket against it), then the ones nothing may
  override: the keeper's worker tags (keeper,
  user, wallet), the ownership tags with the cluster id (`managed-by`, `swarm-autoscaler/cluster`, the
  cluster's deployment id when given) and `swarm-autoscaler/primary` = the instance ARN of the
  cluster's primary as the keeper's listing computed it. The volume carries the ownership, keeper and
  primary tags.

The idempotency token is the cluster id and the autoscaler's token, so one cluster's token can never
name another cluster's launch; it is written in the instance's `swarm-autoscaler/launch-token` tag too,
so a copy of a worker (same tags, its own launch) is not the cluster's (`ec2_launch_token`).

`stopped_workers` and `start` serve the start route (`keeper.launches`): the primaries' role holds no
`ec2:StartInstances` either, so a warm-pool worker is started by the keeper, within the maximum.

`live_workers` reads the cluster's workers from EC2 now (one DescribeInstances), and adds the ids this
process launched for the cluster in the last `RECENT_S` seconds that EC2 does not list yet (it is
eventually consistent: a launch a moment ago may be missing from a describe).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, NAME_TAG, PRIMARY_TAG, owner_tags
from swarm_autoscaler.adapters.ec2_launch import metadata_options
from swarm_autoscaler.adapters.ec2_launch_token import with_launch_token
from swarm_autoscaler.adapters.ec2_support import (
    CAPACITY_TAG,
    LABEL_TAG_PREFIX,
    POOL_TAG,
    error_code,
    error_message,
    is_endpoint_failure,
    to_endpoint_error,
)
from swarm_autoscaler.adapters.ec2_transport import Ec2Transport
from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG
from swarm_autoscaler.core.model import PoolPhase
from swarm_autoscaler.keeper.adapters.tags import (
    WORKER_KEEPER_TAG,
    listing_entry,
    tag_list,
    tags_of,
    worker_tags,
)
from swarm_autoscaler.keeper.ports import WorkerLaunch, WorkerLaunchError

RECENT_S = 120.0  # a launch this recent counts as live even when EC2 does not list it yet
WORKER_HOP_LIMIT = 1  # a worker runs user code: its containers get no path to the metadata service


class Ec2Workers:
    """`WorkerLauncher` over the keeper's EC2 client (`transport`: its `Ec2Primaries`). `amis`: the AMI
    of each worker type the keeper offers."""

    def __init__(
        self,
        transport: Ec2Transport,
        *,
        keeper_name: str,
        amis: Mapping[str, str],
        security_group_ids: Sequence[str] = (),
        key_name: str | None = None,
        custom_tags: Mapping[str, str] | None = None,
    ) -> None:
        self._ec2 = transport
        self._name = keeper_name
        self._amis = dict(amis)
        self._groups = list(security_group_ids)
        self._key_name = key_name
        self._custom_tags = dict(custom_tags or {})
        self._recent: dict[str, dict[str, float]] = {}  # cluster id -> {instance id: launched at}
        self._started: dict[str, dict[str, float]] = {}  # cluster id -> {instance id: started at}

    async def live_workers(self, cluster_id: str) -> frozenset[str]:
        filters = [
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster_id]},
            {"Name": f"tag:{WORKER_KEEPER_TAG}", "Values": [self._name]},
        ]
        try:
            reservations = await self._ec2._pages("describe_instances", "Reservations", Filters=filters)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self._ec2.endpoint, "DescribeInstances", exc) from None
        raws = [raw for res in reservations for raw in res.get("Instances", ())]
        mine = [
            raw
            for raw in raws
            if tags_of(raw).get(CLUSTER_TAG) == cluster_id
            and tags_of(raw).get(WORKER_KEEPER_TAG) == self._name
            and not self._ec2.launch_tokens.foreign(raw)  # a copy of a worker is not the cluster's
        ]
        live = {raw["InstanceId"] for raw in mine if raw["State"]["Name"] in ("pending", "running")}
        seen = {raw["InstanceId"] for raw in mine}
        now = self._ec2.now()
        recent = {iid: at for iid, at in self._recent.get(cluster_id, {}).items() if now - at < RECENT_S}
        self._recent[cluster_id] = recent
        # started moments ago, maybe listed stopped still (EC2 is eventually consistent): counted, unless
        # EC2 already lists it ending
        started = {iid: at for iid, at in self._started.get(cluster_id, {}).items() if now - at < RECENT_S}
        self._started[cluster_id] = started
        ending = {
            raw["InstanceId"] for raw in mine if raw["State"]["Name"] in ("shutting-down", "terminated")
        }
        return frozenset(live | (set(recent) - seen) | (set(started) - ending))

    async def launch(self, launch: WorkerLaunch) -> tuple[dict[str, Any], ...]:
        result = await self._refusable("run_instances", "RunInstances", **self._params(launch))
        raws = list(result.get("Instances", ()))
        self._ec2.launch_tokens.answered(raws)
        now = self._ec2.now()
        recent = self._recent.setdefault(launch.cluster_id, {})
        recent.update({raw["InstanceId"]: now for raw in raws})
        return tuple(listing_entry(raw) for raw in raws)

    async def stopped_workers(
        self, cluster_id: str, primary_arn: str, instance_ids: Sequence[str], types: Collection[str]
    ) -> frozenset[str]:
        """Of `instance_ids`, the cluster's stopped workers naming `primary_arn` and of one of `types`,
        read from EC2 now."""
        try:
            raws = await self._ec2._describe_ids(list(dict.fromkeys(instance_ids)))
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self._ec2.endpoint, "DescribeInstances", exc) from None
        return frozenset(
            raw["InstanceId"]
            for raw in raws
            if tags_of(raw).get(CLUSTER_TAG) == cluster_id
            and tags_of(raw).get(WORKER_KEEPER_TAG) == self._name
            and tags_of(raw).get(PRIMARY_TAG) == primary_arn
            and raw["State"]["Name"] == "stopped"
            and raw.get("InstanceType") in types
            and not self._ec2.launch_tokens.foreign(raw)
        )

    async def start(self, cluster_id: str, instance_ids: Sequence[str]) -> None:
        await self._refusable("start_instances", "StartInstances", InstanceIds=list(instance_ids))
        now = self._ec2.now()
        self._started.setdefault(cluster_id, {}).update({iid: now for iid in instance_ids})

    async def _refusable(self, method: str, action: str, **params: Any) -> dict[str, Any]:
        """One EC2 call whose refusal is EC2's word to the cluster (`WorkerLaunchError`, its code
        forwarded); EC2 unreachable or failing is an `EndpointError`."""
        try:
            result: dict[str, Any] = await self._ec2._call(method, **params)
        except ClientError as exc:
            if is_endpoint_failure(exc):
                raise to_endpoint_error(self._ec2.endpoint, action, exc) from None
            raise WorkerLaunchError(error_code(exc) or "Unknown", error_message(exc)) from None
        except BotoCoreError as exc:
            raise to_endpoint_error(self._ec2.endpoint, action, exc) from None
        return result

    def _params(self, launch: WorkerLaunch) -> dict[str, Any]:
        cid = launch.cluster_id
        owner = {
            **worker_tags(self._name, launch.key),
            **owner_tags(cid, launch.deployment),
            PRIMARY_TAG: launch.primary_arn,
        }
        tags = {NAME_TAG: f"{cid}-worker", **self._custom_tags}
        tags.update({f"{LABEL_TAG_PREFIX}{k}": v for k, v in launch.labels})
        if launch.pool:
            tags[POOL_TAG] = PoolPhase.PREPARE.value
        if launch.spot:
            tags[CAPACITY_TAG] = "spot"
        if launch.join_nonce:
            tags[JOIN_NONCE_TAG] = launch.join_nonce
        tags.update(owner)  # last: nothing the tenant asked for overrides them
        call: dict[str, Any] = {
            "ImageId": launch.ami_id or self._amis[launch.instance_type],
            "InstanceType": launch.instance_type,
            "MinCount": 1,
            "MaxCount": launch.count,
            "UserData": launch.user_data,  # botocore base64-encodes it
            "MetadataOptions": metadata_options(WORKER_HOP_LIMIT),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list(tags)},
                {"ResourceType": "volume", "Tags": tag_list(owner)},
            ],
        }
        if launch.subnet_id:
            call["SubnetId"] = launch.subnet_id
        if self._groups:
            call["SecurityGroupIds"] = self._groups
        if self._key_name:
            call["KeyName"] = self._key_name
        if launch.pool:
            call["InstanceInitiatedShutdownBehavior"] = "stop"  # its `shutdown` stops it into the pool
        if launch.spot:
            call["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        # the idempotency token, also in a tag: a copy of the worker is then told from it (`ec2_launch_token`)
        return with_launch_token(call, f"{cid}-{launch.client_token}")
