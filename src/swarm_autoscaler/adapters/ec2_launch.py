"""How `Ec2Cloud.launch` reads EC2's refusals and spreads a launch: no client here, so each rule can be
read and tested on its own.

Refusals, by what they block (`refusal_kind`):

- **zone** (`ZONE_CODES`, `ec2_support.CAPACITY_CODES`): this subnet's zone (or the subnet itself) cannot give the type now: no
  capacity, no free address in the subnet, a full capacity reservation, a type the zone does not offer.
  Only (type, subnet, capacity) is backed off; the launch moves on to the next subnet.
- **quota** (`QUOTA_CODES`): the account's limit for the type's family in the region (a vCPU quota, the
  spot instance quota). No subnet can help: (type, capacity) is backed off in every subnet, the operator
  is told once which quota to raise (`quota_advice`), and the launch moves on to the next capacity
  (spot -> on-demand) or, via the planner, the next type.
- **spot** (`SPOT_CODES`): a spot launch EC2 will not serve at the bid (`SpotMaxPriceTooLow`): backed off
  like a zone refusal, for spot only.

Anything else (a bad AMI, a missing permission, invalid parameters) is an error the operator must fix.

Spreading (`spread`): a launch's machines are shared out over the open subnets (zones), starting with the
next subnet in turn, so the fleet survives a zone's outage and a zone's shortage costs only its share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from swarm_autoscaler.adapters.ec2_support import CAPACITY_CODES, error_code
from swarm_autoscaler.core.backoff import SPOT

ZONE_CODES = CAPACITY_CODES  # this subnet (zone) cannot give the type now; another may
# the account's limit in the region: no subnet can help
QUOTA_CODES = frozenset({"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"})
# a spot launch refused at this bid (the spot price is above it)
SPOT_CODES = frozenset({"SpotMaxPriceTooLow"})

RefusalKind = Literal["zone", "quota", "error"]


def refusal_kind(exc: BaseException, capacity: str) -> RefusalKind:
    """What a failed RunInstances blocks (see the module doc)."""
    code = error_code(exc)
    if code in QUOTA_CODES:
        return "quota"
    if code in ZONE_CODES or (capacity == SPOT and code in SPOT_CODES):
        return "zone"
    return "error"


# The Service Quotas names of EC2's vCPU quotas, by the letter(s) the type's family starts with.
# Checked in this order: the longest prefixes first ("inf" before "i", "dl" before "d", "trn" before "t").
_QUOTA_GROUPS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("inf",), "Inf"),
    (("dl",), "DL"),
    (("trn",), "Trn"),
    (("u-",), "High Memory"),
    (("g", "vt"), "G and VT"),
    (("p",), "P"),
    (("f",), "F"),
    (("x",), "X"),
)


def quota_name(type_name: str, capacity: str) -> str:
    """The EC2 service quota (as the Service Quotas console names it) that limits `type_name`."""
    family = type_name.split(".", 1)[0].lower()
    group = "Standard (A, C, D, H, I, M, R, T, Z)"
    for prefixes, name in _QUOTA_GROUPS:
        if family.startswith(prefixes):
            group = name
            break
    if capacity == SPOT:
        return f"All {group} Spot Instance Requests"
    return f"Running On-Demand {group} instances"


def quota_advice(type_name: str, capacity: str, code: str, region: str) -> str:
    """One line for the operator: which quota refused the launch and what to raise."""
    quota = quota_name(type_name, capacity)
    return (
        f"EC2 refused {type_name} ({capacity}) for the account's quota ({code}): raise the EC2 service quota "
        f'"{quota}" (vCPUs) in {region} in the Service Quotas console, or allow other instance types; '
        "the type is skipped in every subnet until its back-off ends"
    )


def rotated(subnets: Sequence[str], start: int) -> tuple[str, ...]:
    """`subnets` beginning at index `start` (modulo their number), wrapping around."""
    if not subnets:
        return ()
    k = start % len(subnets)
    return (*subnets[k:], *subnets[:k])


def share(remaining: int, subnets_left: int) -> int:
    """What the next subnet is asked for when `remaining` machines are spread over `subnets_left` subnets:
    each subnet's share is recomputed after the previous one answered, so a shortfall moves on."""
    return math.ceil(remaining / max(subnets_left, 1))


def metadata_options(hop_limit: int) -> dict[str, Any]:
    """RunInstances' MetadataOptions: IMDSv2 only (session tokens required, as organisation policies
    demand), the endpoint on, and `hop_limit` hops for the token's answer (2 lets containers on a docker
    bridge or overlay network reach the instance's role; 1 keeps them from it)."""
    return {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": hop_limit}
