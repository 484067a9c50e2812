"""The daemon's configuration: environment variables prefixed `AUTOSCALER_`, validated once at start-up.

`Settings` composes one group per concern; each group is a `BaseSettings` with its own prefix, so
`Settings()` alone reads every group from the environment. `load_settings()` is the way in for the
daemon: it also reads an optional env file, validates every group even when an earlier one fails, and
turns pydantic's errors into `InvalidSettingsError.problems`: one operator-facing line per wrong
variable, naming the variable and what it expects, never echoing a secret.

Complex values (allowed types, tags) are written as JSON; id lists as JSON or comma separated.
Durations are seconds as floats and accept `30`, `30s`, `5m`, `1h30m` or `250ms` (see `durations`).

Why one file of this size: it is the daemon's whole configuration surface, one model per `AUTOSCALER_`
group in the order the generated reference shows them; value types are in `types`, durations in
`durations`, and the loader stays beside the models whose errors it words.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from swarm_autoscaler.config import envfile
from swarm_autoscaler.config.budgets import Budgets
from swarm_autoscaler.config.durations import format_duration
from swarm_autoscaler.config.types import (
    MAX_FLEET,
    MEMORY_OVERHEAD_PERCENT,
    AllowedType,
    AllowedTypes,
    ClusterName,
    DockerUrl,
    Duration,
    Ec2Endpoint,
    IdList,
    RedisUrl,
    SchedulerUrl,
    Tags,
)
from swarm_autoscaler.core.backoff import DEFAULT_INITIAL, DEFAULT_MAXIMUM
from swarm_autoscaler.errors import ConfigurationError

PREFIX = "AUTOSCALER_"


_S = TypeVar("_S", bound=BaseSettings)


def _read(cls: type[_S], env_file: Path | None = None, **values: Any) -> _S:
    """Build a settings class from `values`, the environment and `env_file` (in that precedence)."""
    return cls(_env_file=env_file, **values)


def read_group(cls: type[_S], env_file: Path | None) -> tuple[_S | None, list[str]]:
    """One settings group from the environment and `env_file`: the group, or None and one line per
    wrong variable. Other loaders (the simulator's) read the groups they need through this."""
    try:
        return _read(cls, env_file), []
    except (ValidationError, SettingsError) as exc:
        return None, _problems(exc, cls)


def env_path(env_file: str | os.PathLike[str] | None) -> Path | None:
    """The env file as a Path. Raises `InvalidSettingsError` with one line when it does not exist, is not
    UTF-8 text, or has a line the env-file parser cannot read (see `envfile.problem`)."""
    if env_file is None:
        return None
    path = Path(env_file)
    wrong = envfile.problem(path)
    if wrong is not None:
        raise InvalidSettingsError([wrong])
    return path


def _from_env(cls: type[_S]) -> Callable[[], _S]:
    return lambda: _read(cls)


def group_config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix=prefix,
        extra="ignore",  # the groups share one prefix and one env file: each ignores the others' keys
        enable_decoding=False,  # JSON is decoded by our validators, which give readable errors
        env_ignore_empty=True,  # `AUTOSCALER_X=` means "not set"
        frozen=True,
    )


# ------------------------------------------------------------------------------------------ groups


class TimingSettings(BaseSettings):
    """Timing of the control loop and of the node lifecycle. All values are seconds."""

    model_config = group_config(PREFIX)

    poll_interval: Duration = Field(
        default=5.0, gt=0, description="Time between two ticks of the control loop."
    )
    act_concurrency: int = Field(
        default=16,
        ge=1,
        le=256,
        description=(
            "How many actions a tick carries out at once (node updates, scheduler calls, launches; all "
            "terminations of a tick go in one EC2 call). A tick's deadline is 2 poll intervals: what is "
            "not done by then is left to the next tick."
        ),
    )
    max_start_time: Duration = Field(
        default=600.0, description="A machine whose node or worker is not up after this long is broken."
    )
    drain_delay: Duration = Field(
        default=60.0, description="How long an active node must be empty to be drained."
    )
    termination_delay: Duration = Field(
        default=60.0,
        description=(
            "How long a drained node beyond the reserve waits before it is terminated. Work that comes back "
            "within it reactivates the node without a new boot; every machine that leaves pays for it. "
            "The default comes from the cost/wait frontier measured on the bundled scenarios (docs/lab, "
            "Cost against wait)."
        ),
    )
    idle_learning: bool = Field(
        default=True,
        description=(
            "Keep an idle machine only while it pays: per instance type, from the arrivals of work seen, a "
            "machine whose next task is expected later than a relaunch would cost (twice the tolerated "
            "wait) is drained after AUTOSCALER_IDLE_FLOOR and terminated at once, instead of after the drain "
            "and termination delays (the ski-rental break-even; docs/planning.md). false: the delays always."
        ),
    )
    idle_floor: Duration = Field(
        default=5.0,
        description="Under AUTOSCALER_IDLE_LEARNING, how long an idle machine whose next task is expected "
        "later than a relaunch costs is kept before it is drained (then terminated at once); at most "
        "AUTOSCALER_DRAIN_DELAY.",
    )
    node_down_timeout: Duration = Field(
        default=300.0, description="How long a swarm node may be down before it is removed and terminated."
    )
    consolidate_below: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "Consolidation: a dask worker using at most this fraction of its machine is cordoned (gets no "
            "new tasks; its running tasks finish) while others of its instance type have room for its "
            "tasks, so that it empties and is drained. 0 turns consolidation off."
        ),
    )
    consolidate_under_load: bool = Field(
        default=True,
        description=(
            "Consolidate also while work is pending, when every pending task fits on machines that are "
            "up (Karpenter's WhenEmptyOrUnderutilized); cordoned workers are then drained as they empty. "
            "Cheaper under a steady stream of tasks, at some waiting: false consolidates only when "
            "nothing is pending."
        ),
    )
    max_unready_share: float = Field(
        default=0.45,
        ge=0.0,
        le=1.0,
        description=(
            "The safety stop: while more than this share of the daemon's nodes (and at least two) are down "
            "or unreachable, as in a network partition, scale-down halts: no idle machine is retired, "
            "drained, cordoned, stopped or terminated, no long-down machine is terminated, and no machine "
            "whose node joined but is down is terminated as broken (a repair a partition can fake); "
            "scale-up goes on, and so do the repairs a partition cannot fake. Cluster Autoscaler's default "
            "(--max-total-unready-percentage). 1 turns it off."
        ),
    )
    disruption_budgets: Budgets = Field(
        default=(),
        json_schema_extra={"example": '[{"nodes": "20%"}]'},
        description=(
            'Disruption budgets (Karpenter\'s), as a JSON list: each {"nodes": "N" or "P%" of the '
            'nodes (rounded up), "reasons": of empty, consolidation, drift, expiry (default all), '
            '"days": of mon..sun (default every day), "start"/"end": HH:MM UTC (default the '
            "whole day)} bounds how many machines are in disruption at once for those reasons while in "
            "its window; the smallest active one wins. Interruptions and repairs are exempt. Empty: no "
            'bound. Example: [{"nodes": "20%"}, {"nodes": "0", "reasons": ["drift"], '
            '"days": ["mon", "tue", "wed", "thu", "fri"], "start": "09:00", '
            '"end": "17:00"}].'
        ),
    )
    max_machine_age: Duration = Field(
        default=0.0,
        description=(
            "Expiry (Karpenter's expireAfter): a machine older than this is replaced, replacement first (a "
            "new one of its type is launched and the old one takes no new task, then leaves once empty), "
            "within the disruption budgets for expiry and never while do-not-disrupt holds it. 0: never."
        ),
    )
    tolerated_wait: Duration = Field(
        default=120.0,
        description=(
            "A task queued behind a busy worker buys a new machine only if dask's duration estimates say "
            "it would wait there longer than this. The default is about what a new machine takes to run "
            "a task (boot, swarm join, worker start): a task held back would not have started sooner on "
            "a new machine, as far as the estimates hold. Raise it to trade waiting for money. A task "
            "without an estimate always counts. 0: every queued task may buy a machine."
        ),
    )
    capacity_backoff_initial: Duration = Field(
        default=DEFAULT_INITIAL,
        gt=0,
        description=(
            "First pause before retrying a type EC2 refused for lack of capacity in a subnet (a shortage "
            "usually lasts minutes; Karpenter skips such an offering for 3 minutes)."
        ),
    )
    capacity_backoff_max: Duration = Field(
        default=DEFAULT_MAXIMUM,
        gt=0,
        description="Longest such pause (it doubles on each refusal up to this).",
    )

    @field_validator("capacity_backoff_max")
    @classmethod
    def _backoff_order(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("capacity_backoff_initial")
        if initial is not None and value < initial:
            raise PydanticCustomError(
                "order",
                "must be at least {other} ({initial})",
                {"other": env_name(cls, "capacity_backoff_initial"), "initial": format_duration(initial)},
            )
        return value


class Ec2AccessSettings(BaseSettings):
    """The EC2 endpoint, credentials and where new machines go: shared by the daemon and the keeper."""

    model_config = group_config(f"{PREFIX}EC2_")

    endpoint: Ec2Endpoint | None = Field(
        default=None, description="EC2 API endpoint URL (for an EC2-compatible server); unset means AWS."
    )
    region: str = Field(default="us-east-1", min_length=1, description="AWS region.")
    access_key_id: SecretStr | None = Field(
        default=None, description="AWS access key id; unset means the default AWS credential chain."
    )
    secret_access_key: SecretStr | None = Field(
        default=None, description="AWS secret access key; set together with the access key id."
    )
    subnet_ids: IdList = Field(
        default_factory=list,
        description="Subnet ids to launch into (JSON list or comma separated); empty = default.",
    )
    security_group_ids: IdList = Field(
        default_factory=list, description="Security group ids of new machines (JSON list or comma separated)."
    )
    key_name: str | None = Field(default=None, description="EC2 key pair of new machines; unset means none.")
    iam_instance_profile: str | None = Field(
        default=None, description="IAM instance profile (name or ARN) of new machines; unset means none."
    )
    custom_tags: Tags = Field(
        default_factory=dict, description="Extra tags on new machines, as a JSON object."
    )

    @field_validator("secret_access_key")
    @classmethod
    def _credentials_pair(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if "access_key_id" not in info.data:  # the id itself is invalid and already reported
            return value
        if (value is None) != (info.data["access_key_id"] is None):
            raise PydanticCustomError(
                "pair",
                "set both {a} and {b}, or neither",
                {"a": env_name(cls, "access_key_id"), "b": env_name(cls, "secret_access_key")},
            )
        return value


class Ec2Settings(Ec2AccessSettings):
    """The EC2 endpoint, credentials, allowed instance types and fleet limits."""

    allowed_types: AllowedTypes = Field(
        description='Instance types the fleet may use, as a JSON object: type name -> {"ami_id" (required), '
        '"reserve" (drained machines kept warm, default 0), "reserve_idle_limit" (a duration: the reserve is let '
        "go once no machine of the type worked for this long, and refilled when it works again; default 0: "
        'kept always), "min" (machines of the type always running, '
        'default 0), "warm_pool" (stopped machines kept ready to start, default 0; each costs its EBS '
        'volume), "price_per_hour" (USD, wins over the AWS Price List everywhere; required for each type when the daemon may not call pricing:GetProducts), '
        '"overhead" ({"cpus", "ram_gib", "gpus"} kept back for the OS and sidecars), "boot_script" (shell '
        'run at boot), "surge_above" (while a worker of the type is up, launch more of it only when more '
        'than this many pending tasks would go on them; default 0: for any), "capacity" (the EC2 '
        'capacity to launch with, tried in order: ["on-demand"] (default) or ["spot", "on-demand"] for spot '
        'with an on-demand fallback), "spot_price_per_hour" (USD; with spot first, the price the cheapest '
        "fit uses)}. Key order is the order of "
        "preference on price ties.",
        json_schema_extra={"example": '{"m5.large": {"ami_id": "ami-0123456789abcdef0", "reserve": 1}}'},
    )
    min_instances: int = Field(
        default=0, ge=0, le=MAX_FLEET, description="Fewest machines kept (live plus launching)."
    )
    max_instances: int = Field(
        default=10, ge=0, le=MAX_FLEET, description="Most machines at once (live plus launching)."
    )
    max_launch_per_tick: int = Field(
        default=0, ge=0, le=MAX_FLEET, description="Most machines launched per tick; 0 = no cap."
    )
    pull_images: IdList = Field(
        default_factory=list,
        description="Images every new machine pulls at boot, after its boot script and before it joins (JSON "
        "list or comma separated; pinned by tag or digest): the worker image, typically. For an ECR image "
        "(<account>.dkr.ecr.<region>.amazonaws.com/...) the machine first logs in to that registry with its "
        "instance role (the AWS CLI on the AMI; the role needs ecr:GetAuthorizationToken, "
        "ecr:BatchGetImage, ecr:GetDownloadUrlForLayer), since the credentials swarm got at deploy time "
        "expire after 12 hours. A failed login or pull fails the boot, which says so. Empty = none.",
        json_schema_extra={"example": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/dask-worker:1.4.0"},
    )
    memory_overhead_percent: float = Field(
        default=MEMORY_OVERHEAD_PERCENT,
        ge=0,
        lt=50,
        description="Share of each type's memory (as EC2 describes it) kept back for the kernel, dockerd and "
        "the machine's agents, on top of the type's own \"overhead\": the workers publish the rest as their "
        "RAM and use it as their memory limit, and the planner counts the same. 7.5 is Karpenter's VM "
        "memory overhead; 0 publishes the type's whole memory (a task sized to it can take the machine down).",
    )
    spot_price_interval: Duration = Field(
        default=600.0,
        gt=0,
        description="How often the spot prices of the types launched spot first (without a "
        '"spot_price_per_hour") are read again from EC2 for the cheapest-fit choice; on-demand prices are '
        "read from the AWS Price List once a day.",
    )
    spread_subnets: bool = Field(
        default=True,
        description="Share each launch out over the subnets (zones) of AUTOSCALER_EC2_SUBNET_IDS, starting one "
        "zone further each time, so that a zone's outage or shortage takes only its share. false: fill the "
        "subnets in the order listed (the next only when one refuses).",
    )
    metadata_hop_limit: int = Field(
        default=2,
        ge=1,
        le=64,
        description="New machines require IMDSv2 (session tokens) from their metadata service; this is the "
        "token's hop limit. 2 lets containers on a docker network (one hop further than the machine) use "
        "the machine's instance profile, as dask tasks reading from S3 do; 1 keeps every container away "
        "from it. The managers that run this daemon in a container need 2 on their own machines.",
    )
    interruption_queue_url: str = Field(
        default="",
        pattern=r"^(https?://\S+)?$",
        description="URL of the SQS queue EventBridge feeds with EC2's spot interruption warnings, "
        "rebalance recommendations and scheduled changes (see the spot page); the daemon retires the "
        "worker of each machine of ours named there (dask moves its results), replaces the machine at "
        "once and terminates it. Empty = notices are not read.",
        json_schema_extra={"example": "https://sqs.us-east-1.amazonaws.com/123456789012/swarm-interruptions"},
    )

    adopt_by_address: bool = Field(
        default=False,
        description="Adopt a joining node only when swarm's address for it (the source of its mutually "
        "authenticated connection) is the private IP of the instance whose hostname it carries: a machine "
        "in the VPC that took a pending machine's hostname (with the join token from user data) is then "
        "left unowned. Needs the workers to reach the managers without NAT (docs/security.md).",
    )
    join_url: IdList = Field(
        default_factory=list,
        description="Where new machines reach this daemon's join endpoint, POST /v1/join over TLS on "
        "AUTOSCALER_EC2_JOIN_PORT: `auto` (every manager's address as swarm advertises it to workers, read at "
        "each launch; docker/stack.join.yml publishes the port in host mode on the managers), or https:// "
        "URLs as a JSON list or comma separated (each tried in turn, so name every manager that may run a "
        "replica; http:// is refused: the endpoint answers the swarm join token, which must not cross the "
        "VPC in clear). Set: a machine's user data carries a one-use join ticket and the pin of the "
        "endpoint's key, not the swarm join token, and the daemon answers the token only to one of its own "
        "machines booting, asking from its private IP, and adopts a node only once that machine confirmed it "
        "the same way (docs/security.md). The port must be reached from the "
        "workers' subnets without NAT or the swarm routing mesh (docs/deployment.md). Empty = the swarm join "
        "token in every machine's user data, as before (the daemon warns at start).",
        json_schema_extra={
            "example": "https://10.0.0.10:8443/v1/join,https://10.0.1.10:8443/v1/join",
            "template": "auto",  # .env.template sets it: the README's deployment (docker/stack.join.yml)
        },
    )
    join_port: int = Field(
        default=8443,
        ge=1,
        le=65535,
        description="TCP port of the join endpoint (TLS, with a key derived from the swarm join token and "
        "pinned in each machine's user data: docs/security.md), served on AUTOSCALER_HTTP_HOST when "
        "AUTOSCALER_EC2_JOIN_URL is set; `auto` URLs name it. It serves nothing but POST /v1/join. Must "
        "differ from AUTOSCALER_HTTP_PORT.",
    )
    listing_url: str = Field(
        default="",
        pattern=r"^(https?://\S+)?$",
        description="A keeper cluster's autoscaler only (the keeper sets it): read this cluster's instances "
        "from the keeper's listing at this URL instead of calling DescribeInstances every tick, so that one "
        "paged read by the keeper serves every cluster. Empty = list from EC2.",
        json_schema_extra={"example": "https://keeper.example.com/v1/primaries/c-0123456789abcdef/instances"},
    )
    listing_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for `AUTOSCALER_EC2_LISTING_URL` (the keeper sets it: read-only, this "
        "cluster's listing only).",
        json_schema_extra={"example": "3f5c0e1d2b4a69788a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f"},
    )
    listing_token_file: str | None = Field(
        default=None,
        description="A file holding `AUTOSCALER_EC2_LISTING_TOKEN` (a swarm secret; wins over it). The "
        "keeper's boot script sets it: the primary gets its token in its one-time credentials fetch, so the "
        "token is never in user data.",
        json_schema_extra={"example": "/run/secrets/keeper-listing-token"},
    )
    listing_ca_file: str | None = Field(
        default=None,
        description="PEM certificate of the CA an https:// `AUTOSCALER_EC2_LISTING_URL` is verified with (the "
        "keeper's boot script sets it when the keeper names one); unset: the system's trusted CAs.",
        json_schema_extra={"example": "/run/secrets/keeper-ca"},
    )

    @field_validator("join_url")
    @classmethod
    def _join_urls(cls, value: list[str]) -> list[str]:
        if "auto" in value:
            if value != ["auto"]:
                raise PydanticCustomError(
                    "url", "`auto` alone, or URLs without it, got {value}", {"value": value}
                )
            return value
        bad = [u for u in value if not re.fullmatch(r"https://[^\s/]+/\S*", u)]
        if bad:
            raise PydanticCustomError(
                "url",
                "each must be an https:// URL (the join endpoint serves TLS only, on AUTOSCALER_EC2_JOIN_PORT: "
                "the swarm join token must not cross the VPC in clear), or `auto`; got {bad}",
                {"bad": bad},
            )
        return value

    @property
    def join_auto(self) -> bool:
        """`AUTOSCALER_EC2_JOIN_URL=auto`: the join URLs are the managers' (`ec2_join.JoinUrls`)."""
        return self.join_url == ["auto"]

    @field_validator("max_instances")
    @classmethod
    def _limits(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min_instances")
        if low is not None and value < low:
            raise PydanticCustomError(
                "order",
                "must be at least {other} ({low})",
                {"other": env_name(cls, "min_instances"), "low": low},
            )
        types: dict[str, AllowedType] = info.data.get("allowed_types") or {}
        reserve = sum(t.reserve for t in types.values())
        if reserve > value:
            raise PydanticCustomError(
                "reserve",
                "must be at least the sum of the reserves in {other} ({reserve})",
                {"other": env_name(cls, "allowed_types"), "reserve": reserve},
            )
        _pool_limits(cls, value, types)
        return value


def _pool_limits(cls: type[BaseModel], maximum: int, types: Mapping[str, AllowedType]) -> None:
    """The per-type bases ("min") and reserves run at once, so together they fit in the maximum; a warm
    pool runs only once started, when it comes out of the same maximum, so each pool fits in it too."""
    based = sum(t.min + t.reserve for t in types.values())
    if based > maximum:
        raise PydanticCustomError(
            "base",
            'must be at least the sum of the "min" and "reserve" of every type in {other} ({based})',
            {"other": env_name(cls, "allowed_types"), "based": based},
        )
    pooled = sum(t.warm_pool for t in types.values())
    if pooled > maximum:
        raise PydanticCustomError(
            "pool",
            'must be at least the sum of the "warm_pool" of every type in {other} ({pooled}): a started '
            "pool machine counts toward it",
            {"other": env_name(cls, "allowed_types"), "pooled": pooled},
        )


class DaskSettings(BaseSettings):
    """Where the dask scheduler is and how workers map to swarm nodes."""

    model_config = group_config(f"{PREFIX}DASK_")

    scheduler_url: SchedulerUrl | None = Field(
        default=None,
        description="Address of the dask scheduler (unused in the dynamic mode).",
        json_schema_extra={
            "example": "tcp://dask-scheduler:8786",
            "required_when": "AUTOSCALER_MODE=computational",
        },
    )
    tls_ca_file: str | None = Field(
        default=None,
        description="For a tls:// scheduler: the CA certificate (PEM file) that signed the scheduler's and "
        "this autoscaler's certificates. Set it with AUTOSCALER_DASK_TLS_CERT_FILE and _KEY_FILE.",
        json_schema_extra={"example": "/run/secrets/dask-ca.pem"},
    )
    tls_cert_file: str | None = Field(
        default=None,
        description="For a tls:// scheduler: this autoscaler's certificate (PEM file), signed by the CA.",
        json_schema_extra={"example": "/run/secrets/dask-worker.pem"},
    )
    tls_key_file: str | None = Field(
        default=None,
        description="For a tls:// scheduler: the private key (PEM file) of AUTOSCALER_DASK_TLS_CERT_FILE.",
        json_schema_extra={"example": "/run/secrets/dask-worker-key.pem"},
    )
    worker_hostname_pattern: str = Field(
        default=r"^(?P<hostname>.+)$",
        description="Regular expression searched in a worker's name; its named group `hostname` is the "
        "hostname of the worker's swarm node. The default takes the whole name.",
    )

    @field_validator("worker_hostname_pattern")
    @classmethod
    def _has_hostname_group(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise PydanticCustomError(
                "regex", "expected a regular expression ({why})", {"why": str(exc)}
            ) from None
        if "hostname" not in compiled.groupindex:
            raise PydanticCustomError("regex", "expected a regular expression with a group (?P<hostname>...)")
        return value

    @model_validator(mode="after")
    def _tls_all_or_none(self) -> DaskSettings:
        files = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if any(files) and not all(files):
            raise PydanticCustomError(
                "tls", "set all three of the TLS_CA_FILE, TLS_CERT_FILE and TLS_KEY_FILE, or none"
            )
        if all(files) and not (self.scheduler_url or "").startswith("tls://"):
            raise PydanticCustomError("tls", "the TLS files need a tls:// AUTOSCALER_DASK_SCHEDULER_URL")
        return self

    @property
    def tls_files(self) -> tuple[str, str, str] | None:
        """(CA, certificate, key) when the scheduler speaks TLS, else None."""
        if self.tls_ca_file and self.tls_cert_file and self.tls_key_file:
            return (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        return None

    def hostname_of(self, worker_name: str) -> str | None:
        """The node hostname in `worker_name`, or None when the pattern does not match it."""
        match = re.search(self.worker_hostname_pattern, worker_name)
        return (match.group("hostname") or None) if match else None


class RedisSettings(BaseSettings):
    """Leader election between replicas."""

    model_config = group_config(f"{PREFIX}REDIS_")

    url: RedisUrl | None = Field(
        default=None,
        description="Redis URL for leader election (may hold a password); unset = single replica.",
    )
    lock_ttl: Duration = Field(
        default=30.0,
        gt=0,
        description="Lifetime of the leader lock unless refreshed; at least twice "
        "AUTOSCALER_POLL_INTERVAL, so the leader keeps it across the wait between two ticks.",
    )


class DockerSettings(BaseSettings):
    """The docker engine of a swarm manager."""

    model_config = group_config(f"{PREFIX}DOCKER_")

    url: DockerUrl = Field(
        default="unix:///var/run/docker.sock", description="Docker engine API of a manager."
    )


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


class LoggingSettings(BaseSettings):
    """Log level and format."""

    model_config = group_config(f"{PREFIX}LOG_")

    level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_upper)] = (
        Field(default="INFO", description="Lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    )
    format: Literal["json", "console"] = Field(
        default="json", description="json (one JSON object per line) or console (coloured, for humans)."
    )


class HttpSettings(BaseSettings):
    """The HTTP endpoint for health and metrics."""

    model_config = group_config(f"{PREFIX}HTTP_")

    port: int = Field(
        default=8000, ge=0, le=65535, description="TCP port for health and metrics; 0 disables it."
    )
    host: str = Field(default="0.0.0.0", min_length=1, description="Address the HTTP endpoint listens on.")


class DebugSettings(BaseSettings):
    """Remote debugging with debugpy: `swarm-autoscaler run` listens for a debugger when a port is set."""

    model_config = group_config(f"{PREFIX}DEBUGPY_")

    port: int | None = Field(
        default=None, ge=1, le=65535, description="Port debugpy listens on; unset means no debugger."
    )
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Address debugpy listens on; keep loopback and tunnel to it unless you mean otherwise.",
    )
    wait: bool = Field(default=False, description="Wait for the debugger to attach before the first tick.")


# What drives the fleet (see `Settings.mode`).
Mode = Literal["computational", "dynamic"]


class Settings(BaseSettings):
    """The whole configuration. `Settings()` reads every group from the environment (env files: see
    `load_settings`)."""

    model_config = group_config(PREFIX)

    cluster_name: ClusterName = Field(
        description="Name of the managed cluster, used in machine tags and node labels: keep it stable.",
        json_schema_extra={"example": "analytics"},
    )
    mode: Mode = Field(
        default="computational",
        description="What drives the fleet: `computational` reads the dask scheduler's tasks; `dynamic` reads "
        "the swarm's pending service tasks (their reservations and node-label constraints), no dask needed.",
    )
    timing: TimingSettings = Field(default_factory=_from_env(TimingSettings))
    ec2: Ec2Settings = Field(default_factory=_from_env(Ec2Settings))
    dask: DaskSettings = Field(default_factory=_from_env(DaskSettings))
    redis: RedisSettings = Field(default_factory=_from_env(RedisSettings))
    docker: DockerSettings = Field(default_factory=_from_env(DockerSettings))
    logging: LoggingSettings = Field(default_factory=_from_env(LoggingSettings))
    http: HttpSettings = Field(default_factory=_from_env(HttpSettings))
    debugpy: DebugSettings = Field(default_factory=_from_env(DebugSettings))


GROUPS: dict[str, type[BaseSettings]] = {
    "timing": TimingSettings,
    "ec2": Ec2Settings,
    "dask": DaskSettings,
    "redis": RedisSettings,
    "docker": DockerSettings,
    "logging": LoggingSettings,
    "http": HttpSettings,
    "debugpy": DebugSettings,
}


# ------------------------------------------------------------------------------------------ loading


class InvalidSettingsError(ConfigurationError):
    """Settings the daemon cannot start with. `problems` holds one line per wrong variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


def env_name(cls: type[BaseModel], field: str) -> str:
    """The environment variable of `field` of the settings group `cls`."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    return f"{prefix}{field}".upper()


def load_settings(env_file: str | os.PathLike[str] | None = None) -> Settings:
    """Read and validate every variable from the environment and, when given, an env file (the
    environment wins). Raises `InvalidSettingsError` listing every problem at once."""
    path = env_path(env_file)
    groups: dict[str, BaseSettings] = {}
    problems: list[str] = []
    failed: set[str] = set()
    for attr, cls in GROUPS.items():
        group, wrong = read_group(cls, path)
        problems.extend(wrong)
        if group is None:
            failed.add(attr)
        # On errors, a placeholder so the root's own fields are still checked (model_construct reads nothing).
        groups[attr] = group if group is not None else cls.model_construct()
    try:
        root = _read(Settings, path, **groups)
    except (ValidationError, SettingsError) as exc:
        problems = _problems(exc, Settings) + problems
        mode, _ = read_group(_ModeOnly, path)  # the mode's own error is among the root's
        if mode is not None and "dask" not in failed:
            problems.extend(_mode_needs(mode.mode, groups["dask"]))
    else:
        if "dask" not in failed:
            problems.extend(_mode_needs(root.mode, root.dask))
    if problems:
        raise InvalidSettingsError(problems)
    problems = _across_groups(root)
    if problems:
        raise InvalidSettingsError(problems)
    return root


class _ModeOnly(BaseSettings):
    """The mode alone, read to check what it requires when other root variables are wrong."""

    model_config = group_config(PREFIX)

    mode: Mode = "computational"


def _mode_needs(mode: str, dask: BaseSettings) -> list[str]:
    """What the mode requires of the other groups: the computational mode reads a dask scheduler."""
    if mode != "computational" or getattr(dask, "scheduler_url", None):
        return []
    return [f"{env_name(DaskSettings, 'scheduler_url')}: required but not set"]


def _across_groups(settings: Settings) -> list[str]:
    """Rules between variables of different groups, one line each."""
    problems = []
    poll, ttl = settings.timing.poll_interval, settings.redis.lock_ttl
    if settings.redis.url is not None and ttl < 2 * poll:
        problems.append(
            f"{env_name(RedisSettings, 'lock_ttl')}: must be at least twice {env_name(TimingSettings, 'poll_interval')} "
            f"({format_duration(2 * poll)}) so the leader keeps the lock between two ticks, "
            f"got {format_duration(ttl)}"
        )
    return problems


# ------------------------------------------------------------------------------------------ error lines


def _problems(exc: ValidationError | SettingsError, cls: type[BaseSettings]) -> list[str]:
    """One line per variable: `NAME: what was expected[, got 'value']`."""
    if isinstance(exc, SettingsError):  # a source failed before validation; its message holds no value
        return [f"{PREFIX}*: {exc}"]
    grouped: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        field = str(loc[0]) if loc else ""
        info = cls.model_fields.get(field)
        name = env_name(cls, field) if info is not None else f"{PREFIX}*"
        path = ".".join(str(part) for part in loc[1:] if "[" not in str(part))
        detail = _expectation(error["type"], error["msg"])
        if path:
            detail = f"{path}: {detail}"
        if not (info is None or _is_secret(field, info)):
            detail += _got(error)
        grouped.setdefault(name, []).append(detail)
    return [f"{name}: {'; '.join(details)}" for name, details in grouped.items()]


_SECRET_WORDS = ("secret", "password", "token", "access_key")


def _is_secret(field: str, info: FieldInfo) -> bool:
    return "SecretStr" in repr(info.annotation) or any(word in field.lower() for word in _SECRET_WORDS)


def _expectation(kind: str, message: str) -> str:
    if kind == "missing":
        return "required but not set"
    if kind == "extra_forbidden":
        return "unknown key"
    for lead in ("Input should be ", "Value should be "):
        if message.startswith(lead):
            return "expected " + message.removeprefix(lead)
    if message.startswith("String should "):
        return "expected text that should " + message.removeprefix("String should ")
    return message[:1].lower() + message[1:] if message[:2] != message[:2].upper() else message


# Errors whose message already says all (echoing a whole JSON value would only be noise).
_NO_ECHO = frozenset(
    {"missing", "extra_forbidden", "no_types", "unknown_type", "tag", "pair", "overhead", "boot_script"}
)


def _got(error: Mapping[str, Any]) -> str:
    value = error.get("input")
    if error["type"] in _NO_ECHO or isinstance(value, bool) or not isinstance(value, str | int | float):
        return ""
    text = repr(value)
    return f", got {text if len(text) <= 80 else text[:77] + '...'}"
