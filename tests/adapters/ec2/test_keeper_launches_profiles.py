"""The keeper's launch route for a cluster of a profile with worker types of its own: the cluster's
autoscaler may launch its profile's types (with the profile's AMI, read in the request at the wire) and not the
keeper-wide ones, and a default cluster not the profile's. Over real HTTP, with the keeper's EC2
adapters on a moto server, as tests/adapters/ec2/test_keeper_launches.py (which says what stands in for
what); "nothing launched" is moto's state read back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, wire
from tests.adapters.ec2.test_keeper_launches import body, workers_of
from tests.keeper.fakes import FakeProbe

from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.adapters.ec2_workers import Ec2Workers
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import listing_token
from swarm_autoscaler.keeper.launches import Launches
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.locks import InProcessLocks
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer

SECRET = "admin-secret-of-the-profile-launch-test"
World = tuple[TestClient[Any, Any], Ec2Primaries, str, str, str]


@pytest.fixture
async def world(moto_server: MotoServer, network: LocalNetwork, raw_ec2: Any) -> AsyncIterator[World]:
    name = "keeper-launch-profiles"
    gpu_ami = (
        await raw_ec2.register_image(
            Name="geo-gpu-ami", Architecture="x86_64", RootDeviceName="/dev/xvda", VirtualizationType="hvm"
        )
    )["ImageId"]
    hosts = await Ec2Primaries(
        keeper_name=name, region=network.region, endpoint=moto_server.endpoint, access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY, primary_type="m5.large", ami_id=network.ami_id,
        user_data=lambda key, cid, profile: "#!/bin/bash\n", subnet_ids=network.subnet_ids,
        security_group_ids=[network.security_group_id], retry_initial=0.01, retry_max=0.05,
    ).start()  # fmt: skip
    keeper = Keeper(hosts, FakeProbe(), InProcessLocks(), KeeperTiming(), interval=60.0, clock=hosts.now)
    workers = Ec2Workers(hosts, keeper_name=name, amis={"m5.large": network.ami_id},
                         security_group_ids=[network.security_group_id])  # fmt: skip
    launches = Launches(
        keeper, workers, types={"m5.large": ("on-demand",)}, maximum=3, subnets=tuple(network.subnet_ids),
        profile_types={"default": {"m5.large": ("on-demand",)}, "geo": {"c5.xlarge": ("on-demand",)}},
        profile_amis={"default": {"m5.large": network.ami_id}, "geo": {"c5.xlarge": gpu_ami}},
    )  # fmt: skip
    geo = await hosts.create(ClusterKey("alice", "w1"), hosts.now(), "geo")
    plain = await hosts.create(ClusterKey("bob", "w1"), hosts.now())
    await keeper.discover()
    app = build_keeper_app(keeper, SECRET, KeeperMetrics(), launches=launches)
    try:
        async with TestClient(TestServer(app)) as client:
            yield client, hosts, geo.cluster_id, plain.cluster_id, gpu_ami
    finally:
        await keeper.stop()
        await hosts.close()


async def _post(client: TestClient[Any, Any], cid: str, sent: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = await client.post(
        f"/v1/primaries/{cid}/launches",
        data=json.dumps(sent).encode(),
        headers={"Authorization": f"Bearer {listing_token(SECRET, cid)}"},
    )
    return response.status, await response.json()


async def test_a_profile_s_cluster_launches_its_profile_s_types_only(
    world: World, network: LocalNetwork, raw_ec2: Any
) -> None:
    client, hosts, geo, plain, gpu_ami = world
    sent_wire = wire(hosts, "RunInstances")
    status, answer = await _post(client, geo, body(network, instance_type="m5.large"))
    assert status == 403 and "cluster's worker types ['c5.xlarge']" in answer["error"]
    status, answer = await _post(client, plain, body(network, instance_type="c5.xlarge"))
    assert status == 403 and "['m5.large']" in answer["error"]
    assert sent_wire == [] and await workers_of(raw_ec2, geo) == [] and await workers_of(raw_ec2, plain) == []

    status, answer = await _post(client, geo, body(network, instance_type="c5.xlarge"))
    assert status == 200, answer
    (params,) = sent_wire
    assert (params["InstanceType"], params["ImageId"]) == ("c5.xlarge", gpu_ami)  # the profile's AMI
    assert [raw["InstanceType"] for raw in await workers_of(raw_ec2, geo)] == ["c5.xlarge"]
