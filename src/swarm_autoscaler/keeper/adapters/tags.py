"""The keeper's tag scheme on EC2, and the translation of instance records into clusters. No client.

Kept apart from `ec2_primaries.py` (as `ec2_support` is from `ec2`) so each can be read on its own.

A primary's tags hold its cluster's whole state:

    managed-by=swarm-autoscaler, swarm-autoscaler/keeper=<keeper name>      ownership
    swarm-autoscaler/keeper/cluster-id, .../user, .../wallet                 whose cluster it is
    swarm-autoscaler/keeper/profile                  what it is made of (none: `default`, as before)
    swarm-autoscaler/keeper/state, .../created, .../heartbeat, .../answered, .../reason   its lifecycle

Times are epoch seconds. Workers carry the daemon's ownership tags (`managed-by`,
`swarm-autoscaler/cluster=<cluster id>`), plus custom tags naming the keeper, the user and the wallet
(`WORKER_TAGS`: keys outside `swarm-autoscaler/`, which the daemon reserves for itself), by which a
worker whose primary is gone is still recognised as this keeper's.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, PRIMARY_TAG
from swarm_autoscaler.adapters.ec2_launch_token import copied
from swarm_autoscaler.config.profiles import DEFAULT_PROFILE
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
PROFILE_TAG = _K + "profile"
# This keeper deployment's identity (`credentials.deployment_id`): two keepers given one name by hand
# each leave the other's machines alone (`Ec2Primaries.claim`).
DEPLOYMENT_TAG = _K + "deployment"
# On workers, through their autoscaler's AUTOSCALER_EC2_CUSTOM_TAGS.
WORKER_KEEPER_TAG = "swarm-autoscaler-keeper"
WORKER_USER_TAG = "swarm-autoscaler-keeper-user"
WORKER_WALLET_TAG = "swarm-autoscaler-keeper-wallet"
WORKER_DEPLOYMENT_TAG = "swarm-autoscaler-keeper-deployment"

LISTED_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")  # not terminated
HALTED = frozenset({"stopping", "stopped", "shutting-down"})
GONE = frozenset({"shutting-down", "terminated"})
MAX_TAG_VALUE = 256


def new_cluster_id() -> str:
    """A fresh id: `kc-` and 16 hex digits (a valid cluster name for the cluster's own autoscaler)."""
    return f"kc-{uuid.uuid4().hex[:16]}"


def worker_tags(keeper_name: str, key: ClusterKey, deployment: str = "") -> dict[str, str]:
    """The custom tags each cluster's autoscaler puts on its workers (with the keeper's deployment id)."""
    tags = {WORKER_KEEPER_TAG: keeper_name, WORKER_USER_TAG: key.user_id, WORKER_WALLET_TAG: key.wallet_id}
    return tags | ({WORKER_DEPLOYMENT_TAG: deployment} if deployment else {})


def stamp(seconds: float) -> str:
    return f"{seconds:.3f}"


def seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", ())}


def tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def to_cluster(raw: Mapping[str, Any], ports: tuple[int, int]) -> Cluster:
    """The cluster of one primary's record. A primary stopping, stopped or shutting down while its tags
    say `starting` or `running` makes it `ending` (someone else stopped or terminated it). Its scheduler's
    addresses are the primary's private IP and `ports` (scheduler, dashboard), unless tagged otherwise."""
    tags = tags_of(raw)
    created = seconds(tags.get(CREATED_TAG)) or raw["LaunchTime"].timestamp()
    try:
        state = ClusterState(tags.get(STATE_TAG, ClusterState.STARTING))
    except ValueError:
        state = ClusterState.STARTING
    reason = tags.get(REASON_TAG, "")
    machine = raw["State"]["Name"]
    if machine in HALTED and state in (ClusterState.STARTING, ClusterState.RUNNING):
        state, reason = ClusterState.ENDING, f"its primary {raw['InstanceId']} is {machine}"
    ip = raw.get("PrivateIpAddress") or ""
    return Cluster(
        cluster_id=tags[CLUSTER_ID_TAG],
        key=ClusterKey(tags.get(USER_TAG, ""), tags.get(WALLET_TAG, "")),
        state=state,
        created_at=created,
        last_heartbeat=seconds(tags.get(HEARTBEAT_TAG)) or created,
        last_answered=seconds(tags.get(ANSWERED_TAG)),
        primary_id=raw["InstanceId"],
        scheduler_url=tags.get(SCHEDULER_URL_TAG) or (f"tls://{ip}:{ports[0]}" if ip else ""),
        dashboard_url=tags.get(DASHBOARD_URL_TAG) or (f"http://{ip}:{ports[1]}" if ip else ""),
        reason=reason,
        profile=tags.get(PROFILE_TAG) or DEFAULT_PROFILE,
        private_ip=ip,
    )


def orphan_clusters(workers: Iterable[Mapping[str, Any]], live: set[str]) -> list[Cluster]:
    """One `ending` cluster per cluster id whose workers are alive but whose primary is not among `live`
    (terminated, by someone else, or before EC2 listed a worker launched as it shut down)."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for raw in workers:
        cid = tags_of(raw).get(CLUSTER_TAG, "")
        if cid and cid not in live and raw["State"]["Name"] not in GONE:
            found.setdefault(cid, []).append(raw)
    out = []
    for cid, raws in sorted(found.items()):
        tags = tags_of(raws[0])
        since = min(r["LaunchTime"].timestamp() for r in raws)
        key = ClusterKey(tags.get(WORKER_USER_TAG, ""), tags.get(WORKER_WALLET_TAG, ""))
        reason = f"its primary is gone; ending its {len(raws)} worker(s)"
        out.append(Cluster(cid, key, ClusterState.ENDING, since, since, reason=reason))
    return out


def order(cluster: Cluster) -> tuple[float, str]:
    return cluster.created_at, cluster.cluster_id


def listing_entry(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What a cluster's autoscaler needs of one of its instances, in the shape of DescribeInstances (its
    EC2 adapter reads it with the same code, `ec2_support.to_instance`), as JSON: the launch time as ISO
    8601."""
    launched = raw["LaunchTime"]
    return {
        "InstanceId": raw["InstanceId"],
        "InstanceType": raw.get("InstanceType", ""),
        "State": {"Name": raw["State"]["Name"]},
        "LaunchTime": launched.isoformat() if hasattr(launched, "isoformat") else str(launched),
        "PrivateDnsName": raw.get("PrivateDnsName", ""),
        "PrivateIpAddress": raw.get("PrivateIpAddress", ""),  # adoption by address (core/cluster.py)
        "Placement": {"AvailabilityZone": raw.get("Placement", {}).get("AvailabilityZone", "")},
        "SubnetId": raw.get("SubnetId", ""),
        "InstanceLifecycle": raw.get("InstanceLifecycle", ""),
        "Tags": list(raw.get("Tags", ())),
        # the launch's token: a copy of the worker carries its launch-token tag but not this (`ec2_launch_token`)
        "ClientToken": raw.get("ClientToken", ""),
    }


def group_listing(workers: Iterable[Mapping[str, Any]]) -> dict[str, tuple[dict[str, Any], ...]]:
    """Cluster id (its workers' `swarm-autoscaler/cluster` tag) -> its workers' `listing_entry`s."""
    out: dict[str, list[dict[str, Any]]] = {}
    for raw in workers:
        cid = tags_of(raw).get(CLUSTER_TAG)
        if cid:
            out.setdefault(cid, []).append(listing_entry(raw))
    return {cid: tuple(entries) for cid, entries in out.items()}


def instance_arn(region: str, account: str, instance_id: str) -> str:
    """An instance's ARN, as AWS gives it in `ec2:SourceInstanceARN` (partition by region)."""
    partition = (
        "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"
    )
    return f"arn:{partition}:ec2:{region}:{account}:instance/{instance_id}"


def primary_arns(reservations: Iterable[Mapping[str, Any]], keeper_name: str, region: str) -> dict[str, str]:
    """Cluster id -> the instance ARN of its live primary, from DescribeInstances' reservations (their
    `OwnerId` is the account)."""
    out = {}
    for res in reservations:
        for raw in res.get("Instances", ()):
            tags = tags_of(raw)
            cid = tags.get(CLUSTER_ID_TAG)
            live = raw["State"]["Name"] not in GONE
            # a copy of a primary (the console's "launch more like this") never stands for its cluster
            if cid and tags.get(KEEPER_TAG) == keeper_name and live and copied(raw) is None:
                out[cid] = instance_arn(region, str(res.get("OwnerId", "")), raw["InstanceId"])
    return out


RUNNING = frozenset({"pending", "running"})


def excess_workers(
    entries: Iterable[Mapping[str, Any]],
    maximum: int,
    primary_arn: str | None,
    types: Collection[str] | None = None,
) -> list[tuple[str, str]]:
    """(instance id, reason) of one cluster's workers (`listing_entry`s) the keeper ends: those naming
    another primary than the cluster's (`primary_arn`: launched by another cluster's primary under this
    cluster's id, which the primaries' IAM policy cannot tell), then, of the rest that are pending or
    running, the newest beyond `maximum` (the cluster's autoscaler never goes past it: a user's code on
    the primary did). A worker naming no primary (launched before workers named theirs) is counted, not
    ended for that. With `types` (the worker types the keeper offers the cluster), a worker of another
    type is ended too: only the keeper launches workers, so one of another type is a worker the cluster's
    primary stopped and changed (`ModifyInstanceAttribute`). The primary is never among `entries`."""
    live = [e for e in entries if e["State"]["Name"] in RUNNING]
    out: list[tuple[str, str]] = []
    counted = []
    for entry in live:
        named = tags_of(entry).get(PRIMARY_TAG)
        if named and primary_arn and named != primary_arn:
            out.append((entry["InstanceId"], "names another cluster's primary"))
        elif types is not None and entry.get("InstanceType") not in types:
            out.append(
                (entry["InstanceId"], f"type {entry.get('InstanceType')} is not one the keeper offers")
            )
        else:
            counted.append(entry)
    counted.sort(key=lambda e: (str(e.get("LaunchTime", "")), e["InstanceId"]))
    out += [(e["InstanceId"], f"beyond the cluster's maximum of {maximum}") for e in counted[maximum:]]
    return out
