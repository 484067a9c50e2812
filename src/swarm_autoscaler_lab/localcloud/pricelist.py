"""A local AWS Price List API (`GetProducts`, JSON 1.1 protocol), served by the local cloud's EC2 server.

moto has no Price List service. This one answers `GetProducts` for the AmazonEC2 service code with one
product document per matching instance type, shaped as AWS's (`product.attributes`, `terms.OnDemand`
with an hourly `pricePerUnit.USD`). It prices the bundled catalogue's types at the catalogue's
APPROXIMATE figures (labelled so in `core.catalogue`: for the lab and the demo, never AWS's list) in any
region, and any other type only when a test sets its price (`set_price`): a type it does not know it
lists with no price, as AWS does for a type outside the region, so a test sees the start-up error.
`deny()` makes it answer AccessDeniedException, as AWS does to a principal without pricing:GetProducts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from swarm_autoscaler.core.catalogue import CATALOGUE

TARGET_PREFIX = "AWSPriceListService."
StartResponse = Callable[..., Any]


class PriceListService:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prices: dict[tuple[str, str], float] = {}
        self._denied = False
        self.calls = 0

    def set_price(self, region: str, type_name: str, usd_per_hour: float) -> None:
        with self._lock:
            self._prices[(region, type_name)] = usd_per_hour

    def deny(self, denied: bool = True) -> None:
        with self._lock:
            self._denied = denied

    def reset(self) -> None:
        with self._lock:
            self._prices.clear()
            self._denied = False
            self.calls = 0

    def price(self, region: str, type_name: str) -> float | None:
        with self._lock:
            found = self._prices.get((region, type_name))
        if found is not None:
            return found
        known = CATALOGUE.get(type_name)
        return known.price_per_hour if known is not None else None

    def answer(self, target: str, body: bytes, start_response: StartResponse) -> Iterable[bytes]:
        with self._lock:
            self.calls += 1
            denied = self._denied
        if denied:
            return _reply(
                start_response,
                400,
                {
                    "__type": "AccessDeniedException",
                    "Message": "not authorized to perform pricing:GetProducts",
                },
            )
        if target != f"{TARGET_PREFIX}GetProducts":
            return _reply(
                start_response,
                400,
                {"__type": "InvalidParameterException", "Message": f"{target} is not served here"},
            )
        request = json.loads(body or b"{}")
        terms = {f["Field"]: f["Value"] for f in request.get("Filters", ()) if f.get("Type") == "TERM_MATCH"}
        items = []
        if request.get("ServiceCode") == "AmazonEC2" and terms.get("operatingSystem", "Linux") == "Linux":
            name, region = terms.get("instanceType", ""), terms.get("regionCode", "")
            usd = self.price(region, name)
            if usd is not None:
                items.append(json.dumps(_product(name, region, usd)))
        return _reply(start_response, 200, {"FormatVersion": "aws_v1", "PriceList": items})


def _product(name: str, region: str, usd: float) -> Mapping[str, Any]:
    sku = f"LOCAL{abs(hash((name, region))) % 10**10:010d}"
    term = f"{sku}.JRTCKXETXF"
    return {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": name,
                "regionCode": region,
                "operatingSystem": "Linux",
                "tenancy": "Shared",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                term: {
                    "priceDimensions": {
                        f"{term}.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": f"{usd:.10f}"}}
                    },
                    "sku": sku,
                    "offerTermCode": "JRTCKXETXF",
                }
            }
        },
    }


def _reply(start_response: StartResponse, status: int, doc: Mapping[str, Any]) -> Iterable[bytes]:
    body = json.dumps(doc).encode()
    reason = "OK" if status == 200 else "Bad Request"
    start_response(
        f"{status} {reason}",
        [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))],
    )
    return [body]
