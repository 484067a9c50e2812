"""On-demand prices of EC2 instance types from the AWS Price List API (`pricing:GetProducts`).

`PriceList.on_demand(names)`: USD per hour of each named type in the region, Linux, shared tenancy, no
pre-installed software, used capacity: what a RunInstances with a plain Linux AMI is billed at. The Price
List API answers only in a few regions (us-east-1 is one); it is asked there, whatever the fleet's region,
unless an endpoint is set (an EC2-compatible server, such as the local cloud, that serves it too).

`source_prices(...)` is the one rule the daemon and the keeper share: the operator's per-type price wins,
then the Price List. There is no third source: the package ships no price table, since no dated copy of
AWS's offer files could be had to generate one, and a price typed from memory would bill wallets with an
invented figure. A type with neither price is a start-up error (never $0) that names the types and both
ways out: grant pricing:GetProducts, or set each one's `price_per_hour`. A Price List that cannot be read
(AccessDenied without the permission, no route to it) is said in that error, with AWS's message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.ec2_support import error_message
from swarm_autoscaler.adapters.ec2_transport import ClientLifetime, open_client
from swarm_autoscaler.errors import ConfigurationError

PRICING_REGION = "us-east-1"  # one of the Price List API's endpoints
LINUX_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


def product_price(item: str | Mapping[str, Any]) -> float | None:
    """The hourly on-demand USD price in one Price List product document (a JSON string in the answer)."""
    doc: Mapping[str, Any] = json.loads(item) if isinstance(item, str) else item
    found: list[float] = []
    for term in doc.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            try:
                usd = float(dim.get("pricePerUnit", {}).get("USD", "0") or 0)
            except ValueError:
                continue
            if dim.get("unit") == "Hrs" and usd > 0:
                found.append(usd)
    return min(found) if found else None


class PriceList(ClientLifetime):
    """A client of the Price List API. Use `async with PriceList(...) as prices`."""

    def __init__(
        self,
        *,
        region: str,
        endpoint: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        self.region = region
        self._endpoint = endpoint
        self._credentials = (access_key_id, secret_access_key)
        self._timeout = timeout

    async def start(self) -> Self:
        if self._client is not None:
            return self
        self._stack, self._client = await open_client(
            "pricing",
            region=PRICING_REGION,
            endpoint=self._endpoint,
            credentials=self._credentials,
            # a handful of calls a day; a host that cannot reach the Price List (a private subnet without
            # a route to it) is told so after seconds, not minutes
            retries={"total_max_attempts": 2, "mode": "adaptive"},
            read_timeout=self._timeout,
            connect_timeout=min(self._timeout, 5.0),
        )
        return self

    async def on_demand(self, names: Sequence[str]) -> dict[str, float]:
        """USD per hour of each of `names` the Price List prices in the region (others are left out).
        Raises ClientError / BotoCoreError as the SDK does (AccessDeniedException without the permission)."""
        out: dict[str, float] = {}
        for name in dict.fromkeys(names):
            filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in LINUX_FILTERS.items()]
            filters += [
                {"Type": "TERM_MATCH", "Field": "instanceType", "Value": name},
                {"Type": "TERM_MATCH", "Field": "regionCode", "Value": self.region},
            ]
            pages = self._client.get_paginator("get_products").paginate(
                ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"
            )
            prices = [
                p
                for page in [page async for page in pages]
                for item in page.get("PriceList", ())
                if (p := product_price(item))
            ]
            if prices:
                out[name] = min(prices)
        return out


@dataclass(frozen=True, slots=True)
class Priced:
    """Each type's on-demand price and where it came from ("setting" or "price list"); `unreadable`: why
    the Price List could not be read, when it was asked and failed."""

    prices: dict[str, float]
    sources: dict[str, str]
    unreadable: str | None = None

    def missing(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if n not in self.prices]


async def source_prices(
    names: Sequence[str],
    region: str,
    operator: Mapping[str, float | None],
    price_list: PriceList | None,
) -> Priced:
    """The operator's price, else the Price List's (when `price_list` may be asked). A type with neither
    is absent from the result (the caller refuses to start)."""
    prices: dict[str, float] = {}
    sources: dict[str, str] = {}
    for name in names:
        if (set_price := operator.get(name)) is not None:
            prices[name], sources[name] = set_price, "setting"
    wanted = [n for n in names if n not in prices]
    unreadable: str | None = None
    if wanted and price_list is not None:
        try:
            listed = await price_list.on_demand(wanted)
        except (ClientError, BotoCoreError) as exc:
            unreadable = error_message(exc)  # said in the start's one error line, if a type is left unpriced
        else:
            for name in wanted:
                if name in listed:
                    prices[name], sources[name] = listed[name], "price list"
    return Priced(prices, sources, unreadable)


async def read_prices(
    names: Sequence[str],
    *,
    region: str,
    operator: Mapping[str, float | None],
    setting: str,
    endpoint: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Priced:
    """`source_prices` with a Price List client of its own, for a start-up or a refresh. Raises
    ConfigurationError naming `setting` when a type has no price from any source."""
    async with PriceList(
        region=region, endpoint=endpoint, access_key_id=access_key_id, secret_access_key=secret_access_key
    ) as price_list:
        priced = await source_prices(names, region, operator, price_list)
    missing = priced.missing(names)
    if missing:
        raise ConfigurationError(no_price_message(setting, missing, region, priced.unreadable))
    return priced


def no_price_message(setting: str, missing: Sequence[str], region: str, unreadable: str | None) -> str:
    """One line: which types have no price, why the Price List gave none, and the two ways to fix it."""
    why = (
        f"the AWS Price List could not be read ({unreadable})"
        if unreadable is not None
        else f"the AWS Price List lists no Linux on-demand price for them in {region}"
    )
    return (
        f"{setting}: no price known for {', '.join(missing)} in {region}: {why}; grant pricing:GetProducts "
        'to the role this process runs with, or set "price_per_hour" (USD) for each of them (no type is planned or billed '
        "at an invented price or at $0)"
    )
