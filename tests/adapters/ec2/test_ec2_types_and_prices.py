"""Any type the region offers, priced from one source, against the moto server over HTTP.

moto stands in for EC2's DescribeInstanceTypes (its bundled data: 1,395 types, GPUs and their memory, each
type's architectures) and DescribeImages (its bundled public AMIs, one of them arm64); the local cloud's
Price List stand-in (`localcloud.pricelist`) stands in for AWS's pricing:GetProducts, which moto lacks:
the prices a test sets there are the test's own figures, not AWS's (none are to be had offline), and
prove only which source a price came from. The issue's "done when": m7i.large, c7g.large on an arm64
AMI and g5.xlarge plan and launch, priced from the Price List.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, BOOT_SCRIPT, SECRET_KEY, CloudFactory
from tests.builders import make_snapshot
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2_pricing import PriceList, read_prices
from swarm_autoscaler.config.keeper import load_keeper_settings
from swarm_autoscaler.config.policy import policy_from_settings
from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.core.actions import Launch
from swarm_autoscaler.core.catalogue import VRAM
from swarm_autoscaler.core.model import GIB, Resources, Task
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.daemon.app import _catalogue
from swarm_autoscaler.daemon.prices import Prices
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler.keeper.app import _prices as keeper_prices
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer

MIB = 1024**2
ARM64_AMI = "ami-0e9271c829888680e"  # moto's bundled Amazon Linux 2022 arm64 image
X86_AMI = "ami-760aaa0f"  # moto's bundled Amazon Linux x86_64 image
DONE_WHEN = {"m7i.large": X86_AMI, "c7g.large": ARM64_AMI, "g5.xlarge": X86_AMI}
# what the local Price List is told to answer for the types the bundled catalogue lacks (a test's figures)
LISTED = {"m7i.large": 0.1008, "c7g.large": 0.0725, "g5.xlarge": 1.006}


def _list(faults: FaultInjector, prices: dict[str, float]) -> None:
    for name, usd in prices.items():
        faults.price_list.set_price("us-east-1", name, usd)


async def test_types_the_bundled_catalogue_lacks_come_from_ec2_with_their_gpu_memory(
    make_cloud: CloudFactory,
) -> None:
    cloud = await make_cloud()
    m7i, c7g, g5 = await cloud.instance_types(["m7i.large", "c7g.large", "g5.xlarge"])
    assert m7i.resources == Resources.of(2.0, 8 * GIB, 0) and m7i.price_per_hour is None
    assert c7g.resources == Resources.of(2.0, 4 * GIB, 0)
    assert g5.resources == Resources.of(4.0, 16 * GIB, 1, **{VRAM: 22888.0 * MIB})  # the A10G's 24 GB


async def test_a_type_the_region_does_not_offer_stops_the_start_in_one_line(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud()
    with pytest.raises(ConfigurationError) as caught:
        await cloud.instance_types(["m7i.large", "m7i.bogus"])
    message = str(caught.value)
    assert "\n" not in message and "AUTOSCALER_EC2_ALLOWED_TYPES" in message
    assert "m7i.bogus" in message and "m7i.large" not in message


async def test_every_type_the_region_offers_is_listed_page_by_page(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud()
    offered = await cloud.offered_types()
    assert len(offered) > 1000 and {"m7i.large", "c7g.large", "g5.xlarge", "p5.48xlarge"} <= {
        t.name for t in offered
    }


async def test_an_ami_of_the_wrong_architecture_stops_the_start_in_one_line(make_cloud: CloudFactory) -> None:
    good = await make_cloud(allowed_types={n: (ami, BOOT_SCRIPT) for n, ami in DONE_WHEN.items()})
    await good.instance_types(list(DONE_WHEN))
    await good.check_images()  # c7g on the arm64 AMI, the others on x86_64

    wrong = await make_cloud(allowed_types={"c7g.large": (X86_AMI, BOOT_SCRIPT)})
    await wrong.instance_types(["c7g.large"])
    with pytest.raises(ConfigurationError) as caught:
        await wrong.check_images()
    message = str(caught.value)
    assert "\n" not in message and "c7g.large" in message and X86_AMI in message and "arm64" in message


async def test_a_missing_ami_stops_the_start(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud(allowed_types={"m7i.large": ("ami-00000000000000000", BOOT_SCRIPT)})
    await cloud.instance_types(["m7i.large"])
    with pytest.raises(ConfigurationError, match="ami-00000000000000000"):
        await cloud.check_images()


def _price_list(server: MotoServer) -> PriceList:
    return PriceList(
        region="us-east-1", endpoint=server.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY
    )


async def test_prices_come_from_the_price_list_asked_as_aws_reads_it(
    moto_server: MotoServer, faults: FaultInjector
) -> None:
    _list(faults, {"m7i.large": 0.1234, "g5.xlarge": 1.006})
    sent: list[dict[str, Any]] = []
    async with _price_list(moto_server) as prices:
        prices._client.meta.events.register(
            "before-send.pricing.GetProducts", lambda request, **_: sent.append(json.loads(request.body))
        )
        got = await prices.on_demand(["m7i.large", "g5.xlarge", "m7i.bogus"])
    assert got == {"m7i.large": 0.1234, "g5.xlarge": 1.006}  # m7i.bogus: listed with no price, left out
    # at the wire: the AmazonEC2 offer, Linux, shared tenancy, no pre-installed software, in the region
    terms = {f["Field"]: f["Value"] for f in sent[0]["Filters"]}
    assert sent[0]["ServiceCode"] == "AmazonEC2"
    assert terms == {
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "instanceType": "m7i.large",
        "regionCode": "us-east-1",
    }


async def test_without_the_permission_the_operator_prices_and_an_unpriced_type_stops_the_start(
    moto_server: MotoServer, faults: FaultInjector
) -> None:
    """AccessDeniedException, as AWS answers a principal without pricing:GetProducts: the operator's
    prices still serve, and a type without one is a one-line start-up error naming both fixes."""
    _list(faults, LISTED)
    faults.price_list.deny()
    kwargs: dict[str, Any] = {
        "region": "us-east-1",
        "setting": "AUTOSCALER_EC2_ALLOWED_TYPES",
        "endpoint": moto_server.endpoint,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
    }
    priced = await read_prices(
        ["m7i.large", "c7g.large"], operator={"m7i.large": 0.2, "c7g.large": 0.05}, **kwargs
    )
    assert priced.prices == {"m7i.large": 0.2, "c7g.large": 0.05}
    assert set(priced.sources.values()) == {"setting"}
    with pytest.raises(ConfigurationError) as caught:
        await read_prices(["m7i.large", "c7g.large"], operator={"c7g.large": 0.05}, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        "AUTOSCALER_EC2_ALLOWED_TYPES: no price known for m7i.large "
    )
    assert "c7g.large" not in message  # priced by its setting
    assert "AccessDenied" in message and "pricing:GetProducts" in message and "price_per_hour" in message


async def test_a_type_with_no_price_anywhere_stops_the_start(moto_server: MotoServer) -> None:
    with pytest.raises(ConfigurationError) as caught:
        await read_prices(
            ["m7i.large", "x2iedn.metal"],  # neither listed with a price by the local Price List
            region="us-east-1",
            operator={},
            setting="AUTOSCALER_EC2_ALLOWED_TYPES",
            endpoint=moto_server.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
        )
    message = str(caught.value)
    assert "no price known for m7i.large, x2iedn.metal in us-east-1" in message
    assert "lists no Linux on-demand price" in message and "price_per_hour" in message and "$0" in message


@pytest.mark.parametrize("source", ["price list", "setting"])
async def test_m7i_c7g_on_arm64_and_g5_plan_and_launch_priced_from_the_price_list_or_the_operator(
    source: str,
    make_cloud: CloudFactory,
    moto_server: MotoServer,
    network: LocalNetwork,
    faults: FaultInjector,
    clock: SteppedClock,
    monkeypatch: pytest.MonkeyPatch,
    raw_ec2: Any,
) -> None:
    """The issue's "done when". "price list": AWS's pricing:GetProducts answers (the local stand-in, told
    the test's prices); "setting": the principal lacks pricing:GetProducts (AccessDeniedException) and
    the operator sets each type's price_per_hour instead."""
    _list(faults, LISTED)
    types: dict[str, dict[str, Any]] = {name: {"ami_id": ami} for name, ami in DONE_WHEN.items()}
    if source == "setting":
        faults.price_list.deny()
        for name, usd in LISTED.items():
            types[name]["price_per_hour"] = usd
    for key, value in {
        "AUTOSCALER_CLUSTER_NAME": "done-when",
        "AUTOSCALER_DASK_SCHEDULER_URL": "tcp://scheduler:8786",
        "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(types),
        "AUTOSCALER_EC2_ENDPOINT": moto_server.endpoint,
        "AUTOSCALER_EC2_ACCESS_KEY_ID": ACCESS_KEY,
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY": SECRET_KEY,
        "AUTOSCALER_EC2_SUBNET_IDS": ",".join(network.subnet_ids),
    }.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    cloud = await make_cloud(allowed_types={n: (ami, BOOT_SCRIPT) for n, ami in DONE_WHEN.items()})
    # the start-up path of `daemon.app`: EC2 describes, the AMIs are checked, the types are priced
    prices = Prices(settings, cloud)
    await prices.read_list()
    catalogue = prices.priced(await _catalogue(cloud, list(DONE_WHEN)))
    await cloud.check_images()
    assert {n: t.price_per_hour for n, t in catalogue.items()} == LISTED
    assert prices.sources == dict.fromkeys(DONE_WHEN, source)
    policy = policy_from_settings(settings, catalogue)
    work = {  # one task at a time, and the type the cheapest fit gives it
        Task("cpu", Resources.of(1.0, 2 * GIB)): "c7g.large",  # $0.0725 < m7i's $0.1008
        Task("memory", Resources.of(1.0, 6 * GIB)): "m7i.large",  # c7g.large has 4 GiB
        Task("vram", Resources.of(1.0, 2 * GIB, 1, **{VRAM: 20.0 * GIB})): "g5.xlarge",  # the A10G's 22.3 GiB
    }
    for task, expected in work.items():
        snapshot = make_snapshot(unrunnable=[task], types=list(catalogue.values()), now=clock.now)
        (launch,) = [a for a in plan(snapshot, policy).actions if isinstance(a, Launch)]
        assert (launch.type_name, launch.count) == (expected, 1)
        result = await cloud.launch(launch.type_name, launch.count, {})
        assert len(result.instances) == 1 and result.error is None
        described = await raw_ec2.describe_instances(InstanceIds=[result.instances[0].id])
        assert described["Reservations"][0]["Instances"][0]["ImageId"] == DONE_WHEN[expected]


async def test_a_price_list_out_of_reach_stops_the_start_within_seconds_saying_why() -> None:
    """A manager in a private subnet with no route to the Price List: a closed port stands for it."""
    started = asyncio.get_running_loop().time()
    with pytest.raises(ConfigurationError) as caught:
        await read_prices(
            ["m7i.large"],
            region="us-east-1",
            operator={},
            setting="AUTOSCALER_EC2_ALLOWED_TYPES",
            endpoint="http://127.0.0.1:9",
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
        )
    assert "could not be read" in str(caught.value) and "m7i.large" in str(caught.value)
    assert asyncio.get_running_loop().time() - started < 15


async def test_the_keeper_prices_its_primary_type_from_its_own_setting_without_the_price_list(
    moto_server: MotoServer, faults: FaultInjector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper's usage ledger without pricing:GetProducts (AccessDeniedException): the workers' types
    are priced by their price_per_hour, the primary's by AUTOSCALER_KEEPER_PRIMARY_PRICE_PER_HOUR; without
    that one the keeper does not start, and the line names the setting."""
    faults.price_list.deny()
    ami = "ami-0123456789abcdef0"
    for key, value in {
        "AUTOSCALER_KEEPER_TOKEN": "a-Keeper-token-0123456789",
        "AUTOSCALER_KEEPER_NAME": "priced-keeper",
        "AUTOSCALER_KEEPER_PUBLIC_URL": "https://10.0.0.5:8080",
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": ami,
        "AUTOSCALER_KEEPER_PRIMARY_TYPE": "m7i.large",
        "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps(
            {"c7g.large": {"ami_id": ami, "price_per_hour": 0.0725}}
        ),
        "AUTOSCALER_EC2_ENDPOINT": moto_server.endpoint,
        "AUTOSCALER_EC2_ACCESS_KEY_ID": ACCESS_KEY,
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY": SECRET_KEY,
    }.items():
        monkeypatch.setenv(key, value)
    types = ["m7i.large", "c7g.large"]
    with pytest.raises(ConfigurationError) as caught:
        await keeper_prices(load_keeper_settings(), types)
    assert "m7i.large" in str(caught.value) and "AUTOSCALER_KEEPER_PRIMARY_PRICE_PER_HOUR" in str(
        caught.value
    )
    monkeypatch.setenv("AUTOSCALER_KEEPER_PRIMARY_PRICE_PER_HOUR", "0.1008")
    assert await keeper_prices(load_keeper_settings(), types) == {"m7i.large": 0.1008, "c7g.large": 0.0725}
