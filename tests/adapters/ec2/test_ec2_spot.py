"""Spot capacity with an on-demand fallback, over the moto server with the fault injector: a type whose
capacity is ["spot", "on-demand"] launches spot (InstanceMarketOptions, one-time, terminated on
interruption), falls back to on-demand in the same subnet when EC2 refuses spot for capacity or price,
skips spot there for the back-off while on-demand stays open (so the planner keeps the type), and never
launches a warm-pool machine as spot."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import CloudFactory
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.daemon.app import _with_spot_prices
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork

TYPE = "c5.large"
SPOT_FIRST = {TYPE: ("spot", "on-demand")}


def record_launches(cloud: Ec2Cloud) -> list[dict[str, Any]]:
    """The parameters of every RunInstances the cloud sends, as botocore is about to send them."""
    sent: list[dict[str, Any]] = []

    def note(params: dict[str, Any], **_: Any) -> None:
        sent.append(params)

    cloud._client.meta.events.register("provide-client-params.ec2.RunInstances", note)
    return sent


def market(params: dict[str, Any]) -> str | None:
    options = params.get("InstanceMarketOptions")
    return None if options is None else str(options["MarketType"])


async def test_a_spot_type_launches_one_time_spot_tagged_as_such(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud(capacities=SPOT_FIRST)
    sent = record_launches(cloud)
    result = await cloud.launch(TYPE, 2, {})
    assert len(result.instances) == 2 and result.refused == () and result.error is None
    assert [market(p) for p in sent] == ["spot"]
    assert sent[0]["InstanceMarketOptions"]["SpotOptions"] == {
        "SpotInstanceType": "one-time",
        "InstanceInterruptionBehavior": "terminate",
    }
    listed = {i.id: i for i in await cloud.list_instances()}
    assert all(listed[i.id].spot for i in result.instances)
    assert all(listed[i.id].tags["managed-by"] == "swarm-autoscaler" for i in result.instances)


@pytest.mark.parametrize(
    "code", ["InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded"]
)
async def test_a_refused_spot_launch_falls_back_to_on_demand_in_the_same_subnet(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock, code: str
) -> None:
    cloud = await make_cloud(capacities=SPOT_FIRST, capacity_backoff_initial=60.0)
    sent = record_launches(cloud)
    faults.fail("RunInstances", 1, status=400, code=code, message="no spot for you")
    result = await cloud.launch(TYPE, 1, {})
    assert [market(p) for p in sent] == ["spot", None]
    assert [i.subnet_id for i in result.instances] == [network.subnet_ids[0]]
    assert result.refused == () and result.error is None
    assert not (await cloud.list_instances())[0].spot
    assert cloud.unavailable(clock.now) == ()  # on-demand is open: the planner keeps the type

    again = await cloud.launch(TYPE, 1, {})  # spot skipped in that subnet during the back-off
    assert [market(p) for p in sent[2:]] == [None] and len(again.instances) == 1
    clock.step(60.0)
    await cloud.launch(TYPE, 1, {})
    assert [market(p) for p in sent[3:]] == ["spot"]  # the back-off over: spot first again


async def test_a_type_is_unavailable_only_once_both_capacities_are_refused_everywhere(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    cloud = await make_cloud(capacities=SPOT_FIRST, capacity_backoff_initial=30.0)
    faults.refuse(TYPE)  # every subnet, whatever the capacity
    result = await cloud.launch(TYPE, 1, {})
    assert result.instances == ()
    assert {u.subnet_id for u in result.refused} == set(network.subnet_ids)
    assert {(u.type_name, u.subnet_id) for u in cloud.unavailable(clock.now)} == {
        (TYPE, s) for s in network.subnet_ids
    }
    assert faults.calls()["RunInstances"] == 2 * len(network.subnet_ids)


async def test_a_warm_pool_launch_is_never_spot(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud(capacities=SPOT_FIRST)
    sent = record_launches(cloud)
    result = await cloud.launch(TYPE, 1, {}, pool=True)
    assert len(result.instances) == 1 and [market(p) for p in sent] == [None]
    assert not (await cloud.list_instances())[0].spot


async def test_spot_prices_are_read_from_ec2_for_the_types_asked(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud()
    prices = await cloud.spot_prices([TYPE, "m5.large"])
    assert set(prices) == {TYPE, "m5.large"}  # moto quotes a token price in every zone
    assert all(0 < p < 1 for p in prices.values())
    assert await cloud.spot_prices([]) == {}


async def test_the_daemon_prices_a_spot_first_type_at_ec2s_quote_unless_a_price_is_set(
    make_cloud: CloudFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    types = {
        TYPE: {"ami_id": "ami-12345678", "capacity": ["spot", "on-demand"]},
        "m5.large": {"ami_id": "ami-12345678", "capacity": ["spot"], "spot_price_per_hour": 0.04},
        "m5.xlarge": {"ami_id": "ami-12345678"},
    }
    monkeypatch.setenv("AUTOSCALER_CLUSTER_NAME", "spot")
    monkeypatch.setenv("AUTOSCALER_DASK_SCHEDULER_URL", "tcp://scheduler:8786")
    monkeypatch.setenv("AUTOSCALER_EC2_ALLOWED_TYPES", json.dumps(types))
    catalogue = {name: CATALOGUE[name] for name in types}
    priced = await _with_spot_prices(await make_cloud(), catalogue, load_settings())
    assert priced[TYPE].price_per_hour is not None and priced[TYPE].price_per_hour < 0.01  # moto's quote
    assert priced["m5.large"] == catalogue["m5.large"]  # its set spot price wins, in the policy
    assert priced["m5.xlarge"] == catalogue["m5.xlarge"]  # on-demand: the catalogue's price
