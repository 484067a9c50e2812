"""Usage per wallet: what each (user, wallet) spent on its clusters' machines. Pure, plus one loop.

Every machine of a cluster (its primary and its workers) is billed from its launch to its end (or to
now while it runs), per second with EC2's 60-second minimum, at its type's on-demand price (`UsageAccountant.prices`, read at
the keeper's start by the daemon's rule: the operator's `price_per_hour`, else the AWS Price List; a type
with neither stops the start), or at the spot price when it runs as a spot instance and the price is
known. A machine whose price is not known (a type no longer configured) is never billed at a guess nor
at $0: it is not read, with one warning naming its type, and since a reading is absolute its seconds are
all counted on the first pass that knows its price. How close this is to the bill: docs/keeper-usage.md. A machine is attributed to the (user, wallet) and cluster of its ownership tags.

The ledger (`UsageLedger`, redis in production) stores, per machine, the seconds already counted, and
adds to the totals only what a new reading adds beyond them, in one atomic step: a reading is an
absolute figure (seconds from launch to end or now), so a reading repeated by a restarted keeper or by
another replica counts nothing twice, and a keeper down for a while counts its seconds on the next
pass. Totals are kept by hour (the hour in which a reading counted them), so `since`/`until` select
whole hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import structlog

from swarm_autoscaler.errors import AutoscalerError

log = structlog.get_logger("swarm_autoscaler.keeper.usage")

MINIMUM_S = 60.0  # EC2 bills at least a minute each time a machine starts
HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Machine:
    """One machine of a cluster as EC2 lists it. `ended_at` is None while it runs."""

    instance_id: str
    user_id: str
    wallet_id: str
    cluster_id: str
    instance_type: str
    launched_at: float
    ended_at: float | None = None
    spot_price_per_hour: float | None = None

    def billed_seconds(self, now: float) -> float:
        """Seconds billed if it ended at min(its end, now): at least the minimum once launched."""
        end = now if self.ended_at is None else min(self.ended_at, now)
        if end < self.launched_at:
            return 0.0
        return max(MINIMUM_S, end - self.launched_at)

    @property
    def price_per_second(self) -> float | None:
        """The spot price per second, when the machine runs as a spot instance of known price."""
        return self.price_per_second_at({})

    def price_per_second_at(self, prices: Mapping[str, float]) -> float | None:
        """The spot price when known, else `prices` by type; None when neither is known."""
        if self.spot_price_per_hour is not None:
            return self.spot_price_per_hour / HOUR
        price = prices.get(self.instance_type)
        return None if price is None else price / HOUR


@dataclass(frozen=True, slots=True)
class Reading:
    """What the ledger is told about one machine: its billed seconds so far and their price."""

    machine: Machine
    seconds: float
    price_per_second: float


def readings(machines: Iterable[Machine], now: float, prices: Mapping[str, float]) -> list[Reading]:
    """Each cluster machine's billed seconds so far and their price (`prices`: USD per hour by type). A
    machine with no known price is left out (see the module doc); `unpriced` names their types."""
    out = []
    for m in machines:
        price = m.price_per_second_at(prices)
        if m.cluster_id and price is not None:
            out.append(Reading(m, m.billed_seconds(now), price))
    return out


def unpriced(machines: Iterable[Machine], prices: Mapping[str, float]) -> set[str]:
    """The types of the cluster machines `readings` leaves out for want of a price."""
    return {m.instance_type for m in machines if m.cluster_id and m.price_per_second_at(prices) is None}


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Instance-seconds and cost (USD) of one cluster of one (user, wallet)."""

    user_id: str
    wallet_id: str
    cluster_id: str
    seconds: float
    cost: float


@runtime_checkable
class UsageLedger(Protocol):
    async def record(self, readings: Sequence[Reading], now: float) -> list[Reading]:
        """Add what each reading adds beyond what was counted for its machine; atomic per reading.
        Returns the increments (a reading whose seconds is what was added, its cost seconds times price)."""
        ...

    async def query(
        self, user_id: str | None, wallet_id: str | None, since: float | None, until: float | None
    ) -> list[UsageRow]:
        """The rows of the matching (user, wallet) pairs, counted in hours in [since, until)."""
        ...


def usage_json(rows: Sequence[UsageRow]) -> dict[str, Any]:
    """The API's view: totals, per wallet and per cluster."""
    wallets: dict[tuple[str, str], dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r.user_id, r.wallet_id, r.cluster_id)):
        w = wallets.setdefault(
            (row.user_id, row.wallet_id),
            {"user_id": row.user_id, "wallet_id": row.wallet_id, "instance_seconds": 0.0, "cost_usd": 0.0},
        )
        w["instance_seconds"] += row.seconds
        w["cost_usd"] += row.cost
    return {
        "instance_seconds": round(sum(r.seconds for r in rows), 3),
        "cost_usd": round(sum(r.cost for r in rows), 6),
        "wallets": [
            {**w, "instance_seconds": round(w["instance_seconds"], 3), "cost_usd": round(w["cost_usd"], 6)}
            for w in wallets.values()
        ],
        "clusters": [
            {
                "cluster_id": r.cluster_id,
                "user_id": r.user_id,
                "wallet_id": r.wallet_id,
                "instance_seconds": round(r.seconds, 3),
                "cost_usd": round(r.cost, 6),
            }
            for r in sorted(rows, key=lambda r: (r.user_id, r.wallet_id, r.cluster_id))
        ],
    }


def ended_at(raw: Mapping[str, Any]) -> float | None:
    """When a stopped or terminated instance ended, from EC2's `StateTransitionReason`
    ("User initiated (2026-12-03 07:45:12 GMT)"); None while it runs or when the reason has no time."""
    state = raw.get("State", {}).get("Name", "")
    if state in ("pending", "running"):
        return None
    reason = raw.get("StateTransitionReason") or ""
    start, stop = reason.rfind("("), reason.rfind(")")
    if start < 0 or stop < start:
        return None
    text = reason[start + 1 : stop].replace(" GMT", "").replace(" UTC", "")
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


class MachineSource(Protocol):
    async def machines(self) -> list[Machine]:
        """Every machine of this keeper's clusters EC2 still lists (terminated ones too)."""
        ...


WalletHook = Callable[[Sequence[Reading]], None]


@dataclass
class UsageAccountant:
    """Reads every machine each `interval` and records the readings. Every replica may run one: the
    ledger counts each second once whoever reads it."""

    source: MachineSource
    ledger: UsageLedger
    interval: float = 30.0
    clock: Callable[[], float] = time.time
    on_counted: WalletHook | None = None
    prices: Mapping[str, float] = field(default_factory=dict)  # USD per hour by type, set at start
    passes: int = 0
    _last: float | None = field(default=None)
    _warned: set[str] = field(default_factory=set)

    def _warn_unpriced(self, types: set[str]) -> None:
        for name in sorted(types - self._warned):
            log.warning(
                f"machines of {name} are not billed yet: the keeper priced at start only the types it launches "
                "now, and {name} is not one of them; all their seconds are counted by the first keeper "
                'started with it among AUTOSCALER_KEEPER_WORKER_TYPES (with its "price_per_hour", or with '
                "pricing:GetProducts granted)"
            )
        self._warned |= types

    async def account(self) -> list[Reading]:
        now = self.clock()
        machines = await self.source.machines()
        self._warn_unpriced(unpriced(machines, self.prices))
        added = await self.ledger.record(readings(machines, now, self.prices), now)
        self.passes += 1
        self._last = now
        if self.on_counted is not None and added:
            self.on_counted(added)
        return added

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.account()
            except AutoscalerError as exc:
                log.warning("usage pass failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await stop.wait()
