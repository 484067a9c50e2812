"""The keeper's configuration: `AUTOSCALER_KEEPER_*`, plus the groups it shares with the daemon.

`swarm-autoscaler keeper` reads `KeeperSettings` (its own group) and, from the daemon's model, the EC2
endpoint, credentials and placement (`Ec2AccessSettings`: not the daemon's allowed types or fleet
limits), redis, logging and the HTTP host. `load_keeper_settings` validates them all at once and raises
`InvalidSettingsError` with one line per wrong variable, like the daemon's loader, never echoing a
secret (the token is a `SecretStr`).

Each cluster's own autoscaler runs on its primary and is configured by the primary's boot script: the
template `AUTOSCALER_KEEPER_PRIMARY_BOOT_TEMPLATE`, whose `{{placeholder}}`s are filled per cluster
(`render_boot`). `{{autoscaler_env}}` is that autoscaler's settings, derived from the keeper's
(`cluster_env`): one `NAME=value` line each, verbatim (docker's env-file format). AWS credentials are
never put there (user data is readable by anyone allowed DescribeInstanceAttribute): the primary's
autoscaler uses the primary's instance profile.

Why one file of this size: the keeper's settings and the default primary boot script are one thing (the
script is a setting's default, and `render_boot` fills it from the settings beside it).
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import BeforeValidator, Field, SecretStr, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings

from swarm_autoscaler import __version__
from swarm_autoscaler.config.durations import format_duration
from swarm_autoscaler.config.profiles import ClusterProfile, Profiles, check_profiles, pinned_image
from swarm_autoscaler.config.settings import (
    PREFIX,
    Ec2AccessSettings,
    HttpSettings,
    InvalidSettingsError,
    LoggingSettings,
    RedisSettings,
    env_path,
    group_config,
    read_group,
)
from swarm_autoscaler.config.types import (
    MAX_FLEET,
    MAX_PRICE,
    TYPE_NAME,
    USER_DATA_LIMIT,
    AllowedType,
    AllowedTypes,
    AmiId,
    ClusterName,
    Duration,
    json_value,
)

KEEPER_PREFIX = f"{PREFIX}KEEPER_"
EXAMPLE_TOKEN = "replace-me-with-a-long-random-token"
KEEPER_HTTP_PORT = 8080
# Fully qualified: an unqualified `swarm-autoscaler:<version>` that is not on the machine would be pulled
# from Docker Hub (anybody's image of that name). `localhost/` never resolves to a public registry: build
# or tag the image under this name, or set AUTOSCALER_KEEPER_IMAGE to your registry's.
DEFAULT_IMAGE = f"localhost/swarm-autoscaler:{__version__}"
PLACEHOLDERS = (
    "cluster_id",
    "user_id",
    "wallet_id",
    "scheduler_port",
    "dashboard_port",
    "autoscaler_env",
    "keeper_url",
    "credentials_token",
    "image",
    "keeper_ca",
    "worker_image",
    "scheduler_image",
)
# Where a primary's autoscaler reads its listing token: the boot script makes this swarm secret from its
# one-time credentials fetch's answer (the token is never in user data, which a read-only principal reads).
LISTING_TOKEN_SECRET = "/run/secrets/keeper-listing-token"
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
TEMPLATE_LIMIT = USER_DATA_LIMIT - 4096  # room for the rendered values (the worker types' JSON above all)

DEFAULT_PRIMARY_BOOT = """\
#!/bin/bash
# Primary of on-demand cluster {{cluster_id}} (user {{user_id}}, wallet {{wallet_id}}), from the keeper.
# Needs docker and curl on the AMI. Makes this machine the manager of a swarm of its own, running:
# a dask scheduler speaking TLS only, the cluster's own autoscaler, and the dask worker as a global
# service on the workers that autoscaler launches. Images (pinned): {{image}}, the scheduler's
# {{scheduler_image}} and the workers' {{worker_image}}.
set -euo pipefail
umask 077
D=/etc/swarm-autoscaler
mkdir -p "$D/tls"
# 1. This cluster's TLS files and its autoscaler's listing token, once: the token below is spent on first
# use (a second use gets 410).
# Over https, the keeper is verified with the CA below when the keeper names one (public data), else
# with the AMI's trusted CAs.
cat > "$D/keeper-ca.pem" <<'KEEPER_CA'
{{keeper_ca}}
KEEPER_CA
KEEPER_CA=""
if grep -q "BEGIN CERTIFICATE" "$D/keeper-ca.pem"; then KEEPER_CA="--cacert $D/keeper-ca.pem"; fi
# The keeper answers the token only from this machine's private IP (IMDSv2's local-ipv4).
IMDS="${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"
IMDS_TOKEN=$(curl -fsS --retry 10 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 300" "$IMDS/latest/api/token")
IP=$(curl -fsS --retry 10 -H "X-aws-ec2-metadata-token: $IMDS_TOKEN" "$IMDS/latest/meta-data/local-ipv4")
curl -fsS $KEEPER_CA --interface "$IP" --retry 30 --retry-delay 5 --retry-all-errors -o "$D/credentials.json" \\
  -H "Authorization: Bearer {{credentials_token}}" "{{keeper_url}}/v1/primaries/{{cluster_id}}/credentials"
# The same run copies the packing preload out of the image as a file (it needs only distributed), so
# the scheduler's image needs nothing of swarm-autoscaler (docs/keeper.md, "The scheduler image").
docker run --rm --network none --user 0 -v "$D:/d" --entrypoint python3 {{image}} -c \\
  'import json,pathlib,shutil; a=json.load(open("/d/credentials.json")); [pathlib.Path("/d/tls",n).write_text(t) for n,t in a["files"].items()]
t=pathlib.Path("/d/listing-token"); t.write_text(a["listing_token"]); t.chmod(0o600)
import swarm_autoscaler.adapters.dask_packing as p; shutil.copy(p.__file__,"/d/dask_packing.py")'
rm -f "$D/credentials.json"
chmod 644 "$D/dask_packing.py"
# 2. A swarm of its own; the files become swarm secrets (swarm sends them only to the nodes that run a
# task using them, in memory). Its overlay address pool lies outside the usual 10.0.0.0/8 VPCs (swarm's
# default pool would hide the VPC's resolver from overlay tasks; docs/deployment.md, "Create the swarm").
docker swarm init --default-addr-pool 100.64.0.0/16 --default-addr-pool-mask-length 24
ADDR=$(docker info --format '{{.Swarm.NodeAddr}}')
for f in ca scheduler scheduler-key worker worker-key; do docker secret create "dask-$f" "$D/tls/$f.pem"; done
# The autoscaler's token for the keeper's listing and launches (it came with the TLS files, not in user data)
docker secret create keeper-listing-token "$D/listing-token"
rm -f "$D"/tls/*-key.pem "$D/listing-token"
S=/run/secrets
TLS_SCHEDULER="--tls-ca-file $S/dask-ca --tls-cert $S/dask-scheduler --tls-key $S/dask-scheduler-key"
TLS_WORKER="--tls-ca-file $S/dask-ca --tls-cert $S/dask-worker --tls-key $S/dask-worker-key"
# Every service uses the machine's network (no overlay, nothing published through swarm): each listens
# on the machine's private address.
# 3. The scheduler: tls:// on {{scheduler_port}} (mutual TLS: only holders of this cluster's certificates
# connect); its HTTP port {{dashboard_port}} (health, metrics, dashboard) is for the keeper's probe: open
# it to the keeper's security group only (docs/keeper-security.md).
# It runs the packing preload, the file copied in step 1 (docs/packing.md): small tasks fill a machine
# before the next, and waiting GPU or instance-type work moves to the workers launched for it.
# (--no-healthcheck: the image's check is the autoscaler's /healthz, which a scheduler does not serve)
P=/opt/swarm-autoscaler/dask_packing.py
docker service create --detach --name dask-scheduler --network host --constraint node.role==manager --no-healthcheck \\
  --secret dask-ca --secret dask-scheduler --secret dask-scheduler-key \\
  --mount "type=bind,src=$D/dask_packing.py,dst=$P,readonly" \\
  --entrypoint dask {{scheduler_image}} scheduler --protocol tls --host "$ADDR" --port {{scheduler_port}} \\
  --dashboard-address "$ADDR:{{dashboard_port}}" --preload $P $TLS_SCHEDULER
# 4. The cluster's autoscaler: this swarm, this cluster's name and EC2 tags, the scheduler over TLS; its
# own HTTP (health, metrics) on the private address, port 8000 (closed unless a rule opens it), and its
# join desk there on 8443 (TLS, its key pinned in the workers' user data): the workers it launches fetch
# this swarm's join token at boot (POST /v1/join, answered only to one of them, booting, from its own
# private IP), so their user data carries a one-use ticket, never the token. Open 8443 to the workers.
cat > "$D/cluster.env" <<'SWARM_AUTOSCALER_ENV'
{{autoscaler_env}}
AUTOSCALER_DASK_TLS_CA_FILE=/run/secrets/dask-ca
AUTOSCALER_DASK_TLS_CERT_FILE=/run/secrets/dask-worker
AUTOSCALER_DASK_TLS_KEY_FILE=/run/secrets/dask-worker-key
AUTOSCALER_DOCKER_URL=unix:///var/run/docker.sock
AUTOSCALER_EC2_JOIN_URL=auto
SWARM_AUTOSCALER_ENV
echo "AUTOSCALER_DASK_SCHEDULER_URL=tls://$ADDR:{{scheduler_port}}" >> "$D/cluster.env"
echo "AUTOSCALER_HTTP_HOST=$ADDR" >> "$D/cluster.env"
CA_SECRET=""  # the keeper's CA, for the autoscaler's reads of its listing from the keeper
if [ -n "$KEEPER_CA" ]; then
  docker secret create keeper-ca "$D/keeper-ca.pem"
  CA_SECRET="--secret keeper-ca"
  echo "AUTOSCALER_EC2_LISTING_CA_FILE=/run/secrets/keeper-ca" >> "$D/cluster.env"
fi
docker service create --detach --name autoscaler --network host --constraint node.role==manager --user 0 \\
  --secret dask-ca --secret dask-worker --secret dask-worker-key --secret keeper-listing-token $CA_SECRET \\
  --mount type=bind,src=/var/run/docker.sock,dst=/var/run/docker.sock \\
  --env-file "$D/cluster.env" {{image}} run
# 5. The dask worker, one per machine the autoscaler launched (its ownership label), as in
# docker/worker-stack.yml, with this cluster's worker certificate.
docker service create --detach --name dask-worker --mode global --network host --no-healthcheck \\
  --constraint node.labels.swarm-autoscaler.cluster=={{cluster_id}} --constraint node.role==worker \\
  --secret dask-ca --secret dask-worker --secret dask-worker-key \\
  --env DASK_SCHEDULER_ADDRESS="tls://$ADDR:{{scheduler_port}}" --env 'DASK_WORKER_NAME={{.Node.Hostname}}' \\
  --mount type=bind,src=/etc/swarm-autoscaler,dst=/etc/swarm-autoscaler,readonly \\
  --restart-condition any --restart-delay 2s --stop-grace-period 30s \\
  --entrypoint /usr/local/bin/swarm-autoscaler-worker {{worker_image}} $TLS_WORKER
"""


def _template(value: str) -> str:
    unknown = sorted({name for name in _PLACEHOLDER.findall(value) if name not in PLACEHOLDERS})
    if unknown:
        raise PydanticCustomError(
            "template",
            "unknown placeholder(s) {names}; known: {known}",
            {"names": ", ".join(unknown), "known": ", ".join(PLACEHOLDERS)},
        )
    size = len(value.encode())
    if size > TEMPLATE_LIMIT:
        raise PydanticCustomError(
            "template",
            "expected at most {limit} bytes (EC2's 16 KiB of user data, less room for the values), got {size}",
            {"limit": TEMPLATE_LIMIT, "size": size},
        )
    return value


class KeeperSettings(BaseSettings):
    """The on-demand clusters keeper (`swarm-autoscaler keeper` only; the daemon ignores these)."""

    model_config = group_config(KEEPER_PREFIX)

    token: SecretStr = Field(
        description="The admin bearer token: every API route, every user's clusters, and issuing user tokens "
        "(at least 16 characters; never logged). Users get tokens of their own (docs/keeper.md#tokens).",
        json_schema_extra={"example": EXAMPLE_TOKEN},
    )
    secrets_key: SecretStr | None = Field(
        default=None,
        description="32 random bytes in base64 that seal the clusters' private keys in redis (AES-GCM): a "
        "dump of redis then holds none. Every replica needs the same key. Prefer "
        "AUTOSCALER_KEEPER_SECRETS_KEY_FILE with a swarm secret. Unset with AUTOSCALER_REDIS_URL: the keys "
        "are stored in the clear and the keeper logs a warning at start (docs/security.md).",
        json_schema_extra={"example": "<the output of: openssl rand -base64 32>"},
    )
    tls_cert_file: str | None = Field(
        default=None,
        description="PEM certificate chain the keeper's API serves HTTPS with (with AUTOSCALER_KEEPER_TLS_KEY_FILE; "
        "a swarm secret). Unset: the keeper serves HTTPS with a certificate of its own, from a CA it makes once "
        "and keeps in redis, for the host of AUTOSCALER_KEEPER_PUBLIC_URL; the primaries get that CA in their "
        "boot script (docs/keeper-security.md).",
        json_schema_extra={"example": "/run/secrets/keeper-tls-cert"},
    )
    bind_primary_tokens: bool = Field(
        default=True,
        description="true (the default): a primary's one-time credentials token works only from that primary's "
        "private IP (the TCP source of its fetch; the default boot script sends from it), so a token read from "
        "user data before the primary boots gets nothing and is not spent. Needs the primaries to reach the "
        "keeper with their own address: its port published in host mode, as docker/keeper-stack.yml does, "
        "not through swarm's routing mesh, a NAT or a TLS-terminating proxy, which replace the source (each "
        "refused fetch is a warning saying so). false: the token can be raced before boot "
        "(docs/keeper-security.md).",
    )
    plain_http: bool = Field(
        default=False,
        description="true: the keeper's API is PLAIN HTTP (tokens and every cluster's TLS files in the clear on "
        "the network), for a keeper behind a proxy or load balancer that terminates TLS for it (whose "
        "https:// address is then AUTOSCALER_KEEPER_PUBLIC_URL). The keeper logs a warning at every start.",
    )
    tls_key_file: str | None = Field(
        default=None,
        description="PEM private key of AUTOSCALER_KEEPER_TLS_CERT_FILE (a swarm secret).",
        json_schema_extra={"example": "/run/secrets/keeper-tls-key"},
    )
    tls_ca_file: str | None = Field(
        default=None,
        description="PEM certificate of the CA that signed the keeper's certificate, when it is not one the "
        "primaries' AMI trusts: written into each primary's boot script ({{keeper_ca}}, public data), "
        "so its credentials fetch and its autoscaler's listing verify the keeper with it. Set, it wins over the "
        "CA of the keeper's own certificate (for a TLS proxy in front of the keeper, with its own CA).",
        json_schema_extra={"example": "/etc/swarm-autoscaler/keeper-ca.pem"},
    )
    secrets_key_file: str | None = Field(
        default=None,
        description="A file holding AUTOSCALER_KEEPER_SECRETS_KEY (a swarm secret: /run/secrets/<name>); "
        "used when AUTOSCALER_KEEPER_SECRETS_KEY is unset.",
        json_schema_extra={"example": "/run/secrets/keeper-secrets-key"},
    )
    name: ClusterName = Field(
        description="This keeper's name, of this keeper alone in the account and region: its ownership tag on "
        "the primaries and their workers, and its redis key prefix. Keep it stable; replicas of one keeper "
        "share it. No default: two keepers left at a shared default each took the other's primaries for "
        "theirs (a keeper deployed before this was required used 'keeper': set that to keep its clusters).",
        json_schema_extra={"example": "analytics-keeper"},
    )
    primary_type: str = Field(default="m5.large", description="Instance type of each cluster's primary.")
    primary_metadata_hop_limit: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Primaries require IMDSv2 (session tokens) from their metadata service; this is the token's "
        "hop limit. 2 (the default) lets the primary's containers (its autoscaler, which launches the workers "
        "with the primary's instance profile) use it; 1 breaks that autoscaler unless it is given keys.",
    )
    primary_price_per_hour: float | None = Field(
        default=None,
        gt=0,
        le=MAX_PRICE,
        description="USD per hour of the primary's type in the usage ledger; wins over the AWS Price List, and "
        "is required when the keeper may not call pricing:GetProducts (a worker type's price_per_hour wins "
        "over it for the same type).",
        json_schema_extra={"example": "0.096"},
    )
    primary_ami_id: AmiId = Field(
        description="AMI the primaries boot (it needs docker).",
        json_schema_extra={"example": "ami-0123456789abcdef0"},
    )
    primary_boot_template: str = Field(
        default="",
        description="Boot script of the primaries, with placeholders {{cluster_id}}, {{user_id}}, "
        "{{wallet_id}}, {{scheduler_port}}, {{dashboard_port}}, {{autoscaler_env}} (the cluster's "
        "autoscaler settings, one NAME=value line each), {{keeper_url}} (AUTOSCALER_KEEPER_PUBLIC_URL), "
        "{{credentials_token}} (the one-time token that fetches the cluster's TLS files), {{image}} "
        "(AUTOSCALER_KEEPER_IMAGE), {{worker_image}} and {{scheduler_image}} (AUTOSCALER_KEEPER_WORKER_IMAGE "
        "and AUTOSCALER_KEEPER_SCHEDULER_IMAGE, or the image) and {{keeper_ca}} (the PEM of AUTOSCALER_KEEPER_TLS_CA_FILE, or empty). "
        "Empty: the built-in script (see docs/keeper.md).",
    )
    public_url: str | None = Field(
        default=None,
        description="The keeper's API as a primary reaches it (https://host:port, no path): the default boot "
        "script fetches its cluster's TLS files there, and the keeper's own certificate names its host. Required "
        "with the built-in boot script; http:// only with AUTOSCALER_KEEPER_PLAIN_HTTP=true.",
        json_schema_extra={"example": "https://10.0.0.5:8080"},
    )
    interruption_queue_url: str = Field(
        default="",
        pattern=r"^(https?://\S+)?$",
        description="URL of the SQS queue EventBridge feeds with EC2's spot interruption warnings, rebalance "
        "recommendations and scheduled changes (as the daemon's AUTOSCALER_EC2_INTERRUPTION_QUEUE_URL): the "
        "keeper tags each of its clusters' workers named there, and each cluster's autoscaler, reading its "
        "instances from the keeper, replaces it. Empty = notices are not read.",
        json_schema_extra={
            "example": "https://sqs.us-east-1.amazonaws.com/123456789012/keeper-interruptions"
        },
    )
    image: str = Field(
        default=DEFAULT_IMAGE,
        description="The image each primary runs its autoscaler from, and its scheduler and workers unless "
        "set below (the one docker/Dockerfile builds), pinned by a version tag or a digest; never :latest. "
        "Give the registry (registry.example.com/swarm-autoscaler:0.1.0): a name without one is pulled from "
        "Docker Hub.",
        json_schema_extra={"example": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/swarm-autoscaler:0.1.0"},
    )
    worker_image: str = Field(
        default="",
        description="The image of the clusters' dask workers: a team's image (docker/worker.Dockerfile: its "
        "libraries, Python 3.11, distributed at the scheduler's version and docker/worker-entrypoint.sh at "
        "/usr/local/bin/swarm-autoscaler-worker), pinned. Empty: AUTOSCALER_KEEPER_IMAGE.",
        json_schema_extra={"example": "registry.example.com/team/dask-worker:1.4.0"},
    )
    scheduler_image: str = Field(
        default="",
        description="The image of the clusters' dask schedulers, pinned: Python and distributed at the "
        "workers' versions and the `dask` command; nothing of swarm-autoscaler (the primary mounts the "
        "packing preload into it as a file, docs/keeper.md#the-scheduler-image). Empty: AUTOSCALER_KEEPER_IMAGE.",
        json_schema_extra={"example": "registry.example.com/team/dask-scheduler:1.4.0"},
    )
    primary_iam_instance_profile: str | None = Field(
        default=None,
        description="IAM instance profile of the primaries (their autoscaler launches and terminates the "
        "workers with it); unset = AUTOSCALER_EC2_IAM_INSTANCE_PROFILE.",
    )
    idle_timeout: Duration = Field(
        default=300.0, gt=0, description="A cluster without heartbeat and without work this long is ended."
    )
    no_client_timeout: Duration = Field(
        default=120.0,
        ge=0,
        description="A running cluster whose scheduler has no client (its own autoscaler aside; a client "
        "holding results counts) and no work this long is ended, however recent its heartbeats; 0: never. "
        "Separate from AUTOSCALER_KEEPER_IDLE_TIMEOUT, which still ends one unused that long.",
    )
    max_start_time: Duration = Field(
        default=600.0,
        gt=0,
        description="A primary whose scheduler does not answer this long after launch fails.",
    )
    check_interval: Duration = Field(default=5.0, gt=0, description="Time between two checks of one cluster.")
    worker_types: AllowedTypes = Field(
        description="Instance types each cluster's autoscaler may launch as workers, in the format of "
        "AUTOSCALER_EC2_ALLOWED_TYPES.",
        json_schema_extra={"example": '{"m5.large": {"ami_id": "ami-0123456789abcdef0"}}'},
    )
    max_instances_per_cluster: int = Field(
        default=10,
        ge=1,
        le=MAX_FLEET,
        description="Most workers of one cluster at once (its autoscaler's maximum; the keeper ends the newest "
        "pending or running ones beyond it).",
    )
    scheduler_port: int = Field(
        default=8786, ge=1, le=65535, description="Port of each primary's dask scheduler."
    )
    dashboard_port: int = Field(
        default=8787,
        ge=1,
        le=65535,
        description="HTTP port of each primary's dask scheduler (health, metrics).",
    )
    http_port: int = Field(
        default=KEEPER_HTTP_PORT, ge=1, le=65535, description="TCP port of the keeper's API."
    )
    lock_ttl: Duration = Field(
        default=15.0,
        gt=0,
        description="Lifetime of a replica's lease on a cluster unless refreshed: a dead replica's clusters "
        "move to another within it. At least twice AUTOSCALER_KEEPER_CHECK_INTERVAL.",
    )
    usage_interval: Duration = Field(
        default=30.0,
        gt=0,
        le=1800,
        description="Time between two readings of every cluster machine for usage per wallet (needs "
        "AUTOSCALER_REDIS_URL). A reading is absolute, so a longer interval loses nothing while EC2 still "
        "lists the machines (about an hour after they end); it only delays the figures.",
    )
    wallet_metric_limit: int = Field(
        default=200,
        ge=1,
        le=10_000,
        description="Most wallets with their own label values in the usage metrics; the rest are added up "
        "under the wallet label `_other` (bounds the metrics' cardinality).",
    )

    max_clusters_per_user: int = Field(
        default=10,
        ge=1,
        le=MAX_FLEET,
        description="Most live (starting or running) clusters of one user; a create over it is refused with "
        "429 (docs/keeper.md#limits-and-budgets).",
    )
    wallet_budget_usd: float | None = Field(
        default=None,
        ge=0,
        description="Default budget of every wallet in USD (what all its clusters' machines cost, since the "
        "usage ledger began); a create for a wallet that spent it is refused with 402, and its running clusters stop growing "
        "and end after AUTOSCALER_KEEPER_BUDGET_GRACE. Unset: no budget. Needs "
        "AUTOSCALER_REDIS_URL (the usage ledger).",
        json_schema_extra={"example": "50"},
    )
    wallet_budgets: Annotated[
        dict[str, float], BeforeValidator(json_value('a JSON object like {"w-team-a": 200}'))
    ] = Field(
        default_factory=dict,
        description="Budgets of given wallets in USD, over the default: a JSON object, wallet id to USD. "
        "A budget set through the API (PUT /v1/wallets/{wallet_id}/budget) comes before both.",
        json_schema_extra={"example": '{"w-team-a": 200, "w-trial": 5}'},
    )

    budget_grace: Duration = Field(
        default=600.0,
        ge=0,
        description="How long a running cluster of a wallet that spent its budget lives on (launching no new "
        "workers, its reason saying so) before it is ended; counted from when the wallet was first found "
        "over its budget, shared by the replicas.",
    )
    profiles: Profiles = Field(
        default_factory=dict,
        description='Cluster profiles a user names at creation ({"profile": "<name>"}, '
        "docs/keeper.md#cluster-profiles): a JSON object, name to its worker_image, scheduler_image, "
        "primary_type and worker_types (as AUTOSCALER_KEEPER_WORKER_TYPES), each optional, the keeper-wide "
        "setting when left out. Images pinned and naming their registry. The profile `default` is the "
        "keeper-wide settings.",
        json_schema_extra={
            "example": '{"geo": {"worker_image": "registry.example.com/geo/dask-worker:1.4.0", '
            '"scheduler_image": "registry.example.com/geo/dask-scheduler:1.4.0"}}'
        },
    )

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, value: dict[str, ClusterProfile], info: ValidationInfo) -> dict[str, ClusterProfile]:
        return check_profiles(value, info.data.get("max_instances_per_cluster"))

    @field_validator("wallet_budgets")
    @classmethod
    def _budgets(cls, value: dict[str, float]) -> dict[str, float]:
        for wallet, budget in value.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", wallet):
                raise PydanticCustomError(
                    "wallet", "wallet id {wallet!r} is not valid", {"wallet": wallet[:80]}
                )
            if not 0 <= budget < float("inf"):
                raise PydanticCustomError(
                    "budget", "budget of {wallet} must be 0 or more", {"wallet": wallet}
                )
        return value

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr) -> SecretStr:
        secret = value.get_secret_value()
        if len(secret) < 16:
            raise PydanticCustomError("token", "expected at least 16 characters")
        if secret == EXAMPLE_TOKEN:
            raise PydanticCustomError("token", "replace the template's example token with a random one")
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not re.fullmatch(r"https?://[^\s/]+", value.rstrip("/")):
            raise PydanticCustomError("url", "expected http://host:port or https://host:port, without a path")
        return value.rstrip("/")

    @field_validator("image", "worker_image", "scheduler_image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        # the worker's and scheduler's: empty means AUTOSCALER_KEEPER_IMAGE
        return pinned_image(value) if value else value

    @field_validator("primary_type")
    @classmethod
    def _primary_type(cls, value: str) -> str:
        if not TYPE_NAME.match(value):  # whether the region offers it is EC2's to say, at start
            raise PydanticCustomError(
                "unknown_type", "expected an EC2 instance type name: a family and a size, like m7i.large"
            )
        return value

    @field_validator("primary_boot_template")
    @classmethod
    def _boot_template(cls, value: str) -> str:
        return _template(value) if value.strip() else ""

    @property
    def boot_template(self) -> str:
        """The primaries' boot script template: the configured one, else the built-in one."""
        return self.primary_boot_template if self.primary_boot_template.strip() else DEFAULT_PRIMARY_BOOT

    @field_validator("max_instances_per_cluster")
    @classmethod
    def _room_for_reserves(cls, value: int, info: ValidationInfo) -> int:
        types: dict[str, AllowedType] = info.data.get("worker_types") or {}
        reserve = sum(t.reserve for t in types.values())
        if reserve > value:
            raise PydanticCustomError(
                "reserve",
                "must be at least the sum of the reserves in {other} ({reserve})",
                {"other": f"{KEEPER_PREFIX}WORKER_TYPES", "reserve": reserve},
            )
        return value


@dataclass(frozen=True, slots=True)
class KeeperConfig:
    """Everything `swarm-autoscaler keeper` runs with."""

    keeper: KeeperSettings
    ec2: Ec2AccessSettings
    redis: RedisSettings
    logging: LoggingSettings
    http: HttpSettings


_GROUPS: dict[str, type[BaseSettings]] = {
    "keeper": KeeperSettings,
    "ec2": Ec2AccessSettings,
    "redis": RedisSettings,
    "logging": LoggingSettings,
    "http": HttpSettings,
}


def load_keeper_settings(env_file: str | os.PathLike[str] | None = None) -> KeeperConfig:
    """Read and validate the keeper's variables from the environment and, when given, an env file (the
    environment wins). Raises `InvalidSettingsError` listing every problem at once."""
    path = env_path(env_file)
    groups: dict[str, BaseSettings] = {}
    problems: list[str] = []
    for attr, cls in _GROUPS.items():
        group, wrong = read_group(cls, path)
        problems.extend(wrong)
        if group is not None:
            groups[attr] = group
    if problems:
        raise InvalidSettingsError(problems)
    config = KeeperConfig(**groups)  # type: ignore[arg-type]
    keeper = config.keeper
    if keeper.lock_ttl < 2 * keeper.check_interval:
        raise InvalidSettingsError(
            [
                f"{KEEPER_PREFIX}LOCK_TTL: must be at least twice {KEEPER_PREFIX}CHECK_INTERVAL "
                f"({format_duration(2 * keeper.check_interval)}) so a replica keeps its clusters between two "
                f"checks, got {format_duration(keeper.lock_ttl)}"
            ]
        )
    if (keeper.wallet_budget_usd is not None or keeper.wallet_budgets) and config.redis.url is None:
        raise InvalidSettingsError(
            [
                f"{KEEPER_PREFIX}WALLET_BUDGET_USD: budgets are checked against the usage ledger, which "
                "needs AUTOSCALER_REDIS_URL: set it, or unset the budgets"
            ]
        )
    if keeper.public_url is None and "keeper_url" in _PLACEHOLDER.findall(keeper.boot_template):
        raise InvalidSettingsError(
            [
                f"{KEEPER_PREFIX}PUBLIC_URL: required by the primaries' boot script (it fetches its "
                "cluster's TLS files from the keeper there): set it to the keeper's API as the primaries "
                "reach it, for example https://10.0.0.5:8080"
            ]
        )
    problems = _tls_problems(keeper)
    if problems:
        raise InvalidSettingsError(problems)
    return config


def _tls_problems(keeper: KeeperSettings) -> list[str]:
    """The keeper's TLS files: the certificate and key together, readable; the public URL https:// when
    the keeper serves TLS; the CA a PEM certificate."""
    problems = []
    cert, key, ca = keeper.tls_cert_file, keeper.tls_key_file, keeper.tls_ca_file
    if (cert is None) != (key is None):
        problems.append(f"{KEEPER_PREFIX}TLS_CERT_FILE and {KEEPER_PREFIX}TLS_KEY_FILE: set both or neither")
    elif cert is not None and key is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            problems.append(f"{KEEPER_PREFIX}TLS_CERT_FILE: cannot serve with {cert} and {key} ({exc})")
        if keeper.plain_http:
            problems.append(
                f"{KEEPER_PREFIX}PLAIN_HTTP: true serves no TLS, so {KEEPER_PREFIX}TLS_CERT_FILE would go unused: "
                "set one or the other"
            )
    if (
        not keeper.plain_http
        and keeper.public_url is not None
        and not keeper.public_url.startswith("https://")
    ):
        problems.append(
            f"{KEEPER_PREFIX}PUBLIC_URL: must be https:// (the keeper serves HTTPS, with its own certificate "
            f"unless {KEEPER_PREFIX}TLS_CERT_FILE is set); http:// only with {KEEPER_PREFIX}PLAIN_HTTP=true, "
            "for TLS terminated in front of the keeper"
        )
    if ca is not None and "BEGIN CERTIFICATE" not in _read(ca):
        problems.append(f"{KEEPER_PREFIX}TLS_CA_FILE: {ca} holds no PEM certificate")
    return problems


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):
        return ""


def keeper_ca(keeper: KeeperSettings) -> str:
    """The PEM of the CA the primaries verify the keeper with ({{keeper_ca}}), or ""."""
    return _read(keeper.tls_ca_file).strip() if keeper.tls_ca_file else ""


# ------------------------------------------------------------------------------------------ per cluster


def cluster_env(
    config: KeeperConfig,
    cluster_id: str,
    worker_tags: Mapping[str, str] | None = None,
    listing_token_file: str = "",
    worker_types: Mapping[str, AllowedType] | None = None,
) -> dict[str, str]:
    """The settings of cluster `cluster_id`'s own autoscaler, derived from the keeper's: its cluster name
    is the cluster id (its workers' ownership tag), its allowed types and fleet limit are the keeper's
    worker types and max instances per cluster, and it launches where the keeper does, with the keeper's
    custom tags and `worker_tags` on its workers, with no instance profile. No EC2 credentials. With the keeper's public URL and a
    `listing_token_file` (where the boot script writes the cluster's listing token, `LISTING_TOKEN_SECRET`:
    the token itself is never in user data), it reads its instances from the keeper's listing (one paged
    DescribeInstances by the keeper for every cluster) instead of calling DescribeInstances every tick. `worker_types`: its
    profile's (`profiles.Profile`), else the keeper's."""
    ec2, keeper = config.ec2, config.keeper
    tags = {**ec2.custom_tags, **(worker_tags or {})}
    chosen = keeper.worker_types if worker_types is None else worker_types
    types = {name: spec.model_dump(mode="json") for name, spec in chosen.items()}
    env = {
        f"{PREFIX}CLUSTER_NAME": cluster_id,
        f"{PREFIX}EC2_ALLOWED_TYPES": json.dumps(types, separators=(",", ":")),
        f"{PREFIX}EC2_MAX_INSTANCES": str(keeper.max_instances_per_cluster),
        # Workers run user code and need no AWS power: no instance profile (the primaries' policy passes no
        # role), and a hop limit of 1 (their dask worker uses the host's network: the limit keeps only
        # bridged containers out; having no role is what keeps the credentials out).
        f"{PREFIX}EC2_METADATA_HOP_LIMIT": "1",
        f"{PREFIX}EC2_REGION": ec2.region,
        f"{PREFIX}LOG_FORMAT": "json",
    }
    optional = {
        f"{PREFIX}EC2_ENDPOINT": ec2.endpoint,
        f"{PREFIX}EC2_SUBNET_IDS": ",".join(ec2.subnet_ids),
        f"{PREFIX}EC2_SECURITY_GROUP_IDS": ",".join(ec2.security_group_ids),
        f"{PREFIX}EC2_KEY_NAME": ec2.key_name,
        f"{PREFIX}EC2_CUSTOM_TAGS": json.dumps(tags, separators=(",", ":")) if tags else None,
    }
    if keeper.public_url and listing_token_file:
        optional[f"{PREFIX}EC2_LISTING_URL"] = (
            f"{keeper.public_url.rstrip('/')}/v1/primaries/{cluster_id}/instances"
        )
        optional[f"{PREFIX}EC2_LISTING_TOKEN_FILE"] = listing_token_file
    env.update({name: value for name, value in optional.items() if value})
    return env


def render_boot(template: str, values: Mapping[str, str]) -> str:
    """`template` with each `{{name}}` replaced by `values[name]` (every placeholder is in `PLACEHOLDERS`:
    the settings checked it). Nothing else is touched: shell `$VARS` stay as written."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def env_lines(env: Mapping[str, str]) -> str:
    """`NAME=value` lines, values verbatim (docker's env-file format; no value holds a newline)."""
    return "\n".join(f"{name}={value}" for name, value in env.items())
