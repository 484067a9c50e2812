"""The capacity back-off: which instance types (per subnet) EC2 recently refused, and until when.

Plain data, no SDK: the EC2 adapter and the simulator's cloud keep their refusals with the same rule.

EC2 refuses capacity per zone, and each subnet lies in one zone: a refusal in one subnet says nothing
about the others. So a refusal blocks only its (type, subnet) pair; a launch goes to the subnets of the
type still open (`open_subnets`), and the planner counts a type as unavailable only while every subnet
it could launch in is blocked (`refused_types`). Taking the whole type out after one subnet refused
would make the plan fall back to a type twice the price while another zone could launch it.

Spot and on-demand capacity are refused apart (a spot shortage, or a spot price above the bid, says
nothing about on-demand capacity), so a strike is per (type, subnet, capacity). `unavailable` reports a
(type, subnet) pair only while every capacity the type may launch with is blocked there, so the planner
still sees one pair per subnet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.model import Unavailable


def launch_subnets(subnets: Sequence[str]) -> tuple[str, ...]:
    """The subnets a launch tries, in order: the configured ones, or "" (EC2 picks) when none is."""
    return tuple(dict.fromkeys(subnets)) or ("",)


def refused_types(unavailable: Iterable[Unavailable], subnets: Sequence[str], now: float) -> frozenset[str]:
    """The types refused, at `now`, in every subnet of `subnets` (see `launch_subnets`). Refusals in
    subnets not among them (an old configuration) block nothing."""
    wanted = set(launch_subnets(subnets))
    blocked: dict[str, set[str]] = {}
    for refusal in unavailable:
        if refusal.until > now and refusal.subnet_id in wanted:
            blocked.setdefault(refusal.type_name, set()).add(refusal.subnet_id)
    return frozenset(name for name, where in blocked.items() if where == wanted)


@dataclass(slots=True)
class _Strike:
    count: int
    until: float


# The defaults of AUTOSCALER_CAPACITY_BACKOFF_INITIAL / _MAX (seconds). A capacity shortage in a zone
# usually lasts minutes: Karpenter skips such an offering for 3 minutes.
DEFAULT_INITIAL = 180.0
DEFAULT_MAXIMUM = 600.0

ON_DEMAND = "on-demand"
SPOT = "spot"
CAPACITIES = (SPOT, ON_DEMAND)


class CapacityBackoff:
    """Which (type, subnet, capacity) offerings EC2 recently refused, and until when they are skipped.

    The first refusal blocks the offering for `initial` seconds; each further refusal of the same one
    (without a success in between) doubles that, up to `maximum`. A success forgets it. `capacity` is
    "on-demand" unless said otherwise; `capacities` maps a type to the capacities it launches with (a
    type not in it: on-demand only).
    """

    def __init__(self, initial: float = DEFAULT_INITIAL, maximum: float = DEFAULT_MAXIMUM) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError(f"need 0 < initial <= maximum, got {initial}, {maximum}")
        self._initial = initial
        self._maximum = maximum
        self._strikes: dict[tuple[str, str, str], _Strike] = {}
        self.capacities: dict[str, tuple[str, ...]] = {}

    def _capacities(self, type_name: str) -> tuple[str, ...]:
        return self.capacities.get(type_name) or (ON_DEMAND,)

    def refused(
        self, type_name: str, subnet_id: str, now: float, capacity: str = ON_DEMAND, jitter: float = 0.0
    ) -> Unavailable:
        """Block the offering. `jitter` (a fraction the caller drew, this module draws nothing) lengthens
        the pause by that much, so that daemons refused together do not all come back at once."""
        previous = self._strikes.get((type_name, subnet_id, capacity))
        count = previous.count + 1 if previous else 1
        delay = min(self._initial * 2 ** (count - 1), self._maximum) * (1.0 + max(jitter, 0.0))
        self._strikes[(type_name, subnet_id, capacity)] = _Strike(count, now + delay)
        return Unavailable(type_name, now + delay, subnet_id)

    def succeeded(self, type_name: str, subnet_id: str, capacity: str = ON_DEMAND) -> None:
        self._strikes.pop((type_name, subnet_id, capacity), None)

    def blocked(self, type_name: str, subnet_id: str, now: float, capacity: str = ON_DEMAND) -> bool:
        strike = self._strikes.get((type_name, subnet_id, capacity))
        return strike is not None and strike.until > now

    def open_subnets(
        self, type_name: str, subnets: Sequence[str], now: float, capacity: str = ON_DEMAND
    ) -> tuple[str, ...]:
        """The subnets of `subnets` (see `launch_subnets`) where `type_name` is not blocked at `now`."""
        return tuple(s for s in launch_subnets(subnets) if not self.blocked(type_name, s, now, capacity))

    def open_offerings(
        self, type_name: str, subnets: Sequence[str], now: float, capacities: Sequence[str]
    ) -> tuple[tuple[str, str], ...]:
        """(subnet, capacity) pairs to try in order: per subnet, each of `capacities` not blocked."""
        return tuple(
            (subnet, capacity)
            for subnet in launch_subnets(subnets)
            for capacity in capacities
            if not self.blocked(type_name, subnet, now, capacity)
        )

    def unavailable(self, now: float) -> tuple[Unavailable, ...]:
        """The (type, subnet) pairs blocked for every capacity of the type, until the first reopens."""
        pairs: dict[tuple[str, str], dict[str, float]] = {}
        for (type_name, subnet_id, capacity), strike in self._strikes.items():
            if strike.until > now:
                pairs.setdefault((type_name, subnet_id), {})[capacity] = strike.until
        return tuple(
            Unavailable(type_name, min(untils[c] for c in self._capacities(type_name)), subnet_id)
            for (type_name, subnet_id), untils in sorted(pairs.items())
            if all(c in untils for c in self._capacities(type_name))
        )
