"""`Ec2Cloud`: the `ports.Cloud` port on EC2, through one reused aiobotocore client.

Ownership: every instance launched carries `managed-by=swarm-autoscaler` and
`swarm-autoscaler/cluster=<cluster>`; only instances with both are listed, and terminating any other
id is refused. Node labels travel as tags named `swarm-autoscaler/label/<key>`. A copy of one of our
machines (same tags, another launch: the console's "launch more like this") is not ours: each launch
writes its ClientToken in a tag, checked against the instance's own (`ec2_launch_token`).

Retries (`ec2_transport`, shared with the keeper's adapter): botocore's own retries are off; tenacity
retries (exponential back-off with jitter) only throttling, 5xx other than capacity refusals, and
connection errors. RunInstances carries a ClientToken so that a retried launch cannot start machines twice.

Launching (`ec2_launch` holds the rules): every RunInstances asks for at least one machine and at most
the subnet's share (MinCount=1, MaxCount=n), with every tag given in TagSpecifications (no machine is
ever untagged) and IMDSv2 required (`MetadataOptions`, hop limit `metadata_hop_limit`). A launch is
spread over the open subnets, starting one zone further each time; what a subnet does not give moves on
to the next. A zone refusal (no capacity, no free address, ...) or a short answer backs off (type,
subnet, capacity); a quota refusal (VcpuLimitExceeded, ...) backs off (type, capacity) in every subnet
and is logged once with the quota to raise. Back-offs are 3 min doubling to 10 min by default, up to
`capacity_backoff_jitter` longer at random, forgotten after a success; `unavailable(now)` reports the
pairs still blocked (the planner counts a type out only while all its subnets are, see core/backoff.py,
and then plans the next type). A call about a just-launched id that EC2 does not know yet is retried a
bounded number of times (EC2 is eventually consistent).

Spot: a type whose capacities (`capacities`, from the type's `capacity` setting) start with "spot" is
launched as one-time spot instances (`InstanceMarketOptions`, terminated on interruption) in every open
subnet first, then on-demand. A launch into the warm pool is always on-demand: EC2 cannot stop a
one-time spot instance. Failures of the endpoint or credentials raise `EndpointError` naming the endpoint.

Clock: `now()` is EC2's own clock, learnt from the `Date` header of every response (see `ec2_clock`),
so ages measured from LaunchTime and the back-off's deadlines share EC2's time base, whatever this
host's wall clock says. The daemon uses it as its only clock.

Counters in `stats` let a benchmark check the API calls each tick costs.

Why one file of this size: launching, listing, terminating and tagging share the ownership checks
above; the transport, clock, records and warm pool are in `ec2_transport`, `ec2_clock`, `ec2_support`
and `ec2_pool`.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import structlog
from botocore.exceptions import BotoCoreError, ClientError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from swarm_autoscaler.adapters import ec2_join, ec2_pool
from swarm_autoscaler.adapters.ec2_launch import metadata_options, quota_advice, refusal_kind, rotated, share
from swarm_autoscaler.adapters.ec2_launch_token import LAUNCH_TOKEN_TAG, with_launch_token
from swarm_autoscaler.adapters.ec2_support import (
    CAPACITY_TAG,
    GONE_CODES,
    HOSTNAME_TAG,
    LABEL_TAG_PREFIX,
    POOL_TAG,
    USER_DATA_LIMIT,
    check_user_data,
    chunks,
    error_code,
    error_message,
    is_endpoint_failure,
    render_pool_user_data,
    stopped_by_itself,
    to_endpoint_error,
    to_instance,
)
from swarm_autoscaler.adapters.ec2_transport import Ec2Transport
from swarm_autoscaler.adapters.ec2_types import DescribedType, check_images, describe_types, offered_types
from swarm_autoscaler.core.backoff import (
    DEFAULT_INITIAL,
    DEFAULT_MAXIMUM,
    ON_DEMAND,
    SPOT,
    CapacityBackoff,
    launch_subnets,
)
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Instance,
    InstanceState,
    InstanceType,
    PoolPhase,
    Unavailable,
)
from swarm_autoscaler.core.ports import LaunchResult
from swarm_autoscaler.errors import AutoscalerError, ConfigurationError

OWNER_TAG = "managed-by"
OWNER_VALUE = "swarm-autoscaler"
CLUSTER_TAG = "swarm-autoscaler/cluster"
DEPLOYMENT_TAG = "swarm-autoscaler/deployment"  # the id of the swarm that launched it (`ec2_identity`)
# A keeper cluster's workers: the instance ARN of the primary whose autoscaler launched them. The primaries'
# IAM policy lets a primary act only on workers naming it (`${ec2:SourceInstanceARN}`): docs/security.md.
PRIMARY_TAG = "swarm-autoscaler/primary"
NAME_TAG = "Name"

# Terminated instances included: EC2 lists them for about an hour, and a node that joined as its machine was
# terminated is recognised by its hostname (kept in a tag, as EC2 drops a terminated one's private DNS name).
LISTED_STATES = tuple(state.value for state in InstanceState)
TERMINATE_BATCH = 50
MAX_TAGS = 50  # EC2's limit per resource
_RESERVED_PREFIXES = ("aws:", LABEL_TAG_PREFIX)

JoinCommand = Callable[[], Awaitable[tuple[str, str]]]
DEFAULT_HOP_LIMIT = 2  # containers on a docker network are one hop further than the machine
TYPE_TTL = 24 * 3600.0  # a type's description is read again after this long
NEW_ID_ATTEMPTS = 6  # CreateTags of a new id answered NotFound (EC2 does not know it yet): tries in all

log = structlog.get_logger("swarm_autoscaler.adapters.ec2")


@dataclasses.dataclass
class _Run:
    """One `launch` under way: what came, which subnets refused, the error that ended it."""

    type_name: str
    count: int
    launched: list[Instance] = dataclasses.field(default_factory=list)
    refused: set[str] = dataclasses.field(default_factory=set)
    error: str | None = None

    @property
    def remaining(self) -> int:
        return self.count - len(self.launched)


def _with_instance_tag(specs: list[dict[str, Any]], key: str, value: str) -> list[dict[str, Any]]:
    """`specs` (TagSpecifications) with one more tag on the instance, leaving the input as it was."""
    return [
        dict(spec, Tags=[*spec["Tags"], {"Key": key, "Value": value}])
        if spec["ResourceType"] == "instance"
        else spec
        for spec in specs
    ]


def owner_tags(cluster_name: str, deployment: str = "") -> dict[str, str]:
    """The tags that mark an instance as owned by this daemon for `cluster_name`, and by this deployment
    (`DEPLOYMENT_TAG`: its swarm's id, see `ec2_identity`) when it has one."""
    tags = {OWNER_TAG: OWNER_VALUE, CLUSTER_TAG: cluster_name}
    if deployment:
        tags[DEPLOYMENT_TAG] = deployment
    return tags


class Ec2Cloud(Ec2Transport):
    """The Cloud port on EC2. Use `async with Ec2Cloud(...) as cloud`, or `start()` then `close()`."""

    def __init__(
        self,
        *,
        cluster_name: str,
        region: str,
        allowed_types: Mapping[str, tuple[str, str]],
        subnet_ids: Sequence[str],
        security_group_ids: Sequence[str],
        join_command: JoinCommand,
        endpoint: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        key_name: str | None = None,
        iam_instance_profile: str | None = None,
        custom_tags: Mapping[str, str] | None = None,
        capacities: Mapping[str, Sequence[str]] | None = None,
        capacity_backoff_initial: float = DEFAULT_INITIAL,
        capacity_backoff_max: float = DEFAULT_MAXIMUM,
        capacity_backoff_jitter: float = 0.2,
        spread_subnets: bool = True,
        metadata_hop_limit: int = DEFAULT_HOP_LIMIT,
        clock: Callable[[], float] | None = None,
        page_size: int = 1000,
        retry_attempts: int = 5,
        retry_initial: float = 0.5,
        retry_max: float = 20.0,
        timeout: float = 30.0,
        join_paused: bool = False,
        join_urls: Sequence[str] | ec2_join.JoinUrls = (),
    ) -> None:
        super().__init__(
            region=region,
            endpoint=endpoint,
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
            clock=clock,
            page_size=page_size,
            retry_attempts=retry_attempts,
            retry_initial=retry_initial,
            retry_max=retry_max,
            timeout=timeout,
        )
        self._cluster = cluster_name
        self.deployment = ""  # set once at start (`ec2_identity.claim`): this deployment's swarm id
        # A keeper cluster's autoscaler: its primary's instance ARN, from the keeper's listing
        # (`keeper_listing`); every machine launched then carries it (`PRIMARY_TAG`).
        self.primary_arn = ""
        self._failed_boots: set[str] = set()  # machines seen stopped by their own failed boot
        self._subnets = launch_subnets(subnet_ids)  # ("",) = let EC2 pick (default VPC)
        self._groups = list(security_group_ids)
        self._join_command = join_command
        self._join_paused = join_paused  # machines join paused (the dynamic mode: `Policy.join_paused`)
        # Set: user data carries a join ticket for the daemon's join endpoint at these URLs (or, `auto`,
        # the managers'), not the swarm join token (`ec2_join`, `join_tickets`).
        self.join_urls = ec2_join.join_urls(join_urls)
        self._types = dict(allowed_types)  # name -> (ami id, boot script)
        for name, (_, script) in self._types.items():
            check_user_data(name, script, self.join_urls.worst_case())  # over 16 KiB: every launch fails
        self._key_name = key_name
        self._profile = iam_instance_profile
        self._custom_tags = dict(custom_tags or {})
        self._backoff = CapacityBackoff(capacity_backoff_initial, capacity_backoff_max)
        self._backoff.capacities = {name: tuple(caps) for name, caps in (capacities or {}).items() if caps}
        self._jitter = capacity_backoff_jitter  # a refusal's pause is up to this fraction longer
        self._rng = random.Random()
        self._spread = spread_subnets
        self._spread_next: dict[str, int] = {}  # per type: where its next launch starts
        self._hop_limit = metadata_hop_limit
        self._quota_told: set[tuple[str, str, str]] = set()  # (type, capacity, code) logged since a success
        self._type_cache: dict[str, tuple[float, DescribedType]] = {}  # name -> (when described, type)
        self._validate()

    def _validate(self) -> None:
        if not self._cluster:
            raise ConfigurationError("cluster_name must not be empty: it is the ownership tag")
        reserved = (OWNER_TAG, CLUSTER_TAG, DEPLOYMENT_TAG, PRIMARY_TAG, NAME_TAG, LAUNCH_TOKEN_TAG)
        bad = [k for k in self._custom_tags if k in reserved or k.startswith(_RESERVED_PREFIXES)]
        if bad:
            raise ConfigurationError(f"custom EC2 tags {bad} use reserved keys; rename them")
        if not 1 <= self._hop_limit <= 64:
            raise ConfigurationError(
                f"metadata_hop_limit must be within 1..64 (EC2's), got {self._hop_limit}"
            )

    # ----------------------------------------------------------------------------------- listing

    @property
    def cluster_name(self) -> str:
        return self._cluster

    def _ownership_filters(self) -> list[dict[str, Any]]:
        return [
            {"Name": f"tag:{OWNER_TAG}", "Values": [OWNER_VALUE]},
            {"Name": f"tag:{CLUSTER_TAG}", "Values": [self._cluster]},
        ]

    def _owned(self, raw: Mapping[str, Any]) -> bool:
        """Ours: our ownership tags, no other deployment's id (a machine launched before deployment
        ids, without one, is this cluster name's), and not a copy of one of ours (`ec2_launch_token`: a
        launch-token tag that is not the machine's own ClientToken; logged once)."""
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", ())}
        theirs = tags.get(DEPLOYMENT_TAG, self.deployment)
        return (
            tags.get(OWNER_TAG) == OWNER_VALUE
            and tags.get(CLUSTER_TAG) == self._cluster
            and theirs == self.deployment
            and not self.launch_tokens.foreign(raw)
        )

    async def list_instances(self) -> tuple[Instance, ...]:
        """Every owned instance that is not terminated, all pages. Filtered server-side, and the
        ownership tags checked again here, so an endpoint that ignores tag filters exposes nothing."""
        filters = [*self._ownership_filters(), {"Name": "instance-state-name", "Values": list(LISTED_STATES)}]
        try:
            reservations = await self._pages("describe_instances", "Reservations", Filters=filters)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, "DescribeInstances", exc) from None
        owned = [raw for res in reservations for raw in res.get("Instances", ()) if self._owned(raw)]
        self._back_off_failed_boots(owned)
        found = (self._with_ownership(to_instance(raw)) for raw in owned)
        return tuple(sorted((i for i in found if i is not None), key=lambda i: (i.launched_at, i.id)))

    def _back_off_failed_boots(self, owned: list[dict[str, Any]]) -> None:
        """A machine whose boot failed stopped itself (`boot_scripts`): back its (type, subnet) off once,
        as a capacity refusal does, so the planner replaces it with another type or subnet for a while."""
        for raw in owned:
            iid = raw["InstanceId"]
            if iid in self._failed_boots or not stopped_by_itself(raw):
                continue
            self._failed_boots.add(iid)
            self._backoff.refused(raw["InstanceType"], raw.get("SubnetId", ""), self._clock())
        self._failed_boots &= {raw["InstanceId"] for raw in owned}

    def _with_ownership(self, instance: Instance | None) -> Instance | None:
        """The instance's node labels always include the ownership label: its EC2 tags prove it is ours,
        so its node gets the label when it joins, also for a machine launched by a version of the daemon
        whose launches did not carry the label yet."""
        if instance is None or instance.labels.get(OWNERSHIP_LABEL) == self._cluster:
            return instance
        labels = MappingProxyType({**instance.labels, OWNERSHIP_LABEL: self._cluster})
        return dataclasses.replace(instance, labels=labels)

    async def instance_types(self, names: Sequence[str]) -> tuple[InstanceType, ...]:
        """The named types as EC2 describes them (`ec2_types`), without prices, each cached for
        `TYPE_TTL` seconds on EC2's clock. Raises ConfigurationError (one line) naming the types the
        region does not offer."""
        now = self._clock()
        stale = [
            n for n in dict.fromkeys(names) if now - self._type_cache.get(n, (-TYPE_TTL, None))[0] >= TYPE_TTL
        ]
        if stale:
            for name, found in (await describe_types(self, stale)).items():
                self._type_cache[name] = (now, found)  # unpriced: the daemon prices the types itself
        return tuple(self._type_cache[n][1].itype for n in names)

    async def offered_types(self) -> tuple[InstanceType, ...]:
        """Every type the region offers (all pages), without prices."""
        return tuple(found.itype for found in (await offered_types(self)).values())

    async def check_images(self) -> None:
        """Each allowed type's AMI exists and suits the type's architecture (after `instance_types`):
        ConfigurationError in one line naming the type and the AMI otherwise."""
        described = {n: entry for n, (_, entry) in self._type_cache.items() if n in self._types}
        await check_images(self, {n: spec[0] for n, spec in self._types.items()}, described)

    async def spot_prices(self, names: Sequence[str]) -> dict[str, float]:
        """The current spot price (USD per hour, Linux) of each of `names` that EC2 quotes: the highest
        across the zones it quotes, as a launch may land in any subnet's zone. Raises EndpointError."""
        if not names:
            return {}
        try:
            history = await self._pages(
                "describe_spot_price_history",
                "SpotPriceHistory",
                InstanceTypes=list(dict.fromkeys(names)),
                ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=self._clock(),  # from now: only each zone's current price
            )
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, "DescribeSpotPriceHistory", exc) from None
        prices: dict[str, float] = {}
        for entry in history:
            try:
                price = float(entry["SpotPrice"])
            except (KeyError, ValueError):
                continue
            name = entry.get("InstanceType", "")
            if name in names and price > 0:
                prices[name] = max(price, prices.get(name, 0.0))
        return prices

    # ----------------------------------------------------------------------------------- launching

    def unavailable(self, now: float) -> tuple[Unavailable, ...]:
        return self._backoff.unavailable(now)

    async def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
    ) -> LaunchResult:
        """Launch up to `count` machines: per capacity in order (spot everywhere before on-demand
        anywhere), spread over the open subnets; each RunInstances asks for at least one and takes what
        EC2 gives (a shortfall moves on to the next subnet, see `ec2_launch`).

        Refusals come back in `refused`; another EC2 error ends the attempt with `error` (keeping what was
        launched). An endpoint failure before anything launched raises EndpointError.
        """
        if count <= 0:
            return LaunchResult()
        self.stats.instances_requested += count
        prepared = await self._prepare_launch(type_name, labels, pool)
        if isinstance(prepared, str):
            return LaunchResult(error=prepared)
        run = _Run(type_name, count)
        capacities = (ON_DEMAND,) if pool else self._backoff.capacities.get(type_name, (ON_DEMAND,))
        start = self._spread_next.get(type_name, 0)
        self._spread_next[type_name] = start + 1  # the next launch of the type starts one zone further
        for capacity in capacities:
            if run.remaining <= 0 or run.error is not None:
                break
            await self._launch_with(run, prepared, capacity, start)
        blocked = [u for u in self.unavailable(self._clock()) if u.type_name == type_name]
        refused = [u for u in blocked if u.subnet_id in run.refused]
        if not run.launched and not refused:
            refused = blocked
        return LaunchResult(tuple(run.launched), tuple(refused), run.error)

    async def _launch_with(self, run: _Run, params: dict[str, Any], capacity: str, start: int) -> None:
        """One capacity: each open subnet in turn asked for its share of what is still missing; then the
        subnets that gave all they were asked for take the rest."""
        subnets = self._backoff.open_subnets(run.type_name, self._subnets, self._clock(), capacity)
        order = rotated(subnets, start) if self._spread else subnets
        gave_all: list[str] = []
        for i, subnet in enumerate(order):
            if run.remaining <= 0:
                return
            ask = share(run.remaining, len(order) - i) if self._spread else run.remaining
            got = await self._launch_in(run, subnet, ask, params, capacity)
            if got is None:
                return
            if got == ask:
                gave_all.append(subnet)
        for subnet in gave_all if len(order) > 1 else ():
            if (
                run.remaining <= 0
                or await self._launch_in(run, subnet, run.remaining, params, capacity) is None
            ):
                return

    async def _launch_in(
        self, run: _Run, subnet: str, ask: int, params: dict[str, Any], capacity: str
    ) -> int | None:
        """RunInstances for up to `ask` machines in `subnet`: how many came, or None when this capacity
        is out everywhere (a quota) or the launch failed (`run.error`)."""
        try:
            instances = await self._run_instances(run.type_name, subnet, ask, params, capacity)
        except (ClientError, BotoCoreError) as exc:
            kind = refusal_kind(exc, capacity)
            if kind == "zone":
                self.stats.capacity_refusals += 1
                self._refuse(run, (subnet,), capacity)
                return 0
            if kind == "quota":
                self._quota_refused(run, capacity, exc)
                return None
            if is_endpoint_failure(exc) and not run.launched:
                raise to_endpoint_error(self.endpoint, "RunInstances", exc) from None
            where = f" in {subnet}" if subnet else ""
            run.error = f"RunInstances {run.type_name} ({capacity}){where} failed: {error_message(exc)}"
            return None
        run.launched.extend(instances)
        if len(instances) < ask:  # the zone gave what it had: it is out of the type for now
            self.stats.partial_launches += 1
            self._refuse(run, (subnet,), capacity)
        else:
            self._backoff.succeeded(run.type_name, subnet, capacity)
            self._quota_told.difference_update(
                {k for k in self._quota_told if k[:2] == (run.type_name, capacity)}
            )
        return len(instances)

    def _refuse(self, run: _Run, subnets: Sequence[str], capacity: str) -> None:
        now = self._clock()
        for subnet in subnets:
            jitter = self._rng.uniform(0.0, self._jitter) if self._jitter else 0.0
            self._backoff.refused(run.type_name, subnet, now, capacity, jitter)
            run.refused.add(subnet)

    def _quota_refused(self, run: _Run, capacity: str, exc: BaseException) -> None:
        """A quota: no subnet can help. Blocked everywhere, counted, and told once until a success."""
        code = error_code(exc)
        self.stats.quota_refusals[(run.type_name, capacity, code)] += 1
        self._refuse(run, self._subnets, capacity)
        if (run.type_name, capacity, code) not in self._quota_told:
            self._quota_told.add((run.type_name, capacity, code))
            log.error(quota_advice(run.type_name, capacity, code, self._region), error=error_message(exc))

    def use_boot_scripts(self, scripts: Mapping[str, str]) -> None:
        """Replace the boot scripts of known types (the daemon re-renders them once EC2 has described the
        types, so each machine's worker publishes the resources the planner counts on)."""
        for name, script in scripts.items():
            if name in self._types:
                check_user_data(name, script, self.join_urls.worst_case())
                self._types[name] = (self._types[name][0], script)

    async def _prepare_launch(
        self, type_name: str, labels: Mapping[str, str], pool: bool = False
    ) -> dict[str, Any] | str:
        """The RunInstances parameters shared by every subnet, or an error message. A launch into the
        warm pool runs the boot script and stops itself, without joining (`render_pool_user_data`)."""
        spec = self._types.get(type_name)
        if spec is None:
            return f"instance type {type_name} is not among the allowed types {sorted(self._types)}"
        ami_id, boot_script = spec
        tags = self._instance_tags(labels)
        if pool:
            tags[POOL_TAG] = PoolPhase.PREPARE.value
        # the launch token, spot, the join ticket's nonce
        more = 1 + (SPOT in self._backoff.capacities.get(type_name, ())) + self.join_urls.on
        if len(tags) + more > MAX_TAGS:
            return f"{len(tags)} tags (ownership, labels, custom) exceed EC2's limit of {MAX_TAGS}"
        if pool:
            user_data = render_pool_user_data(boot_script)
        else:
            try:
                user_data, join_tags = await ec2_join.join_user_data(self, boot_script)
            except AutoscalerError as exc:
                return f"cannot read the swarm join command: {exc}"
            tags.update(join_tags)  # the join ticket's nonce
        if len(user_data.encode()) > USER_DATA_LIMIT:
            return f"user data for {type_name} exceeds EC2's {USER_DATA_LIMIT} bytes: shorten the boot script"
        params: dict[str, Any] = {
            "ImageId": ami_id,
            "InstanceType": type_name,
            "UserData": user_data,  # botocore base64-encodes it
            "MetadataOptions": metadata_options(self._hop_limit),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]},
                {
                    "ResourceType": "volume",
                    "Tags": [{"Key": k, "Value": v} for k, v in self._launch_owner_tags().items()],
                },
            ],
        }
        if pool:
            params["InstanceInitiatedShutdownBehavior"] = "stop"  # its `shutdown` stops it into the pool
        if self._groups:
            params["SecurityGroupIds"] = self._groups
        if self._key_name:
            params["KeyName"] = self._key_name
        if self._profile:
            key = "Arn" if self._profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: self._profile}
        return params

    def _instance_tags(self, labels: Mapping[str, str]) -> dict[str, str]:
        tags = {NAME_TAG: f"{self._cluster}-worker", **self._custom_tags}
        tags.update({f"{LABEL_TAG_PREFIX}{k}": str(v) for k, v in labels.items()})
        tags.update(self._launch_owner_tags())  # last: nothing may override ownership
        return tags

    def _launch_owner_tags(self) -> dict[str, str]:
        """Ownership at launch (instance and volume): `owner_tags`, and the primary's ARN when known."""
        tags = owner_tags(self._cluster, self.deployment)
        if self.primary_arn:
            tags[PRIMARY_TAG] = self.primary_arn
        return tags

    async def _run_instances(
        self, type_name: str, subnet: str, count: int, params: dict[str, Any], capacity: str = ON_DEMAND
    ) -> list[Instance]:
        # at least one, as many as the zone has up to `count`: EC2 fills what it can (the shortfall moves
        # on to the next subnet); all-or-nothing would give none when a zone has 3 of 5
        # the ClientToken also goes in a tag: a copy of the machine is then told from it (`ec2_launch_token`)
        call = with_launch_token(dict(params, MinCount=1, MaxCount=count), uuid.uuid4().hex)
        if subnet:
            call["SubnetId"] = subnet
        if capacity == SPOT:
            call["TagSpecifications"] = _with_instance_tag(call["TagSpecifications"], CAPACITY_TAG, SPOT)
            # one-time (no persistent request to clean up), terminated on interruption: the daemon
            # replaces the machine; EC2 cannot stop or hibernate a one-time spot instance
            call["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        self.stats.launch_calls += 1
        result = await self._call("run_instances", **call)
        self.launch_tokens.answered(result.get("Instances", ()))
        instances = [i for i in (to_instance(raw) for raw in result.get("Instances", ())) if i]
        self.stats.instances_launched += len(instances)
        for instance in instances:
            await self._tag_hostname(instance)
        return instances

    async def _tag_hostname(self, instance: Instance) -> None:
        """Keep the hostname in a tag (one call per instance: the values differ). Best effort: without it
        only a node that joins as its machine is being terminated could be missed once EC2 drops the
        terminated instance's DNS name."""
        if not instance.hostname:
            return
        tag = [{"Key": HOSTNAME_TAG, "Value": instance.hostname}]
        try:
            async for attempt in self._while_new():
                with attempt:
                    await self._call("create_tags", Resources=[instance.id], Tags=tag)
        except (ClientError, BotoCoreError):
            self.stats.hostname_tag_failures += 1

    def _while_new(self) -> AsyncRetrying:
        """Retries of a call about an id RunInstances just returned, while EC2 answers that it does not
        know it (it is eventually consistent: a new id can be unknown for seconds), a bounded number of
        times (`NEW_ID_ATTEMPTS`, under 10 s in all with the default back-off)."""
        _, initial, maximum = self._retry

        def unknown_yet(exc: BaseException) -> bool:
            if error_code(exc) in GONE_CODES:
                self.stats.new_id_not_found += 1
                return True
            return False

        return AsyncRetrying(
            retry=retry_if_exception(unknown_yet),
            wait=wait_exponential_jitter(multiplier=initial, max=min(maximum, 2.0), jitter=initial),
            stop=stop_after_attempt(NEW_ID_ATTEMPTS),
            reraise=True,
        )

    # ----------------------------------------------------------------------------------- terminating

    async def machines_at(self, address: str) -> tuple[ec2_join.JoiningMachine, ...]:
        """Our live instances whose private IP is `address`, read now (the join endpoint's check)."""
        return await ec2_join.machines_at(self, address)

    async def start_instances(self, instance_ids: Sequence[str]) -> LaunchResult:
        """Start stopped warm-pool machines so that they join on this boot (see `ec2_pool`)."""
        return await ec2_pool.start_instances(self, instance_ids)

    async def stop_instances(self, instance_ids: Sequence[str]) -> None:
        """Stop owned machines into the warm pool (see `ec2_pool`)."""
        await ec2_pool.stop_instances(self, instance_ids)

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        """Check ownership of all ids in one describe, then terminate the live ones in batches."""
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return
        try:
            found = await self._describe_ids(ids)
            foreign = sorted(raw["InstanceId"] for raw in found if not self._owned(raw))
            if foreign:
                raise ConfigurationError(
                    f"refusing to terminate {foreign}: not tagged as owned by cluster {self._cluster!r}"
                )
            live = [raw["InstanceId"] for raw in found if raw["State"]["Name"] != "terminated"]
            for batch in chunks(live, TERMINATE_BATCH):
                await self._terminate_batch(batch)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, "TerminateInstances", exc) from None

    async def _terminate_batch(self, batch: list[str]) -> None:
        try:
            await self._call("terminate_instances", InstanceIds=batch)
        except ClientError as exc:
            if error_code(exc) not in GONE_CODES:
                raise
            # one id vanished since the describe: the rest still need terminating, one by one
            for instance_id in batch if len(batch) > 1 else ():
                await self._terminate_batch([instance_id])
