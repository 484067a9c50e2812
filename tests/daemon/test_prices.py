"""The daemon's prices while it runs (`daemon.prices.Prices.run`): spot quotes read again on their interval
and swapped into the catalogue the loop plans with; a refresh that fails keeps the last prices. The quotes
come from a fake standing in for EC2's DescribeSpotPriceHistory (its adapter is tested against moto in
`tests/adapters/ec2/test_ec2_spot.py`); the Price List is not asked here (its day has not passed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import InstanceType
from swarm_autoscaler.daemon.prices import Prices
from swarm_autoscaler.errors import EndpointError

SPOT, ON_DEMAND = "c5.large", "m5.large"


@dataclass
class Quotes:
    """EC2's spot quotes, one answer per call; an EndpointError stands for EC2 out of reach."""

    answers: list[dict[str, float] | EndpointError]
    asked: list[list[str]] = field(default_factory=list)

    async def spot_prices(self, names: list[str]) -> dict[str, float]:
        self.asked.append(list(names))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, EndpointError):
            raise answer
        return answer


@dataclass
class Holder:
    catalogue: Mapping[str, InstanceType]


async def test_spot_quotes_are_read_again_and_a_failed_read_keeps_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    types = {
        SPOT: {"ami_id": "ami-12345678", "capacity": ["spot", "on-demand"]},
        ON_DEMAND: {"ami_id": "ami-12345678"},
    }
    monkeypatch.setenv("AUTOSCALER_CLUSTER_NAME", "prices")
    monkeypatch.setenv("AUTOSCALER_DASK_SCHEDULER_URL", "tcp://scheduler:8786")
    monkeypatch.setenv("AUTOSCALER_EC2_ALLOWED_TYPES", json.dumps(types))
    quotes = Quotes([{SPOT: 0.03}, EndpointError("http://ec2", "down"), {SPOT: 0.05}])
    prices = Prices(load_settings(), quotes, on_demand={SPOT: 0.085, ON_DEMAND: 0.096})
    prices._listed_at = prices.monotonic()  # read at start: the next Price List read is a day away
    holder = Holder({n: CATALOGUE[n] for n in types})

    seen: list[float | None] = []
    task = asyncio.create_task(prices.run(holder, 0.01))
    for _ in range(200):
        await asyncio.sleep(0.01)
        seen.append(holder.catalogue[SPOT].price_per_hour)
        if len(quotes.asked) >= 3:
            break
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert quotes.asked[:3] == [[SPOT]] * 3  # only the spot-first type without a set spot price
    assert 0.03 in seen  # the first quote, kept through the failed read
    assert holder.catalogue[SPOT].price_per_hour == 0.05  # the latest quote
    assert holder.catalogue[ON_DEMAND].price_per_hour == 0.096  # on-demand: the list's price
