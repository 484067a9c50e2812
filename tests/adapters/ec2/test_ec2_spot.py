"""Spot capacity with an on-demand fallback, over the moto server with the fault injector (standing in
for EC2's spot refusals): a type whose capacity is ["spot", "on-demand"] launches spot
(InstanceMarketOptions, one-time, terminated on interruption); a spot refusal in one zone (capacity,
price) moves spot to the next subnet before on-demand is tried anywhere, while the spot quota
(MaxSpotInstanceCountExceeded) moves the launch to on-demand at once; spot is skipped for the back-off
while on-demand stays open (so the planner keeps the type), and a warm-pool machine is never spot."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, CloudFactory
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.daemon.prices import Prices
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer

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
    assert [market(p) for p in sent] == ["spot", "spot"]  # spread: one per subnet
    assert sent[0]["InstanceMarketOptions"]["SpotOptions"] == {
        "SpotInstanceType": "one-time",
        "InstanceInterruptionBehavior": "terminate",
    }
    listed = {i.id: i for i in await cloud.list_instances()}
    assert all(listed[i.id].spot for i in result.instances)
    assert all(listed[i.id].tags["managed-by"] == "swarm-autoscaler" for i in result.instances)


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "SpotMaxPriceTooLow"])
async def test_a_spot_refusal_in_one_zone_tries_spot_in_the_next_before_on_demand(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock, code: str
) -> None:
    first, second, third = network.subnet_ids
    cloud = await make_cloud(capacities=SPOT_FIRST, capacity_backoff_initial=60.0)
    sent = record_launches(cloud)
    faults.fail("RunInstances", 1, status=400, code=code, message="no spot for you")
    result = await cloud.launch(TYPE, 1, {})
    assert [(market(p), p["SubnetId"]) for p in sent] == [("spot", first), ("spot", second)]
    assert [i.subnet_id for i in result.instances] == [second]
    assert result.refused == () and result.error is None
    assert (await cloud.list_instances())[0].spot
    assert cloud.unavailable(clock.now) == ()  # on-demand is open: the planner keeps the type

    await cloud.launch(TYPE, 2, {})  # spot skipped in the first subnet during the back-off
    assert sorted((market(p), p["SubnetId"]) for p in sent[2:]) == sorted([("spot", second), ("spot", third)])
    clock.step(60.0)
    await cloud.launch(TYPE, 3, {})
    assert sorted(p["SubnetId"] for p in sent[4:]) == sorted(network.subnet_ids)  # the back-off over


async def test_the_spot_quota_moves_the_launch_to_on_demand_at_once(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    cloud = await make_cloud(capacities=SPOT_FIRST, capacity_backoff_initial=60.0)
    sent = record_launches(cloud)
    faults.fail("RunInstances", 1, status=400, code="MaxSpotInstanceCountExceeded", message="quota")
    result = await cloud.launch(TYPE, 1, {})
    # one spot call (the quota is the region's: no other subnet is asked), then on-demand
    assert [market(p) for p in sent] == ["spot", None]
    assert len(result.instances) == 1 and not (await cloud.list_instances())[0].spot
    assert cloud.unavailable(clock.now) == ()  # on-demand is open: the planner keeps the type
    assert cloud.stats.quota_refusals == {(TYPE, "spot", "MaxSpotInstanceCountExceeded"): 1}
    await cloud.launch(TYPE, 1, {})
    assert [market(p) for p in sent[2:]] == [None]  # spot skipped everywhere during the back-off


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
    make_cloud: CloudFactory, moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    types = {
        TYPE: {"ami_id": "ami-12345678", "capacity": ["spot", "on-demand"]},
        "m5.large": {"ami_id": "ami-12345678", "capacity": ["spot"], "spot_price_per_hour": 0.04},
        "m5.xlarge": {"ami_id": "ami-12345678"},
    }
    monkeypatch.setenv("AUTOSCALER_CLUSTER_NAME", "spot")
    monkeypatch.setenv("AUTOSCALER_DASK_SCHEDULER_URL", "tcp://scheduler:8786")
    monkeypatch.setenv("AUTOSCALER_EC2_ALLOWED_TYPES", json.dumps(types))
    monkeypatch.setenv("AUTOSCALER_EC2_ENDPOINT", moto_server.endpoint)  # its Price List stand-in too
    monkeypatch.setenv("AUTOSCALER_EC2_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AUTOSCALER_EC2_SECRET_ACCESS_KEY", SECRET_KEY)
    catalogue = {name: CATALOGUE[name] for name in types}
    prices = Prices(load_settings(), await make_cloud())
    await prices.read_list()
    await prices.read_spot()
    priced = prices.priced(catalogue)
    assert priced[TYPE].price_per_hour is not None and priced[TYPE].price_per_hour < 0.01  # moto's quote
    # its set spot price wins, in the policy; the catalogue keeps the on-demand price (the Price List's:
    # the local stand-in serves the bundled catalogue's approximate figures for these types)
    assert priced["m5.large"].price_per_hour == CATALOGUE["m5.large"].price_per_hour
    assert priced["m5.xlarge"].price_per_hour == CATALOGUE["m5.xlarge"].price_per_hour  # on-demand
