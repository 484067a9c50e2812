"""The capacity back-off: which instance types (per subnet) EC2 recently refused, and until when.

Plain data, no SDK: the EC2 adapter and the simulator's cloud keep their refusals with the same rule.

EC2 refuses capacity per zone, and each subnet lies in one zone: a refusal in one subnet says nothing
about the others. So a refusal blocks only its (type, subnet) pair; a launch goes to the subnets of the
type still open (`open_subnets`), and the planner counts a type as unavailable only while every subnet
it could launch in is blocked (`refused_types`). Taking the whole type out after one subnet refused
would make the plan fall back to a type twice the price while another zone could launch it.
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


class CapacityBackoff:
    """Which (type, subnet) pairs EC2 recently refused, and until when they are skipped.

    The first refusal blocks the pair for `initial` seconds; each further refusal of the same pair
    (without a success in between) doubles that, up to `maximum`. A success forgets the pair.
    """

    def __init__(self, initial: float = DEFAULT_INITIAL, maximum: float = DEFAULT_MAXIMUM) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError(f"need 0 < initial <= maximum, got {initial}, {maximum}")
        self._initial = initial
        self._maximum = maximum
        self._strikes: dict[tuple[str, str], _Strike] = {}

    def refused(self, type_name: str, subnet_id: str, now: float) -> Unavailable:
        previous = self._strikes.get((type_name, subnet_id))
        count = previous.count + 1 if previous else 1
        delay = min(self._initial * 2 ** (count - 1), self._maximum)
        self._strikes[(type_name, subnet_id)] = _Strike(count, now + delay)
        return Unavailable(type_name, now + delay, subnet_id)

    def succeeded(self, type_name: str, subnet_id: str) -> None:
        self._strikes.pop((type_name, subnet_id), None)

    def blocked(self, type_name: str, subnet_id: str, now: float) -> bool:
        strike = self._strikes.get((type_name, subnet_id))
        return strike is not None and strike.until > now

    def open_subnets(self, type_name: str, subnets: Sequence[str], now: float) -> tuple[str, ...]:
        """The subnets of `subnets` (see `launch_subnets`) where `type_name` is not blocked at `now`."""
        return tuple(s for s in launch_subnets(subnets) if not self.blocked(type_name, s, now))

    def unavailable(self, now: float) -> tuple[Unavailable, ...]:
        return tuple(
            Unavailable(type_name, strike.until, subnet_id)
            for (type_name, subnet_id), strike in sorted(self._strikes.items())
            if strike.until > now
        )
