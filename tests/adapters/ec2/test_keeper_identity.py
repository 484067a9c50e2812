"""One keeper deployment, one identity, against a real moto server over HTTP (moto stands in for EC2's
DescribeInstances, RunInstances, CreateTags and TerminateInstances): two keepers given the same
AUTOSCALER_KEEPER_NAME by hand in one account and region (each its own token, so its own deployment id,
`credentials.deployment_id`) never touch each other's primaries or workers, and the second one to start
is refused with one line (`Ec2Primaries.claim`, which `open_keeper` calls at start). A copy of a primary
or of a worker (the console's "launch more like this", which copies every tag) is not the keeper's:
moto returns each instance's own `ClientToken` in DescribeInstances as EC2 does, and the copy is a
RunInstances of the test's own (moto has no console) with the original's tags under a token of its own."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, launch_more_like_this

from swarm_autoscaler.adapters.ec2 import owner_tags
from swarm_autoscaler.adapters.ec2_launch_token import LAUNCH_TOKEN_TAG
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.adapters.ec2_workers import Ec2Workers
from swarm_autoscaler.keeper.adapters.tags import (
    CLUSTER_ID_TAG,
    DEPLOYMENT_TAG,
    KEEPER_TAG,
    WORKER_DEPLOYMENT_TAG,
    tag_list,
    worker_tags,
)
from swarm_autoscaler.keeper.credentials import deployment_id
from swarm_autoscaler.keeper.model import ClusterKey, ClusterState
from swarm_autoscaler.keeper.ports import WorkerLaunch
from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer

names = itertools.count(1)
ALICE = ClusterKey("alice", "w1")
FIRST, SECOND = deployment_id("first-keeper-token-0123"), deployment_id("second-keeper-token-456")
Factory = Callable[..., Awaitable[Ec2Primaries]]


@pytest.fixture
async def make_hosts(moto_server: MotoServer, network: LocalNetwork) -> AsyncIterator[Factory]:
    made: list[Ec2Primaries] = []

    async def make(name: str, deployment: str) -> Ec2Primaries:
        hosts = await Ec2Primaries(
            keeper_name=name, region=network.region, endpoint=moto_server.endpoint,
            access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, primary_type="m5.large",
            ami_id=network.ami_id, user_data=lambda *_: "#!/bin/bash\n",
            subnet_ids=network.subnet_ids, security_group_ids=[network.security_group_id],
            deployment=deployment, retry_initial=0.01, retry_max=0.05,
        ).start()  # fmt: skip
        made.append(hosts)
        return hosts

    yield make
    for hosts in made:
        await hosts.close()


async def _tags(raw_ec2: Any, instance_id: str) -> dict[str, str]:
    found = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    return {t["Key"]: t["Value"] for t in found["Reservations"][0]["Instances"][0].get("Tags", ())}


async def _state(raw_ec2: Any, instance_id: str) -> str:
    found = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    return str(found["Reservations"][0]["Instances"][0]["State"]["Name"])


async def _worker(raw_ec2: Any, network: LocalNetwork, name: str, cluster_id: str, deployment: str) -> str:
    """A worker of `cluster_id` as the keeper's launches and a cluster's autoscaler tag it."""
    tags = {**worker_tags(name, ALICE, deployment), **owner_tags(cluster_id)}
    made = await raw_ec2.run_instances(
        ImageId=network.ami_id, InstanceType="t3.micro", MinCount=1, MaxCount=1,
        SubnetId=network.subnet_ids[0],
        TagSpecifications=[{"ResourceType": "instance", "Tags": tag_list(tags)}],
    )  # fmt: skip
    return str(made["Instances"][0]["InstanceId"])


async def test_a_second_keeper_under_the_same_name_is_refused_and_touches_nothing(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    name = f"same-name-{next(names)}"
    first = await make_hosts(name, FIRST)
    await first.claim()  # nothing under the name yet
    cluster = await first.create(ALICE, first.now())
    primary = cluster.primary_id
    assert (await _tags(raw_ec2, primary))[DEPLOYMENT_TAG] == FIRST
    volumes = await raw_ec2.describe_volumes(Filters=[{"Name": f"tag:{DEPLOYMENT_TAG}", "Values": [FIRST]}])
    assert volumes["Volumes"], "the primary's volume carries the deployment too"
    worker = await _worker(raw_ec2, network, name, cluster.cluster_id, FIRST)
    assert (await _tags(raw_ec2, worker))[WORKER_DEPLOYMENT_TAG] == FIRST

    second = await make_hosts(name, SECOND)
    with pytest.raises(ConfigurationError) as refused:
        await second.claim()
    message = str(refused.value)
    assert message.startswith("AUTOSCALER_KEEPER_NAME: ") and "\n" not in message
    assert f"deployment {FIRST}" in message and primary in message

    # Started at the same moment (before the first launched), the second holds its own id and still
    # lists, retags, counts and ends nothing of the first.
    assert await second.list_clusters() == ()
    assert await second.find(ALICE) == ()
    assert await second.machines() == []
    await second.update(cluster.cluster_id, state=ClusterState.ENDING, reason="not mine")
    assert await second.terminate(cluster.cluster_id) == 0
    assert await second.trim(0, [cluster.cluster_id]) == []
    assert {await _state(raw_ec2, i) for i in (primary, worker)} <= {"pending", "running"}
    assert (await _tags(raw_ec2, primary)).get("swarm-autoscaler/keeper/state") == "starting"

    # The first still sees and ends its own: the primary and the worker.
    (listed,) = await first.list_clusters()
    assert listed.cluster_id == cluster.cluster_id
    listing = first.listing(cluster.cluster_id)
    assert listing is not None and [w["InstanceId"] for w in listing[1]] == [worker]
    await first.terminate(cluster.cluster_id)
    assert await _state(raw_ec2, worker) in ("shutting-down", "terminated")


async def test_primaries_from_before_deployment_ids_stay_their_keeper_s(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    """A primary launched by a keeper without deployment ids (ownership and keeper tags only) belongs to
    no other deployment: the upgraded keeper starts and keeps it as its own."""
    name = f"upgraded-{next(names)}"
    tags = {"managed-by": "swarm-autoscaler", KEEPER_TAG: name, CLUSTER_ID_TAG: "kc-00000000000000aa",
            "swarm-autoscaler/keeper/user": "alice", "swarm-autoscaler/keeper/wallet": "w1"}  # fmt: skip
    old = await raw_ec2.run_instances(
        ImageId=network.ami_id, InstanceType="m5.large", MinCount=1, MaxCount=1,
        SubnetId=network.subnet_ids[0],
        TagSpecifications=[{"ResourceType": "instance", "Tags": tag_list(tags)}],
    )  # fmt: skip
    hosts = await make_hosts(name, SECOND)
    await hosts.claim()
    assert [c.primary_id for c in await hosts.list_clusters()] == [old["Instances"][0]["InstanceId"]]
    await hosts.terminate("kc-00000000000000aa")  # and ends it as its own (nothing left in the shared moto)
    assert await _state(raw_ec2, old["Instances"][0]["InstanceId"]) in ("shutting-down", "terminated")


async def test_a_console_copy_of_a_primary_or_a_worker_is_never_the_keeper_s(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    """The keeper's launches (the primary, with `<cluster id>-<attempt>`; a worker through the launch
    route's `Ec2Workers`, with `<cluster id>-<autoscaler's token>`) write their ClientToken in a tag. A
    copy of either carries every tag but not the token: the keeper lists, finds, counts, bills, trims and
    ends nothing of it, the cluster's primary ARN stays the original's, each copy is logged once, and the
    cluster's listing carries each worker's token for its autoscaler to check again."""
    name = f"copies-{next(names)}"
    hosts = await make_hosts(name, FIRST)
    cluster = await hosts.create(ALICE, hosts.now())
    cid, primary = cluster.cluster_id, cluster.primary_id
    await hosts.list_clusters()
    arn = hosts.primary_arn(cid)
    assert arn is not None and arn.endswith(primary)
    launcher = Ec2Workers(hosts, keeper_name=name, amis={"t3.micro": network.ami_id})
    (entry,) = await launcher.launch(
        WorkerLaunch(cid, ALICE, arn, "t3.micro", 1, False, network.subnet_ids[0], "#!/bin/bash\n", "t1",
                     deployment=FIRST)
    )  # fmt: skip
    worker = entry["InstanceId"]
    assert entry["ClientToken"] == f"{cid}-t1" == (await _tags(raw_ec2, worker))[LAUNCH_TOKEN_TAG]
    assert (await _tags(raw_ec2, primary))[LAUNCH_TOKEN_TAG] == f"{cid}-0"

    copies = [await launch_more_like_this(raw_ec2, primary), await launch_more_like_this(raw_ec2, worker)]
    with capture_logs() as logs:
        for _ in range(2):
            (listed,) = await hosts.list_clusters()
            assert listed.primary_id == primary and hosts.primary_arn(cid) == arn
        assert [c.primary_id for c in await hosts.find(ALICE)] == [primary]
        assert {m.instance_id for m in await hosts.machines()} == {primary, worker}
        assert await launcher.live_workers(cid) == frozenset({worker})
        listing = hosts.listing(cid)
        assert listing is not None and [w["InstanceId"] for w in listing[1]] == [worker]
        assert listing[1][0]["ClientToken"] == f"{cid}-t1"
        assert [iid for _, iid, _ in await hosts.trim(0, [cid])] == [worker]  # past a maximum of 0: ours only
        await hosts.terminate(cid)
    for copy in copies:
        told = [e for e in logs if e.get("instance_id") == copy]
        assert len(told) == 1 and "ClientToken" in told[0]["why"], logs
        assert await _state(raw_ec2, copy) in ("pending", "running")
    assert await _state(raw_ec2, primary) in ("shutting-down", "terminated")
    await raw_ec2.terminate_instances(InstanceIds=copies)  # the shared moto: leave nothing running
