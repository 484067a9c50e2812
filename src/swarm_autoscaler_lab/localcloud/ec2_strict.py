"""A strict EC2: the local cloud's rules where moto is generous (`FaultInjector.be_strict(StrictEc2(...))`).

moto knows a new instance at once, never throttles, has room for any number of machines in any zone,
knows no quota and stores any user data. EC2 does none of that, so under `StrictEc2`:

- **Eventual consistency**: an instance is invisible for `invisible_s` seconds after RunInstances returned
  it: DescribeInstances leaves it out (by filters) or answers `InvalidInstanceID.NotFound` (when asked by
  id), and CreateTags, TerminateInstances and the other calls naming it answer NotFound.
- **Throttling**: more than `rate` requests per second of one action (a token bucket of `burst`) get HTTP
  503 `RequestLimitExceeded`.
- **Partial capacity per zone**: a zone (subnet) runs at most `zone_capacity` machines of a type; a
  RunInstances gets what is left, down to MinCount, else `InsufficientInstanceCapacity`.
- **vCPU quotas per family**: running vCPUs per quota group (`ec2_launch.quota_name`: Standard, G and VT,
  P, ...) are capped by `vcpu_quotas`; a launch beyond it gets as many machines as fit, down to MinCount,
  else `VcpuLimitExceeded`.
- **User data**: RunInstances' `UserData` and ModifyInstanceAttribute's must be valid base64 of at most
  16 KiB once decoded, else `InvalidParameterValue` (moto stores anything).

Counts of running machines are read from moto's own state, in this process, when a request arrives.
`only_product`: the rules apply to the product's requests alone (its user agent), so that a lab world's
own helpers (the machine emulator, the guards) read moto as it is. The counters say how often each fired.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from swarm_autoscaler.adapters.ec2_launch import quota_name
from swarm_autoscaler.core.backoff import ON_DEMAND

USER_DATA_LIMIT = 16 * 1024
_ID_PARAM = re.compile(r"^(InstanceId(\.\d+)?|ResourceId\.\d+)$")
_NAMING = {"CreateTags", "TerminateInstances", "StopInstances", "StartInstances", "ModifyInstanceAttribute"}
Error = tuple[int, str, str]


@dataclass
class StrictEc2:
    invisible_s: float = 2.0
    rate: float = 50.0
    burst: float = 100.0
    zone_capacity: int = 1000
    vcpu_quotas: Mapping[str, int] = field(default_factory=dict)  # quota name -> vCPUs (absent: no cap)
    only_product: bool = False  # the rules apply only to the product's own requests (a world's helpers pass)
    clock: Callable[[], float] = time.monotonic
    throttled: int = 0
    hidden: int = 0
    zone_full: int = 0
    zone_short: int = 0  # launches the zone's room cut short (or refused)
    over_quota: int = 0
    _born: dict[str, float] = field(default_factory=dict)
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --------------------------------------------------------------------------------- before moto

    def check(
        self, action: str, params: dict[str, str], region: str, asked: Mapping[str, str] | None = None
    ) -> Error | None:
        """An error to answer instead of moto, or None. RunInstances: `params` holds the count the local
        EC2 would give (MinCount = MaxCount, what moto launches), `asked` the request's own MinCount; the
        count may be lowered."""
        if not self._take(action):
            self.throttled += 1
            return 503, "RequestLimitExceeded", "Request limit exceeded."
        bad = _user_data_problem(action, params)
        if bad is not None:
            return 400, "InvalidParameterValue", bad
        if action in _NAMING or (action == "DescribeInstances" and any(_ID_PARAM.match(k) for k in params)):
            unseen = [v for k, v in params.items() if _ID_PARAM.match(k) and self._invisible(v)]
            if unseen:
                self.hidden += 1
                return 400, "InvalidInstanceID.NotFound", f"The instance ID '{unseen[0]}' does not exist"
        if action == "RunInstances":
            return self._run_instances(params, region, int((asked or params).get("MinCount") or 1))
        return None

    def _take(self, action: str) -> bool:
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(action, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[action] = (tokens, now)
                return False
            self._buckets[action] = (tokens - 1.0, now)
            return True

    def _invisible(self, instance_id: str) -> bool:
        with self._lock:
            born = self._born.get(instance_id)
        return born is not None and self.clock() - born < self.invisible_s

    def _run_instances(self, params: dict[str, str], region: str, low: int) -> Error | None:
        type_name = params.get("InstanceType", "m1.small")
        high = max(int(params.get("MaxCount") or low), low)
        running = running_now(region)
        subnet = params.get("SubnetId", "")
        in_zone = sum(1 for t, s, _ in running if t == type_name and s == subnet)
        if self.zone_capacity - in_zone < high:
            self.zone_short += 1
        high = min(high, self.zone_capacity - in_zone)
        if high < low:
            return (
                500,
                "InsufficientInstanceCapacity",
                (
                    f"We currently do not have sufficient {type_name} capacity in the Availability Zone you "
                    f"requested ({subnet or 'the region'}). Our system will be working on provisioning additional capacity."
                ),
            )
        capacity = "spot" if params.get("InstanceMarketOptions.MarketType") == "spot" else ON_DEMAND
        quota = quota_name(type_name, capacity)
        if quota in self.vcpu_quotas:
            used = sum(v for t, _, v in running if quota_name(t, capacity) == quota)
            each = _vcpus(type_name)
            high = min(high, (self.vcpu_quotas[quota] - used) // max(each, 1))
            if high < low:
                self.over_quota += 1
                code = "MaxSpotInstanceCountExceeded" if capacity == "spot" else "VcpuLimitExceeded"
                return (
                    400,
                    code,
                    (
                        f"You have requested more vCPU capacity than your current vCPU limit of "
                        f"{self.vcpu_quotas[quota]} allows for the instance bucket that the specified instance "
                        "type belongs to. Please visit http://aws.amazonaws.com/contact-us/ec2-request to request "
                        "an adjustment to this limit."
                    ),
                )
        params["MinCount"] = params["MaxCount"] = str(high)
        return None

    # --------------------------------------------------------------------------------- after moto

    def answered(self, action: str, body: bytes) -> bytes:
        """moto's answer as EC2 would give it: new ids noted, invisible instances left out of listings."""
        if action == "RunInstances":
            ids = [m.decode() for m in re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", body)]
            now = self.clock()
            with self._lock:
                self._born.update(dict.fromkeys(ids, now))
            return body
        if action == "DescribeInstances" and self._born:
            return self._without_invisible(body)
        return body

    def _without_invisible(self, body: bytes) -> bytes:
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return body
        ns = root.tag[1 : root.tag.index("}")] if root.tag.startswith("{") else ""
        q = (lambda name: f"{{{ns}}}{name}") if ns else (lambda name: name)
        changed = False
        for reservations in root.iter(q("reservationSet")):
            for reservation in list(reservations):
                instances = reservation.find(q("instancesSet"))
                if instances is None:
                    continue
                for item in list(instances):
                    iid = item.findtext(q("instanceId")) or ""
                    if self._invisible(iid):
                        instances.remove(item)
                        changed = True
                if len(instances) == 0:
                    reservations.remove(reservation)
        if not changed:
            return body
        self.hidden += 1
        if ns:
            ET.register_namespace("", ns)
        return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))


def _user_data_problem(action: str, params: Mapping[str, str]) -> str | None:
    key = {"RunInstances": "UserData", "ModifyInstanceAttribute": "UserData.Value"}.get(action)
    if key is None or key not in params:
        return None
    try:
        raw = base64.b64decode(params[key], validate=True)
    except (binascii.Error, ValueError):
        return "Invalid BASE64 encoding of user data."
    if len(raw) > USER_DATA_LIMIT:
        return f"User data is limited to {USER_DATA_LIMIT} bytes."
    return None


def _vcpus(type_name: str) -> int:
    from moto.ec2.models.instance_types import INSTANCE_TYPES  # the lab's moto, in this process

    return int(INSTANCE_TYPES.get(type_name, {}).get("VCpuInfo", {}).get("DefaultVCpus", 1))


def running_now(region: str) -> list[tuple[str, str, int]]:
    """(type, subnet, vCPUs) of every pending or running instance moto holds in `region`."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    try:
        backend = ec2_backends[DEFAULT_ACCOUNT_ID][region]
        instances = list(backend.all_instances())
    except Exception:  # a strict rule must never break the local EC2's answer
        return []
    return [
        (i.instance_type, i.subnet_id or "", _vcpus(i.instance_type))
        for i in instances
        if i._state.name in ("pending", "running")
    ]


def chaos_strict() -> StrictEc2:
    """The strict EC2 of the chaos world (`cloudhost`), for the daemon's requests only: a new instance
    unseen for 2 s, 2 requests a second per action (a burst of 3), 3 machines of a type per zone (9 in
    the region, fewer than the fleet's maximum of 14), 28 standard vCPUs (14 m5.large, 7 m5.xlarge)."""
    standard = "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"
    return StrictEc2(
        invisible_s=2.0, rate=2.0, burst=3.0, zone_capacity=3, vcpu_quotas={standard: 28}, only_product=True
    )


def fired(strict: StrictEc2 | None) -> dict[str, int]:
    """How often each strict rule fired (for a chaos report)."""
    if strict is None:
        return {}
    return {
        "ec2_unseen": strict.hidden,
        "ec2_throttled": strict.throttled,
        "ec2_zone_short": strict.zone_short,
        "ec2_over_quota": strict.over_quota,
    }
