"""`Ec2Primaries`: the keeper's `ClusterHosts` port on EC2 (see `keeper/ports.py`).

A cluster is its primary: one instance of the configured type whose boot script (rendered per cluster by
`user_data`) makes it a swarm manager running a dask scheduler and the cluster's own autoscaler. Its
state lives in the primary's tags (the scheme: `keeper_tags`), so a restarted keeper (or another replica)
loses nothing. The primary carries no `swarm-autoscaler/cluster` tag, so its own autoscaler never counts
it as one of its workers. The workers carry the daemon's ownership tags with the cluster id as the
cluster name (`managed-by=swarm-autoscaler`, `swarm-autoscaler/cluster=<cluster id>`, see
`ec2.owner_tags`) and this keeper's worker tags; `terminate` ends the primary and every such worker.

Nothing leaks: a worker whose primary is gone (terminated by someone else, or launched as its primary shut
down and listed by EC2 only after) is found by a periodic look for this keeper's workers, and its cluster
is reported `ending`, so the keeper terminates it. So is a cluster whose primary is stopping, stopped or
shutting down while its tags say `starting` or `running`.

A scheduler's addresses are the primary's private IP and the configured ports, unless the primary is
tagged `swarm-autoscaler/keeper/scheduler-url` and `.../dashboard-url` (which a boot script, or the
local cloud, may set when the scheduler listens elsewhere).

A primary, like every machine the daemon launches, requires IMDSv2 (`MetadataOptions`, hop limit
`metadata_hop_limit`, 2 by default: its autoscaler runs in a container, one hop further than the machine,
and reaches EC2 with the primary's instance profile), so an organisation rule that refuses launches
without session tokens lets it through.

Why one file of this size: one adapter over one EC2 client, whose listing, launches, tag writes and
terminations share the tag scheme and its caches (primary ids, each cluster's listed workers).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, DEFAULT_HOP_LIMIT, NAME_TAG, OWNER_TAG, OWNER_VALUE
from swarm_autoscaler.adapters.ec2_launch import metadata_options
from swarm_autoscaler.adapters.ec2_launch_token import with_launch_token
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
from swarm_autoscaler.config.profiles import DEFAULT_PROFILE
from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler.keeper.adapters.tags import (
    ANSWERED_TAG,
    CLUSTER_ID_TAG,
    CREATED_TAG,
    DEPLOYMENT_TAG,
    GONE,
    HEARTBEAT_TAG,
    KEEPER_TAG,
    LISTED_STATES,
    MAX_TAG_VALUE,
    PROFILE_TAG,
    REASON_TAG,
    STATE_TAG,
    USER_TAG,
    WALLET_TAG,
    WORKER_DEPLOYMENT_TAG,
    WORKER_KEEPER_TAG,
    WORKER_USER_TAG,
    WORKER_WALLET_TAG,
    excess_workers,
    group_listing,
    listing_entry,
    new_cluster_id,
    order,
    orphan_clusters,
    primary_arns,
    stamp,
    tag_list,
    tags_of,
    to_cluster,
)
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState
from swarm_autoscaler.keeper.usage import Machine, ended_at

TERMINATE_BATCH = 50
SWEEP_EVERY = 12  # listings between two looks for workers whose primary is gone (1 min at 5 s)

UserData = Callable[[ClusterKey, str, str], str]  # (key, cluster id, profile) -> the primary's boot script


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
        metadata_hop_limit: int = DEFAULT_HOP_LIMIT,
        primary_types: Mapping[str, str] | None = None,
        deployment: str = "",
        **transport: Any,
    ) -> None:
        super().__init__(region=region, **transport)
        # This keeper deployment's id (`credentials.deployment_id`), on every primary it launches; a
        # machine carrying another one is never listed, changed or ended, whatever its keeper name.
        self.deployment = deployment
        if not keeper_name:
            raise ConfigurationError("keeper_name must not be empty: it is the ownership tag")
        if not 1 <= metadata_hop_limit <= 64:
            raise ConfigurationError(
                f"metadata_hop_limit must be within 1..64 (EC2's), got {metadata_hop_limit}"
            )
        self._hop_limit = metadata_hop_limit
        self._name = keeper_name
        self._type = primary_type
        self._types = dict(primary_types or {})  # profile -> its primary's type, when not `primary_type`
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
        self._listings = 0
        self._listing: dict[str, tuple[dict[str, Any], ...]] = {}  # cluster id -> its workers, listed
        self._primary_arns: dict[str, str] = {}  # cluster id -> its live primary's instance ARN, listed
        self._listed_at: float | None = None
        self._spot_prices: dict[tuple[str, str, int], float | None] = {}  # (type, zone, hour) -> USD/h

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

    def _ours(self, raw: Mapping[str, Any]) -> bool:
        """A primary of this keeper: its name, this deployment's id or none (launched before ids), and
        not a copy of one (`ec2_launch_token`: the console's "launch more like this" copies every tag)."""
        tags = tags_of(raw)
        return (
            tags.get(OWNER_TAG) == OWNER_VALUE
            and tags.get(KEEPER_TAG) == self._name
            and tags.get(DEPLOYMENT_TAG, self.deployment) == self.deployment
            and not self.launch_tokens.foreign(raw)
        )

    async def claim(self) -> None:
        """A start-up check: no live primary under this keeper's name carries another deployment's id
        (two keepers given one name by hand); `ConfigurationError` in one line otherwise."""
        filters = [
            {"Name": f"tag:{OWNER_TAG}", "Values": [OWNER_VALUE]},
            {"Name": f"tag:{KEEPER_TAG}", "Values": [self._name]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
        try:
            reservations = await self._pages("describe_instances", "Reservations", Filters=filters)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, "DescribeInstances", exc) from None
        others = sorted(
            (tags_of(raw)[DEPLOYMENT_TAG], raw["InstanceId"])
            for res in reservations
            for raw in res.get("Instances", ())
            if tags_of(raw).get(DEPLOYMENT_TAG, self.deployment) != self.deployment
        )
        if others:
            raise ConfigurationError(
                f"AUTOSCALER_KEEPER_NAME: {self._name!r} is already used in this account and region by another "
                f"keeper (deployment {others[0][0]}, primaries {', '.join(i for _, i in others[:3])}): give this "
                "one another name (nothing of the other was touched); a keeper whose AUTOSCALER_KEEPER_TOKEN "
                "changed is another deployment: end its clusters first"
            )

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
        return [raw for raw in raws if self._ours(raw) and tags_of(raw).get(CLUSTER_ID_TAG)]

    async def list_clusters(self) -> tuple[Cluster, ...]:
        """Every cluster of ours whose primary is not terminated, and every cluster's workers, from
        **one** paged DescribeInstances for all clusters (every instance of ours carrying this keeper's
        name as a tag value: its primaries by the keeper tag, its workers by their keeper tag). The
        workers are kept as each cluster's listing (`listing`), which the cluster's own autoscaler
        reads from the keeper instead of calling DescribeInstances itself: the account's read rate is
        then one paged call per interval whatever the number of clusters (Karpenter batches its
        describes in the same spirit). On the first listing and every `SWEEP_EVERY`th, the clusters
        whose primary is gone but whose workers are not are reported as `ending`, so that the keeper
        terminates them: nothing leaks."""
        filters = [
            {"Name": f"tag:{OWNER_TAG}", "Values": [OWNER_VALUE]},
            {"Name": "tag-value", "Values": [self._name]},
        ]
        try:
            reservations = await self._pages("describe_instances", "Reservations", Filters=filters)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, "DescribeInstances", exc) from None
        raws = [raw for res in reservations for raw in res.get("Instances", ())]
        live = [raw for raw in raws if raw["State"]["Name"] in LISTED_STATES]
        primaries = [raw for raw in live if self._ours(raw) and tags_of(raw).get(CLUSTER_ID_TAG)]
        workers = [raw for raw in raws if self._worker(raw)]
        self._listing = group_listing(workers)
        self._primary_arns = primary_arns(reservations, self._name, self._region)
        self._listed_at = self.now()
        clusters = [self._cluster(raw) for raw in primaries]
        self._listings += 1
        if self._listings % SWEEP_EVERY == 1:
            orphans = [raw for raw in workers if raw["State"]["Name"] in LISTED_STATES]
            clusters += orphan_clusters(orphans, {c.cluster_id for c in clusters})
        return tuple(sorted(clusters, key=order))

    def _worker(self, raw: Mapping[str, Any]) -> bool:
        """A worker of this keeper's clusters (its keeper tag and deployment id), not a copy of one."""
        tags = tags_of(raw)
        return (
            tags.get(OWNER_TAG) == OWNER_VALUE
            and tags.get(WORKER_KEEPER_TAG) == self._name
            and tags.get(WORKER_DEPLOYMENT_TAG, self.deployment) == self.deployment
            and not self.launch_tokens.foreign(raw)
        )

    def _owned(self, raw: Mapping[str, Any]) -> bool:
        """For the interruption queue (`adapters.ec2_interruptions`): a worker of this keeper's clusters
        (their autoscalers read the notice's tag through the keeper's listing)."""
        return self._worker(raw)

    def listing(self, cluster_id: str) -> tuple[float, tuple[dict[str, Any], ...]] | None:
        """The last listing's time and the workers of `cluster_id` in it (terminated ones too, as EC2
        lists them for about an hour: the cluster's autoscaler matches a lingering node by hostname), in
        the shape of DescribeInstances (`listing_entry`); None before the first listing."""
        if self._listed_at is None:
            return None
        return self._listed_at, self._listing.get(cluster_id, ())

    def primary_arn(self, cluster_id: str) -> str | None:
        return self._primary_arns.get(cluster_id)

    async def trim(
        self,
        maximum: int,
        cluster_ids: Iterable[str],
        types: Mapping[str, Collection[str]] | None = None,
    ) -> list[tuple[str, str, str]]:
        """Terminate the workers of `cluster_ids` that `excess_workers` names both in the last listing and
        in a fresh read of that cluster made right before (the listing can be a whole interval old: the
        cluster's autoscaler may have ended some since, and a worker that is no longer past the maximum
        is somebody's work); returns (cluster id, instance id, reason) of each ended. The fresh read is
        made only for a cluster the listing finds past its maximum, so a quiet keeper reads nothing more."""
        ended = []
        for cid in cluster_ids:
            arn = self._primary_arns.get(cid)
            if arn is None:  # a cluster without a listed primary is being ended anyway
                continue
            offered = None if types is None else types.get(cid)
            listed = {iid for iid, _ in excess_workers(self._listing.get(cid, ()), maximum, arn, offered)}
            if not listed:
                continue
            _, workers = await self._machines(cid)
            fresh = excess_workers([listing_entry(w) for w in workers], maximum, arn, offered)
            ended += [(cid, iid, why) for iid, why in fresh if iid in listed]
        for batch in chunks([iid for _, iid, _ in ended], TERMINATE_BATCH):
            await self._terminate_batch(batch)
        return ended

    async def find(self, key: ClusterKey) -> tuple[Cluster, ...]:
        found = await self._primaries(
            {"Name": f"tag:{USER_TAG}", "Values": [key.user_id]},
            {"Name": f"tag:{WALLET_TAG}", "Values": [key.wallet_id]},
        )
        return tuple(sorted((c for c in map(self._cluster, found) if c.key == key), key=order))

    def _cluster(self, raw: Mapping[str, Any]) -> Cluster:
        cluster = to_cluster(raw, self._ports)
        self._primary_ids[cluster.cluster_id] = cluster.primary_id
        return cluster

    async def machines(self) -> list[Machine]:
        """Every machine of this keeper's clusters that EC2 still lists, terminated ones too (for usage):
        the primaries by the keeper's tag, the workers by their keeper tag; two paged listings."""
        out: list[Machine] = []
        for tag, cid_tag, user_tag, wallet_tag in (
            (KEEPER_TAG, CLUSTER_ID_TAG, USER_TAG, WALLET_TAG),
            (WORKER_KEEPER_TAG, CLUSTER_TAG, WORKER_USER_TAG, WORKER_WALLET_TAG),
        ):
            filters = [
                {"Name": f"tag:{OWNER_TAG}", "Values": [OWNER_VALUE]},
                {"Name": f"tag:{tag}", "Values": [self._name]},
            ]
            try:
                reservations = await self._pages("describe_instances", "Reservations", Filters=filters)
            except (ClientError, BotoCoreError) as exc:
                raise to_endpoint_error(self.endpoint, "DescribeInstances", exc) from None
            for raw in (raw for res in reservations for raw in res.get("Instances", ())):
                tags = tags_of(raw)
                if not (self._ours(raw) if tag == KEEPER_TAG else self._worker(raw)) or not tags.get(cid_tag):
                    continue
                out.append(
                    Machine(
                        instance_id=raw["InstanceId"],
                        user_id=tags.get(user_tag, ""),
                        wallet_id=tags.get(wallet_tag, ""),
                        cluster_id=tags[cid_tag],
                        instance_type=raw.get("InstanceType", ""),
                        launched_at=raw["LaunchTime"].timestamp(),
                        ended_at=ended_at(raw),
                        spot_price_per_hour=await self._spot_price(raw),
                    )
                )
        return list({m.instance_id: m for m in out}.values())

    async def _spot_price(self, raw: Mapping[str, Any]) -> float | None:
        """The current spot price of a spot instance's type in its zone (cached per hour); None for an
        on-demand instance, or when EC2 does not say (then the list price is used)."""
        if raw.get("InstanceLifecycle") != "spot":
            return None
        zone = raw.get("Placement", {}).get("AvailabilityZone", "")
        key = (raw.get("InstanceType", ""), zone, int(self.now() // 3600))
        if key not in self._spot_prices:
            price: float | None = None
            try:
                result = await self._call(
                    "describe_spot_price_history",
                    InstanceTypes=[key[0]],
                    AvailabilityZone=zone,
                    ProductDescriptions=["Linux/UNIX"],
                    MaxResults=1,
                )
                history = result.get("SpotPriceHistory", ())
                price = float(history[0]["SpotPrice"]) if history else None
            except (ClientError, BotoCoreError, KeyError, ValueError):
                price = None
            self._spot_prices[key] = price
        return self._spot_prices[key]

    # ----------------------------------------------------------------------------------- creating

    async def create(self, key: ClusterKey, now: float, profile: str = DEFAULT_PROFILE) -> Cluster:
        """Launch the primary, trying the subnets in order on capacity refusals. The cluster id is the
        idempotency token of RunInstances, so a retried call cannot launch two primaries."""
        cid = new_cluster_id()
        user_data = self._user_data(key, cid, profile)
        if len(user_data.encode()) > USER_DATA_LIMIT:
            raise ConfigurationError(
                f"the primary's boot script is over EC2's {USER_DATA_LIMIT} bytes of user data: shorten "
                "AUTOSCALER_KEEPER_PRIMARY_BOOT_TEMPLATE or the worker types' boot scripts"
            )
        params = self._launch_params(key, cid, now, user_data, profile)
        refusals: list[str] = []
        for attempt, subnet in enumerate(self._subnets):
            # the token, one per attempt, in a tag too: a copy of the primary is then not ours
            call = with_launch_token(params, f"{cid}-{attempt}")
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
                raise to_endpoint_error(
                    self.endpoint, f"RunInstances {params['InstanceType']}", exc
                ) from None
            self.stats.instances_launched += 1
            self.launch_tokens.answered(result["Instances"])
            return self._cluster(result["Instances"][0])
        kind = params["InstanceType"]
        raise EndpointError(self.endpoint, f"no capacity for a {kind} primary: {'; '.join(refusals)}")

    def _launch_params(
        self, key: ClusterKey, cid: str, now: float, user_data: str, profile: str = DEFAULT_PROFILE
    ) -> dict[str, Any]:
        tags = {
            NAME_TAG: f"{self._name}-{cid}-primary",
            **self._custom_tags,
            CLUSTER_ID_TAG: cid,
            USER_TAG: key.user_id,
            WALLET_TAG: key.wallet_id,
            PROFILE_TAG: profile,
            STATE_TAG: str(ClusterState.STARTING),
            CREATED_TAG: stamp(now),
            HEARTBEAT_TAG: stamp(now),
            OWNER_TAG: OWNER_VALUE,  # last: nothing may override ownership
            KEEPER_TAG: self._name,
        }
        owner = {OWNER_TAG: OWNER_VALUE, KEEPER_TAG: self._name, CLUSTER_ID_TAG: cid}
        if self.deployment:
            tags[DEPLOYMENT_TAG] = owner[DEPLOYMENT_TAG] = self.deployment
        params: dict[str, Any] = {
            "ImageId": self._ami,
            "InstanceType": self._types.get(profile, self._type),
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": user_data,  # botocore base64-encodes it
            "MetadataOptions": metadata_options(self._hop_limit),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list(tags)},
                {"ResourceType": "volume", "Tags": tag_list(owner)},
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
            HEARTBEAT_TAG: None if heartbeat is None else stamp(heartbeat),
            ANSWERED_TAG: None if answered is None else stamp(answered),
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
            await self._call("create_tags", Resources=[primary], Tags=tag_list(tags))
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
        live = [raw["InstanceId"] for raw in workers + primaries if raw["State"]["Name"] not in GONE]
        states = {raw["InstanceId"]: raw["State"]["Name"] for raw in workers + primaries}
        for batch in chunks(live, TERMINATE_BATCH):
            states.update(await self._terminate_batch(batch))
        primary_ids = {raw["InstanceId"] for raw in primaries}
        return sum(
            1
            for iid, state in states.items()
            if (state != "terminated" if iid in primary_ids else state not in GONE)
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
        primaries = [r for r in raws if self._ours(r) and tags_of(r).get(CLUSTER_ID_TAG) == cluster_id]
        # A worker is this keeper's by its worker tag (as in the listing), which is also what the keeper's
        # IAM policy lets it terminate: a machine with only the cluster id is not ours to end.
        workers = [r for r in raws if self._worker(r) and tags_of(r).get(CLUSTER_TAG) == cluster_id]
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
