"""`Ec2Primaries`: the keeper's `ClusterHosts` port on EC2 (see `keeper/ports.py`).

A cluster is its primary: one instance of the configured type whose boot script (rendered per cluster by
`user_data`) makes it a swarm manager running a dask scheduler and the cluster's own autoscaler. Its
state lives in the primary's tags, so a restarted keeper (or another replica) loses nothing:

    managed-by=swarm-autoscaler, swarm-autoscaler/keeper=<keeper name>      ownership
    swarm-autoscaler/keeper/cluster-id, .../user, .../wallet                 whose cluster it is
    swarm-autoscaler/keeper/state, .../created, .../heartbeat, .../answered, .../reason   its lifecycle

Times are epoch seconds. The primary carries no `swarm-autoscaler/cluster` tag, so its own autoscaler
never counts it as one of its workers. The workers carry the daemon's ownership tags with the cluster id
as the cluster name (`managed-by=swarm-autoscaler`, `swarm-autoscaler/cluster=<cluster id>`, see
`ec2.owner_tags`); `terminate` ends the primary and every such worker.

A scheduler's addresses are the primary's private IP and the configured ports, unless the primary is
tagged `swarm-autoscaler/keeper/scheduler-url` and `.../dashboard-url` (which a boot script, or the
local cloud, may set when the scheduler listens elsewhere).

A primary that is stopping, stopped or shutting down while its tags say `starting` or `running` is
reported `ending` (someone else stopped or terminated it): its workers are then terminated too.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, NAME_TAG, OWNER_TAG, OWNER_VALUE
from swarm_autoscaler.adapters.ec2_support import (
    GONE_CODES,
    UNKNOWN_TYPE_CODES,
    USER_DATA_LIMIT,
    chunks,
    error_code,
    error_message,
    is_capacity,
    to_endpoint_error,
)
from swarm_autoscaler.adapters.ec2_transport import Ec2Transport
from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState

KEEPER_TAG = "swarm-autoscaler/keeper"
_K = "swarm-autoscaler/keeper/"
CLUSTER_ID_TAG = _K + "cluster-id"
USER_TAG = _K + "user"
WALLET_TAG = _K + "wallet"
STATE_TAG = _K + "state"
CREATED_TAG = _K + "created"
HEARTBEAT_TAG = _K + "heartbeat"
ANSWERED_TAG = _K + "answered"
REASON_TAG = _K + "reason"
SCHEDULER_URL_TAG = _K + "scheduler-url"
DASHBOARD_URL_TAG = _K + "dashboard-url"

LISTED_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")  # not terminated
_HALTED = frozenset({"stopping", "stopped", "shutting-down"})
TERMINATE_BATCH = 50
MAX_TAG_VALUE = 256

UserData = Callable[[ClusterKey, str], str]  # (key, cluster id) -> the primary's boot script


def new_cluster_id() -> str:
    """A fresh id: `kc-` and 16 hex digits (a valid cluster name for the cluster's own autoscaler)."""
    return f"kc-{uuid.uuid4().hex[:16]}"


def _stamp(seconds: float) -> str:
    return f"{seconds:.3f}"


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


class Ec2Primaries(Ec2Transport):
    """`ClusterHosts` on EC2. Use `async with Ec2Primaries(...) as hosts`, or `start()` then `close()`.
    Transport options (`endpoint`, credentials, `clock`, retries, `timeout`) are `Ec2Transport`'s."""

    def __init__(
        self,
        *,
        keeper_name: str,
        region: str,
        primary_type: str,
        ami_id: str,
        user_data: UserData,
        subnet_ids: Sequence[str] = (),
        security_group_ids: Sequence[str] = (),
        key_name: str | None = None,
        iam_instance_profile: str | None = None,
        custom_tags: Mapping[str, str] | None = None,
        scheduler_port: int = 8786,
        dashboard_port: int = 8787,
        **transport: Any,
    ) -> None:
        super().__init__(region=region, **transport)
        if not keeper_name:
            raise ConfigurationError("keeper_name must not be empty: it is the ownership tag")
        self._name = keeper_name
        self._type = primary_type
        self._ami = ami_id
        self._user_data = user_data
        self._subnets = list(subnet_ids) or [""]  # "" = let EC2 pick (default VPC)
        self._groups = list(security_group_ids)
        self._key_name = key_name
        self._profile = iam_instance_profile
        self._custom_tags = dict(custom_tags or {})
        bad = [
            k
            for k in self._custom_tags
            if k in (OWNER_TAG, NAME_TAG) or k.startswith(("aws:", "swarm-autoscaler/"))
        ]
        if bad:
            raise ConfigurationError(f"custom EC2 tags {bad} use reserved keys; rename them")
        self._ports = (scheduler_port, dashboard_port)
        self._primary_ids: dict[str, str] = {}  # cluster id -> primary instance id (never changes)

    # ----------------------------------------------------------------------------------- checks

    async def check(self, type_names: Sequence[str]) -> None:
        """A start-up check: EC2 answers with our credentials and knows every type (the primary's and the
        workers'). Raises `EndpointError`, or `ConfigurationError` for an unknown type."""
        try:
            result = await self._call(
                "describe_instance_types", InstanceTypes=list(dict.fromkeys(type_names))
            )
        except ClientError as exc:
            if error_code(exc) in UNKNOWN_TYPE_CODES:
                raise ConfigurationError(
                    f"EC2 at {self.endpoint} does not know instance type(s) among {list(type_names)} "
                    f"({error_message(exc)}): fix the primary or worker types"
                ) from None
            raise to_endpoint_error(self.endpoint, "DescribeInstanceTypes", exc) from None
        except BotoCoreError as exc:
            raise to_endpoint_error(self.endpoint, "DescribeInstanceTypes", exc) from None
        known = {raw["InstanceType"] for raw in result.get("InstanceTypes", ())}
        unknown = [n for n in type_names if n not in known]
        if unknown:
            raise ConfigurationError(f"EC2 at {self.endpoint} does not know instance type(s) {unknown}")

    # ----------------------------------------------------------------------------------- reading

    def _ours(self, tags: Mapping[str, str]) -> bool:
        return tags.get(OWNER_TAG) == OWNER_VALUE and tags.get(KEEPER_TAG) == self._name

    async def _primaries(self, *extra: dict[str, Any]) -> list[dict[str, Any]]:
        """Our primaries that are not terminated, filtered server-side and checked again here."""
        filters = [
            {"Name": f"tag:{OWNER_TAG}", "Values": [OWNER_VALUE]},
            {"Name": f"tag:{KEEPER_TAG}", "Values": [self._name]},
            {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
            *extra,
        ]
        try:
            reservations = await self._pages("describe_instances", "Reservations", Filters=filters)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, "DescribeInstances", exc) from None
        raws = [raw for res in reservations for raw in res.get("Instances", ())]
        return [raw for raw in raws if self._ours(_tags(raw)) and _tags(raw).get(CLUSTER_ID_TAG)]

    async def list_clusters(self) -> tuple[Cluster, ...]:
        return tuple(sorted((self._cluster(raw) for raw in await self._primaries()), key=_order))

    async def find(self, key: ClusterKey) -> tuple[Cluster, ...]:
        found = await self._primaries(
            {"Name": f"tag:{USER_TAG}", "Values": [key.user_id]},
            {"Name": f"tag:{WALLET_TAG}", "Values": [key.wallet_id]},
        )
        return tuple(sorted((c for c in map(self._cluster, found) if c.key == key), key=_order))

    def _cluster(self, raw: Mapping[str, Any]) -> Cluster:
        tags = _tags(raw)
        cid = tags[CLUSTER_ID_TAG]
        self._primary_ids[cid] = raw["InstanceId"]
        launched = raw["LaunchTime"].timestamp()
        created = _seconds(tags.get(CREATED_TAG)) or launched
        try:
            state = ClusterState(tags.get(STATE_TAG, ClusterState.STARTING))
        except ValueError:
            state = ClusterState.STARTING
        reason = tags.get(REASON_TAG, "")
        machine = raw["State"]["Name"]
        if machine in _HALTED and state in (ClusterState.STARTING, ClusterState.RUNNING):
            state, reason = ClusterState.ENDING, f"its primary {raw['InstanceId']} is {machine}"
        scheduler, dashboard = self._addresses(raw, tags)
        return Cluster(
            cluster_id=cid,
            key=ClusterKey(tags.get(USER_TAG, ""), tags.get(WALLET_TAG, "")),
            state=state,
            created_at=created,
            last_heartbeat=_seconds(tags.get(HEARTBEAT_TAG)) or created,
            last_answered=_seconds(tags.get(ANSWERED_TAG)),
            primary_id=raw["InstanceId"],
            scheduler_url=scheduler,
            dashboard_url=dashboard,
            reason=reason,
        )

    def _addresses(self, raw: Mapping[str, Any], tags: Mapping[str, str]) -> tuple[str, str]:
        ip = raw.get("PrivateIpAddress") or ""
        scheduler_port, dashboard_port = self._ports
        scheduler = tags.get(SCHEDULER_URL_TAG) or (f"tcp://{ip}:{scheduler_port}" if ip else "")
        dashboard = tags.get(DASHBOARD_URL_TAG) or (f"http://{ip}:{dashboard_port}" if ip else "")
        return scheduler, dashboard

    # ----------------------------------------------------------------------------------- creating

    async def create(self, key: ClusterKey, now: float) -> Cluster:
        """Launch the primary, trying the subnets in order on capacity refusals. The cluster id is the
        idempotency token of RunInstances, so a retried call cannot launch two primaries."""
        cid = new_cluster_id()
        user_data = self._user_data(key, cid)
        if len(user_data.encode()) > USER_DATA_LIMIT:
            raise ConfigurationError(
                f"the primary's boot script is over EC2's {USER_DATA_LIMIT} bytes of user data: shorten "
                "AUTOSCALER_KEEPER_PRIMARY_BOOT_TEMPLATE or the worker types' boot scripts"
            )
        params = self._launch_params(key, cid, now, user_data)
        refusals: list[str] = []
        for attempt, subnet in enumerate(self._subnets):
            call = dict(params, ClientToken=f"{cid}-{attempt}")
            if subnet:
                call["SubnetId"] = subnet
            self.stats.launch_calls += 1
            try:
                result = await self._call("run_instances", **call)
            except (ClientError, BotoCoreError) as exc:
                if is_capacity(exc):
                    self.stats.capacity_refusals += 1
                    refusals.append(f"{subnet or 'default subnet'}: {error_message(exc)}")
                    continue
                raise to_endpoint_error(self.endpoint, f"RunInstances {self._type}", exc) from None
            self.stats.instances_launched += 1
            return self._cluster(result["Instances"][0])
        raise EndpointError(self.endpoint, f"no capacity for a {self._type} primary: {'; '.join(refusals)}")

    def _launch_params(self, key: ClusterKey, cid: str, now: float, user_data: str) -> dict[str, Any]:
        tags = {
            NAME_TAG: f"{self._name}-{cid}-primary",
            **self._custom_tags,
            CLUSTER_ID_TAG: cid,
            USER_TAG: key.user_id,
            WALLET_TAG: key.wallet_id,
            STATE_TAG: str(ClusterState.STARTING),
            CREATED_TAG: _stamp(now),
            HEARTBEAT_TAG: _stamp(now),
            OWNER_TAG: OWNER_VALUE,  # last: nothing may override ownership
            KEEPER_TAG: self._name,
        }
        owner = {OWNER_TAG: OWNER_VALUE, KEEPER_TAG: self._name, CLUSTER_ID_TAG: cid}
        params: dict[str, Any] = {
            "ImageId": self._ami,
            "InstanceType": self._type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": user_data,  # botocore base64-encodes it
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list(tags)},
                {"ResourceType": "volume", "Tags": _tag_list(owner)},
            ],
        }
        if self._groups:
            params["SecurityGroupIds"] = self._groups
        if self._key_name:
            params["KeyName"] = self._key_name
        if self._profile:
            params["IamInstanceProfile"] = {
                ("Arn" if self._profile.startswith("arn:") else "Name"): self._profile
            }
        return params

    # ----------------------------------------------------------------------------------- updating

    async def update(
        self,
        cluster_id: str,
        *,
        state: ClusterState | None = None,
        heartbeat: float | None = None,
        answered: float | None = None,
        reason: str | None = None,
    ) -> None:
        """One CreateTags call on the primary (found by its cluster-id tag when not seen yet)."""
        values = {
            STATE_TAG: None if state is None else str(state),
            HEARTBEAT_TAG: None if heartbeat is None else _stamp(heartbeat),
            ANSWERED_TAG: None if answered is None else _stamp(answered),
            REASON_TAG: None if reason is None else reason[:MAX_TAG_VALUE],
        }
        tags = {k: v for k, v in values.items() if v is not None}
        if not tags:
            return
        primary = self._primary_ids.get(cluster_id)
        if primary is None:
            found = await self._primaries({"Name": f"tag:{CLUSTER_ID_TAG}", "Values": [cluster_id]})
            if not found:
                return  # gone
            primary = found[0]["InstanceId"]
        try:
            await self._call("create_tags", Resources=[primary], Tags=_tag_list(tags))
        except ClientError as exc:
            if error_code(exc) not in GONE_CODES:
                raise to_endpoint_error(self.endpoint, "CreateTags", exc) from None
        except BotoCoreError as exc:
            raise to_endpoint_error(self.endpoint, "CreateTags", exc) from None

    # ----------------------------------------------------------------------------------- terminating

    async def terminate(self, cluster_id: str) -> int:
        """Terminate the primary and every worker of the cluster in one pass (workers first, the primary
        in the last batch). Returns how many are still alive: the primary until it is `terminated`
        (while it shuts down, its autoscaler may still launch a worker, which the next call catches),
        workers until they are shutting down."""
        primaries, workers = await self._machines(cluster_id)
        live = [raw["InstanceId"] for raw in workers + primaries if raw["State"]["Name"] not in _GONE]
        states = {raw["InstanceId"]: raw["State"]["Name"] for raw in workers + primaries}
        for batch in chunks(live, TERMINATE_BATCH):
            states.update(await self._terminate_batch(batch))
        primary_ids = {raw["InstanceId"] for raw in primaries}
        return sum(
            1
            for iid, state in states.items()
            if (state != "terminated" if iid in primary_ids else state not in _GONE)
        )

    async def _machines(self, cluster_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The cluster's primary and workers, in one DescribeInstances: every instance of ours carrying
        the cluster id as a tag value, then sorted by which tag carries it."""
        filters = [
            {"Name": f"tag:{OWNER_TAG}", "Values": [OWNER_VALUE]},
            {"Name": "tag-value", "Values": [cluster_id]},
            {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
        ]
        try:
            reservations = await self._pages("describe_instances", "Reservations", Filters=filters)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, "DescribeInstances", exc) from None
        raws = [raw for res in reservations for raw in res.get("Instances", ())]
        primaries = [r for r in raws if self._ours(_tags(r)) and _tags(r).get(CLUSTER_ID_TAG) == cluster_id]
        workers = [
            r
            for r in raws
            if _tags(r).get(OWNER_TAG) == OWNER_VALUE and _tags(r).get(CLUSTER_TAG) == cluster_id
        ]
        return primaries, [w for w in workers if w not in primaries]

    async def _terminate_batch(self, batch: list[str]) -> dict[str, str]:
        try:
            result = await self._call("terminate_instances", InstanceIds=batch)
        except ClientError as exc:
            if error_code(exc) not in GONE_CODES:
                raise to_endpoint_error(self.endpoint, "TerminateInstances", exc) from None
            if len(batch) == 1:
                return {batch[0]: "terminated"}
            states: dict[str, str] = {}
            for instance_id in batch:  # one vanished since the describe: the rest still need terminating
                states.update(await self._terminate_batch([instance_id]))
            return states
        except BotoCoreError as exc:
            raise to_endpoint_error(self.endpoint, "TerminateInstances", exc) from None
        return {i["InstanceId"]: i["CurrentState"]["Name"] for i in result.get("TerminatingInstances", ())}


_GONE = frozenset({"shutting-down", "terminated"})


def _tags(raw: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", ())}


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _order(cluster: Cluster) -> tuple[float, str]:
    return cluster.created_at, cluster.cluster_id
