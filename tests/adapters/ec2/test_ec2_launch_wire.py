"""Launches as EC2 reads them, checked at the wire (the request botocore sends, see `ec2_helpers.wire`),
against the moto server behind the fault injector. The injector stands in for what moto does not do:
partial capacity in a zone (`stock`: EC2 gives MaxCount when it has the room, fewer down to MinCount
when not), per-subnet and quota refusals with EC2's codes and HTTP statuses, throttling, and a new id
that EC2 does not know yet (InvalidInstanceID.NotFound on CreateTags right after RunInstances)."""

from __future__ import annotations

from collections import Counter

import pytest
from botocore.exceptions import ClientError
from structlog.testing import capture_logs
from tests.adapters.ec2.ec2_helpers import BOOT_SCRIPT, CloudFactory, tags_in, wire
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, OWNER_TAG, OWNER_VALUE
from swarm_autoscaler.adapters.ec2_launch import quota_name, refusal_kind
from swarm_autoscaler.adapters.ec2_launch_token import LAUNCH_TOKEN_TAG
from swarm_autoscaler.adapters.ec2_support import HOSTNAME_TAG
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork

TYPE = "m5.large"
GPU = "g4dn.xlarge"


async def test_every_launch_asks_at_least_one_with_its_tags_and_imdsv2_required(
    make_cloud: CloudFactory, network: LocalNetwork
) -> None:
    cloud = await make_cloud()
    sent = wire(cloud, "RunInstances")
    tagged = wire(cloud, "CreateTags")

    result = await cloud.launch(TYPE, 5, {"pool": "cpu"})

    assert len(result.instances) == 5
    # spread over the three subnets (zones), two, two and one; each asks for at least one
    assert sorted((p["SubnetId"], p["MinCount"], p["MaxCount"]) for p in sent) == sorted(
        [
            (network.subnet_ids[0], "1", "2"),
            (network.subnet_ids[1], "1", "2"),
            (network.subnet_ids[2], "1", "1"),
        ]
    )
    for params in sent:
        instance_tags = tags_in(params, "instance")
        assert instance_tags[OWNER_TAG] == OWNER_VALUE and CLUSTER_TAG in instance_tags
        assert instance_tags["swarm-autoscaler/label/pool"] == "cpu"
        # the launch's idempotency token, also in the instance's tags (a copy of it is then not ours)
        assert instance_tags[LAUNCH_TOKEN_TAG] == params["ClientToken"] != ""
        assert LAUNCH_TOKEN_TAG not in tags_in(params, "volume")
        assert tags_in(params, "volume")[OWNER_TAG] == OWNER_VALUE
        assert params["MetadataOptions.HttpTokens"] == "required"
        assert params["MetadataOptions.HttpEndpoint"] == "enabled"
        assert params["MetadataOptions.HttpPutResponseHopLimit"] == "2"
    # CreateTags after the launch carries only the hostname, never what ownership rests on
    assert tagged and all(p["Tag.1.Key"] == HOSTNAME_TAG and "Tag.2.Key" not in p for p in tagged)


async def test_the_hop_limit_is_a_setting(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud(metadata_hop_limit=1)
    sent = wire(cloud, "RunInstances")
    await cloud.launch(TYPE, 1, {})
    assert sent[0]["MetadataOptions.HttpPutResponseHopLimit"] == "1"


async def test_a_zone_short_of_machines_gives_what_it_has_and_the_rest_goes_elsewhere(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    first, second, _ = network.subnet_ids
    faults.stock(TYPE, 3, subnet_id=first)  # the zone has 3 of the 5 asked
    cloud = await make_cloud(spread_subnets=False, capacity_backoff_initial=30.0)
    sent = wire(cloud, "RunInstances")

    result = await cloud.launch(TYPE, 5, {})

    assert [(p["SubnetId"], p["MinCount"], p["MaxCount"]) for p in sent] == [
        (first, "1", "5"),
        (second, "1", "2"),
    ]
    assert Counter(i.subnet_id for i in result.instances) == {first: 3, second: 2}
    assert result.error is None and cloud.stats.partial_launches == 1
    # the short zone is out of the type for the back-off; the next launch goes straight elsewhere
    assert [(u.subnet_id, u.until) for u in result.refused] == [(first, clock.now + 30.0)]
    again = await cloud.launch(TYPE, 1, {})
    assert [i.subnet_id for i in again.instances] == [second] and len(sent) == 3


async def test_partial_fulfilment_counts_the_rest_as_still_needed(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    faults.stock(TYPE, 2)  # the whole region has 2 more
    cloud = await make_cloud()
    result = await cloud.launch(TYPE, 5, {})
    assert len(result.instances) == 2 and result.error is None
    assert result.refused  # the planner sees the refusal; the 3 missing are planned again next tick


async def test_no_free_address_in_a_subnet_moves_the_launch_to_the_next(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector
) -> None:
    first, second, _ = network.subnet_ids
    faults.refuse(TYPE, subnet_id=first, code="InsufficientFreeAddressesInSubnet")
    cloud = await make_cloud(spread_subnets=False)
    result = await cloud.launch(TYPE, 2, {})
    assert {i.subnet_id for i in result.instances} == {second} and result.error is None
    assert [u.subnet_id for u in result.refused] == [first]


async def test_a_quota_refusal_blocks_the_type_everywhere_and_says_once_what_to_raise(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    # a new account's G and VT quota is 0 vCPUs: EC2 answers VcpuLimitExceeded (400) in any subnet
    faults.refuse(GPU, code="VcpuLimitExceeded")
    cloud = await make_cloud(
        allowed_types={GPU: (network.ami_id, BOOT_SCRIPT), TYPE: (network.ami_id, BOOT_SCRIPT)},
        capacity_backoff_initial=30.0,
    )
    with capture_logs() as logs:
        first = await cloud.launch(GPU, 2, {})
        clock.step(30.0)
        second = await cloud.launch(GPU, 1, {})

    assert first.instances == () and first.error is None
    assert {u.subnet_id for u in first.refused} == set(network.subnet_ids)  # the planner moves on to TYPE
    assert faults.calls()["RunInstances"] == 2  # one call per launch: no subnet can help with a quota
    assert second.instances == () and {u.subnet_id for u in second.refused} == set(network.subnet_ids)
    assert cloud.stats.quota_refusals == {(GPU, "on-demand", "VcpuLimitExceeded"): 2}
    told = [e for e in logs if e["log_level"] == "error"]
    assert len(told) == 1  # once, not every tick
    assert '"Running On-Demand G and VT instances"' in told[0]["event"] and "us-east-1" in told[0]["event"]


@pytest.mark.parametrize(
    ("code", "capacity", "kind"),
    [
        ("InsufficientInstanceCapacity", "on-demand", "zone"),
        ("InsufficientFreeAddressesInSubnet", "on-demand", "zone"),
        ("ReservationCapacityExceeded", "on-demand", "zone"),
        ("Unsupported", "on-demand", "zone"),
        ("SpotMaxPriceTooLow", "spot", "zone"),
        ("SpotMaxPriceTooLow", "on-demand", "error"),
        ("VcpuLimitExceeded", "on-demand", "quota"),
        ("InstanceLimitExceeded", "on-demand", "quota"),
        ("MaxSpotInstanceCountExceeded", "spot", "quota"),
        ("InvalidAMIID.NotFound", "on-demand", "error"),
    ],
)
def test_every_refusal_code_is_classified(code: str, capacity: str, kind: str) -> None:
    exc = ClientError({"Error": {"Code": code, "Message": ""}}, "RunInstances")
    assert refusal_kind(exc, capacity) == kind


def test_the_quota_named_is_the_one_of_the_types_family() -> None:
    assert quota_name("g5.xlarge", "on-demand") == "Running On-Demand G and VT instances"
    assert quota_name("p4d.24xlarge", "spot") == "All P Spot Instance Requests"
    assert quota_name("inf2.xlarge", "on-demand") == "Running On-Demand Inf instances"
    assert (
        quota_name("m7i.large", "on-demand")
        == "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"
    )


async def test_a_refusals_pause_is_jittered_within_bounds(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    faults.refuse(TYPE)
    cloud = await make_cloud(capacity_backoff_initial=100.0, capacity_backoff_jitter=0.2)
    result = await cloud.launch(TYPE, 1, {})
    pauses = [u.until - clock.now for u in result.refused]
    assert len(pauses) == 3 and all(100.0 <= p <= 120.0 for p in pauses)


async def test_a_new_id_ec2_does_not_know_yet_is_tagged_once_it_does(
    make_cloud: CloudFactory, faults: FaultInjector, raw_ec2: object
) -> None:
    # EC2 is eventually consistent: CreateTags right after RunInstances may answer NotFound for seconds
    faults.fail("CreateTags", 2, status=400, code="InvalidInstanceID.NotFound", message="not yet")
    cloud = await make_cloud()
    (instance,) = (await cloud.launch(TYPE, 1, {})).instances
    assert cloud.stats.new_id_not_found == 2 and cloud.stats.hostname_tag_failures == 0
    (listed,) = [i for i in await cloud.list_instances() if i.id == instance.id]
    assert listed.tags[HOSTNAME_TAG] == instance.hostname


async def test_a_new_id_unknown_for_too_long_is_given_up_with_a_bound(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    faults.fail("CreateTags", 50, status=400, code="InvalidInstanceID.NotFound", message="not yet")
    cloud = await make_cloud()
    result = await cloud.launch(TYPE, 1, {})
    assert len(result.instances) == 1  # the launch stands; only the best-effort tag is missing
    assert cloud.stats.hostname_tag_failures == 1 and faults.calls()["CreateTags"] == 6


async def test_throttling_is_retried_and_counted(make_cloud: CloudFactory, faults: FaultInjector) -> None:
    cloud = await make_cloud()
    faults.throttle("DescribeInstances", 2)
    await cloud.list_instances()
    assert cloud.stats.throttled == {"DescribeInstances": 2}
    assert cloud.stats.api_calls["DescribeInstances"] == 3
