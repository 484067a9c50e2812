"""The prices the daemon plans with, from one rule, kept current while it runs.

On-demand price of each allowed type: the operator's `price_per_hour`, else the AWS Price List
(`pricing:GetProducts`); a type with neither stops the start (`ec2_pricing.read_prices`). A type launched spot first is priced, for the cheapest-fit
choice, at its `spot_price_per_hour` when set, else at the spot price EC2 quotes (the highest over the
zones), else at its on-demand price.

While the daemon runs, `run` re-reads the spot quotes every `AUTOSCALER_EC2_SPOT_PRICE_INTERVAL` and the
Price List once a day (`LIST_INTERVAL`), and swaps the daemon's catalogue for the re-priced one; a
refresh that fails keeps the prices it had, with one warning.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from swarm_autoscaler.adapters.ec2_pricing import read_prices
from swarm_autoscaler.config.settings import Settings
from swarm_autoscaler.core.model import InstanceType
from swarm_autoscaler.errors import AutoscalerError, EndpointError

log = structlog.get_logger("swarm_autoscaler.daemon.prices")

LIST_INTERVAL = 24 * 3600.0
SETTING = "AUTOSCALER_EC2_ALLOWED_TYPES"


class SpotQuotes(Protocol):
    async def spot_prices(self, names: list[str]) -> dict[str, float]: ...


class HasCatalogue(Protocol):
    catalogue: Mapping[str, InstanceType]


def _secret(value: object) -> str | None:
    getter = getattr(value, "get_secret_value", None)
    return None if getter is None else str(getter())


@dataclass
class Prices:
    """The allowed types' prices: `on_demand` by type, `spot` by spot-first type (EC2's quotes)."""

    settings: Settings
    quotes: SpotQuotes
    on_demand: dict[str, float] = field(default_factory=dict)
    spot: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    monotonic: Callable[[], float] = time.monotonic
    _listed_at: float = 0.0

    @property
    def _spot_types(self) -> list[str]:
        return [
            name
            for name, spec in self.settings.ec2.allowed_types.items()
            if spec.capacity[0] == "spot" and spec.spot_price_per_hour is None
        ]

    async def read_list(self) -> None:
        """The on-demand prices (ConfigurationError when a type has none)."""
        ec2 = self.settings.ec2
        priced = await read_prices(
            list(ec2.allowed_types),
            region=ec2.region,
            operator={name: spec.price_per_hour for name, spec in ec2.allowed_types.items()},
            setting=SETTING,
            endpoint=ec2.endpoint,
            access_key_id=_secret(ec2.access_key_id),
            secret_access_key=_secret(ec2.secret_access_key),
        )
        self.on_demand, self.sources = priced.prices, priced.sources
        self._listed_at = self.monotonic()

    async def read_spot(self) -> None:
        wanted = self._spot_types
        if not wanted:
            return
        try:
            self.spot = await self.quotes.spot_prices(wanted)
        except EndpointError as exc:
            log.warning(
                f"spot prices unreadable, the last ones (or on-demand) are used for the choice: {exc}"
            )
            return

    def log(self) -> None:
        """One line with every price and its source (after the start's checks: a failed start says one
        line and nothing else)."""
        log.info("prices", on_demand=self.on_demand, sources=self.sources, spot=self.spot)

    def priced(self, catalogue: Mapping[str, InstanceType]) -> dict[str, InstanceType]:
        """`catalogue` with each type's planning price (see the module doc)."""
        out = {}
        for name, itype in catalogue.items():
            price = self.spot.get(name) if name in self._spot_types else None
            price = price if price is not None else self.on_demand.get(name, itype.price_per_hour)
            out[name] = dataclasses.replace(itype, price_per_hour=price)
        return out

    async def run(self, daemon: HasCatalogue, interval: float) -> None:
        """Refresh every `interval` (spot) and every `LIST_INTERVAL` (the Price List), for ever."""
        while True:
            await asyncio.sleep(interval)
            try:
                if self.monotonic() - self._listed_at >= LIST_INTERVAL:
                    await self.read_list()
                await self.read_spot()
            except AutoscalerError as exc:
                log.warning(f"prices not refreshed, the last ones are kept: {exc}")
                continue
            daemon.catalogue = self.priced(daemon.catalogue)
            self.log()
