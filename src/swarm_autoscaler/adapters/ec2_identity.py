"""One deployment, one identity: a daemon's machines carry its swarm's id, and a second deployment that
claims the same cluster name in the same account and region is refused at start.

The cluster name (`AUTOSCALER_CLUSTER_NAME`) is chosen by people, so two deployments can share one; each
would then take the other's machines (without a node in its swarm) for broken ones of its own and
terminate them, busy ones included. The deployment's identity is its swarm's id (`docker swarm` makes it
once, at `swarm init`; every manager reads the same; it outlives the daemon's restarts and upgrades, and
nothing has to be stored). At start the daemon (`claim`):

- refuses, with one line, when a live machine under its cluster name carries another deployment's id;
- then tags every machine it launches with its own (`ec2.DEPLOYMENT_TAG`, on the instance and its
  volume; the IAM policy forbids changing it afterwards), and counts as its own only machines with its id
  or with none (launched before deployment ids existed): nothing of another deployment is listed,
  stopped, started, tagged or terminated, whatever its name.

Two deployments started at the same moment under one name, before either launched anything, are not
refused; they still never touch each other's machines, and the next start of either is refused.
"""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.ec2 import DEPLOYMENT_TAG, LISTED_STATES, Ec2Cloud
from swarm_autoscaler.adapters.ec2_support import to_endpoint_error
from swarm_autoscaler.errors import ConfigurationError


async def claim(cloud: Ec2Cloud, deployment: str) -> None:
    """Make `deployment` (a swarm id; "" for none) the cloud's identity, after checking that no live
    machine under its cluster name belongs to another deployment (`ConfigurationError`, one line)."""
    if deployment:
        filters = [
            *cloud._ownership_filters(),
            {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
        ]
        try:
            reservations = await cloud._pages("describe_instances", "Reservations", Filters=filters)
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(cloud.endpoint, "DescribeInstances", exc) from None
        others: dict[str, list[str]] = {}
        for raw in (raw for res in reservations for raw in res.get("Instances", ())):
            theirs = {t["Key"]: t["Value"] for t in raw.get("Tags", ())}.get(DEPLOYMENT_TAG)
            if theirs and theirs != deployment:
                others.setdefault(theirs, []).append(raw["InstanceId"])
        if others:
            swarm, machines = sorted(others.items())[0]
            raise ConfigurationError(
                f"AUTOSCALER_CLUSTER_NAME: {cloud.cluster_name!r} is already used in this account and region "
                f"by another deployment (swarm {swarm}, machines {', '.join(sorted(machines)[:3])}): give this "
                "one another name (nothing of the other was touched)"
            )
    cloud.deployment = deployment
