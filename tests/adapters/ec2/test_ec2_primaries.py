"""The keeper's EC2 adapter (`Ec2Primaries`) against a real moto server over HTTP, with instance-type
validation on: what a cluster's primary is launched with, how clusters are rebuilt from tags alone (a
restart loses nothing), and that terminating a cluster ends its primary and its workers, and nothing else."""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, wire
from tests.keeper.fakes import FakeProbe

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, OWNER_TAG, OWNER_VALUE, PRIMARY_TAG, Ec2Cloud
from swarm_autoscaler.adapters.keeper_listing import KeeperListedCloud
from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler.keeper.adapters.ec2_primaries import SWEEP_EVERY, Ec2Primaries
from swarm_autoscaler.keeper.adapters.tags import (
    CLUSTER_ID_TAG,
    DASHBOARD_URL_TAG,
    KEEPER_TAG,
    SCHEDULER_URL_TAG,
    instance_arn,
    worker_tags,
)
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import listing_token
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.locks import InProcessLocks
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterKey, ClusterState
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer

PRIMARY = "m5.large"
keeper_names = itertools.count(1)
ALICE = ClusterKey("alice", "w1")
BOB = ClusterKey("bob", "none")

Factory = Callable[..., Awaitable[Ec2Primaries]]


def boot(key: ClusterKey, cluster_id: str, profile: str = "default") -> str:
    return f"#!/bin/bash\necho primary {cluster_id} of {key.user_id}/{key.wallet_id}, profile {profile}\n"


@pytest.fixture
async def make_hosts(
    moto_server: MotoServer, network: LocalNetwork, faults: FaultInjector
) -> AsyncIterator[Factory]:
    """Started adapters on the moto server; each test gets its own keeper name unless it passes one."""
    made: list[Ec2Primaries] = []

    async def make(**overrides: Any) -> Ec2Primaries:
        options: dict[str, Any] = {
            "keeper_name": f"keeper-{next(keeper_names)}",
            "region": network.region,
            "endpoint": moto_server.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "primary_type": PRIMARY,
            "ami_id": network.ami_id,
            "user_data": boot,
            "subnet_ids": network.subnet_ids,
            "security_group_ids": [network.security_group_id],
            "key_name": network.key_name,
            "iam_instance_profile": network.instance_profile,
            "custom_tags": {"team": "science"},
            "retry_initial": 0.01,
            "retry_max": 0.05,
        }
        options.update(overrides)
        hosts = await Ec2Primaries(**options).start()
        made.append(hosts)
        return hosts

    yield make
    for hosts in made:
        await hosts.close()


async def _describe(raw_ec2: Any, instance_id: str) -> dict[str, Any]:
    result = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    instance: dict[str, Any] = result["Reservations"][0]["Instances"][0]
    return instance


def _tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", ())}


async def _worker(
    raw_ec2: Any, network: LocalNetwork, cluster_name: str, custom: dict[str, str] | None = None
) -> str:
    """A worker as the cluster's own autoscaler launches it: the daemon's ownership tags, and the custom
    tags the keeper gives that autoscaler."""
    tags = {**(custom or {}), OWNER_TAG: OWNER_VALUE, CLUSTER_TAG: cluster_name}
    result = await raw_ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        SubnetId=network.subnet_ids[0],
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )
    instance_id: str = result["Instances"][0]["InstanceId"]
    return instance_id


async def test_create_launches_a_tagged_primary_with_its_boot_script(
    make_hosts: Factory, raw_ec2: Any
) -> None:
    hosts = await make_hosts()

    cluster = await hosts.create(ALICE, 1_800_000_000.5)

    raw = await _describe(raw_ec2, cluster.primary_id)
    tags = _tags(raw)
    assert raw["InstanceType"] == PRIMARY
    assert tags[OWNER_TAG] == OWNER_VALUE and tags[KEEPER_TAG] == hosts._name
    assert tags[CLUSTER_ID_TAG] == cluster.cluster_id and cluster.cluster_id.startswith("kc-")
    assert tags["swarm-autoscaler/keeper/user"] == "alice"
    assert tags["swarm-autoscaler/keeper/wallet"] == "w1"
    assert tags["swarm-autoscaler/keeper/state"] == "starting"
    assert tags["swarm-autoscaler/keeper/created"] == "1800000000.500"
    assert tags["team"] == "science"
    assert CLUSTER_TAG not in tags  # its own autoscaler must never take the primary for a worker
    attribute = await raw_ec2.describe_instance_attribute(InstanceId=cluster.primary_id, Attribute="userData")
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert user_data == boot(ALICE, cluster.cluster_id)
    assert cluster.state == ClusterState.STARTING and cluster.key == ALICE
    assert cluster.created_at == cluster.last_heartbeat == 1_800_000_000.5
    ip = raw["PrivateIpAddress"]
    assert (cluster.scheduler_url, cluster.dashboard_url) == (f"tls://{ip}:8786", f"http://{ip}:8787")
    assert hosts.stats.api_calls["RunInstances"] == 1


async def test_a_primary_is_launched_with_imdsv2_required_and_the_hop_limit_set(make_hosts: Factory) -> None:
    """At the wire (the RunInstances botocore sends; moto ignores MetadataOptions): an organisation rule
    that refuses launches without IMDSv2 (an SCP on ec2:MetadataHttpTokens) lets the primary through, and
    its autoscaler's container, one hop further than the machine, can still use the instance profile."""
    hosts = await make_hosts()
    sent = wire(hosts, "RunInstances")
    await hosts.create(ALICE, 1_800_000_000.0)
    (params,) = sent
    assert params["MetadataOptions.HttpTokens"] == "required"
    assert params["MetadataOptions.HttpEndpoint"] == "enabled"
    assert params["MetadataOptions.HttpPutResponseHopLimit"] == "2"

    one_hop = await make_hosts(metadata_hop_limit=1)
    sent = wire(one_hop, "RunInstances")
    await one_hop.create(BOB, 1_800_000_000.0)
    assert sent[0]["MetadataOptions.HttpPutResponseHopLimit"] == "1"
    with pytest.raises(ConfigurationError, match="metadata_hop_limit"):
        await make_hosts(metadata_hop_limit=65)


async def test_a_restarted_keeper_rebuilds_every_cluster_from_tags(make_hosts: Factory) -> None:
    hosts = await make_hosts()
    alice = await hosts.create(ALICE, 1_800_000_000.0)
    bob = await hosts.create(BOB, 1_800_000_010.0)
    await hosts.update(
        alice.cluster_id, state=ClusterState.RUNNING, heartbeat=1_800_000_100.0, answered=1_800_000_090.0
    )
    await hosts.update(bob.cluster_id, state=ClusterState.FAILED, reason="x" * 400)

    restarted = await make_hosts(keeper_name=hosts._name)  # nothing in memory
    listed = await restarted.list_clusters()

    assert [c.cluster_id for c in listed] == [alice.cluster_id, bob.cluster_id]
    again_alice, again_bob = listed
    assert again_alice.state == ClusterState.RUNNING and again_alice.key == ALICE
    assert (again_alice.created_at, again_alice.last_heartbeat, again_alice.last_answered) == (
        1_800_000_000.0,
        1_800_000_100.0,
        1_800_000_090.0,
    )
    assert again_alice.scheduler_url == alice.scheduler_url
    assert again_bob.state == ClusterState.FAILED and again_bob.reason == "x" * 256  # EC2's tag value limit
    assert [c.cluster_id for c in await restarted.find(BOB)] == [bob.cluster_id]
    assert await restarted.find(ClusterKey("alice", "none")) == ()


async def test_another_keepers_primaries_are_neither_listed_nor_updated(
    make_hosts: Factory, raw_ec2: Any
) -> None:
    mine, theirs = await make_hosts(), await make_hosts()
    ours = await mine.create(ALICE, 1_800_000_000.0)
    other = await theirs.create(ALICE, 1_800_000_000.0)

    assert [c.cluster_id for c in await mine.list_clusters()] == [ours.cluster_id]
    assert [c.cluster_id for c in await mine.find(ALICE)] == [ours.cluster_id]
    await mine.update(other.cluster_id, state=ClusterState.ENDING)
    assert await mine.terminate(other.cluster_id) == 0

    raw = await _describe(raw_ec2, other.primary_id)
    assert _tags(raw)["swarm-autoscaler/keeper/state"] == "starting"
    assert raw["State"]["Name"] in ("pending", "running")


async def test_terminate_ends_the_primary_and_its_workers_only(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    hosts = await make_hosts()
    cluster = await hosts.create(ALICE, 1_800_000_000.0)
    other = await hosts.create(BOB, 1_800_000_000.0)
    workers = [
        await _worker(raw_ec2, network, cluster.cluster_id, worker_tags(hosts._name, ALICE)) for _ in range(3)
    ]
    others_worker = await _worker(raw_ec2, network, other.cluster_id, worker_tags(hosts._name, BOB))
    # the cluster's id and our ownership, but not this keeper's worker tag: not ours to end (nor does the
    # keeper's IAM policy allow it)
    untagged = await _worker(raw_ec2, network, cluster.cluster_id)
    # carries the cluster id as a tag value, but not our ownership: never ours to terminate
    stranger = await raw_ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": CLUSTER_TAG, "Value": cluster.cluster_id}]}
        ],
    )
    stranger_id = stranger["Instances"][0]["InstanceId"]

    # EC2 (and moto) answer TerminateInstances with `shutting-down`: the primary counts as alive until it
    # is terminated, since its autoscaler may still launch a worker while it shuts down
    assert await hosts.terminate(cluster.cluster_id) == 1

    for instance_id in (cluster.primary_id, *workers):
        assert (await _describe(raw_ec2, instance_id))["State"]["Name"] in ("shutting-down", "terminated")
    for instance_id in (other.primary_id, others_worker, stranger_id, untagged):
        assert (await _describe(raw_ec2, instance_id))["State"]["Name"] in ("pending", "running")
    assert [c.cluster_id for c in await hosts.list_clusters()] == [other.cluster_id]
    calls = hosts.stats.api_calls["TerminateInstances"]
    assert await hosts.terminate(cluster.cluster_id) == 0  # gone now; idempotent: nothing to terminate
    assert await hosts.terminate(cluster.cluster_id) == 0
    assert hosts.stats.api_calls["TerminateInstances"] == calls


async def test_a_primary_stopped_by_someone_else_is_reported_ending(
    make_hosts: Factory, raw_ec2: Any
) -> None:
    hosts = await make_hosts()
    cluster = await hosts.create(ALICE, 1_800_000_000.0)
    await hosts.update(cluster.cluster_id, state=ClusterState.RUNNING)

    await raw_ec2.stop_instances(InstanceIds=[cluster.primary_id])

    (seen,) = await hosts.find(ALICE)
    assert seen.state == ClusterState.ENDING and "stopp" in seen.reason


async def test_the_scheduler_address_tags_override_the_private_ip(make_hosts: Factory, raw_ec2: Any) -> None:
    hosts = await make_hosts()
    cluster = await hosts.create(ALICE, 1_800_000_000.0)
    await raw_ec2.create_tags(
        Resources=[cluster.primary_id],
        Tags=[
            {"Key": SCHEDULER_URL_TAG, "Value": "tcp://127.0.0.1:40001"},
            {"Key": DASHBOARD_URL_TAG, "Value": "http://127.0.0.1:40002"},
        ],
    )

    (seen,) = await hosts.list_clusters()

    assert (seen.scheduler_url, seen.dashboard_url) == ("tcp://127.0.0.1:40001", "http://127.0.0.1:40002")


async def test_a_capacity_refusal_moves_the_primary_to_the_next_subnet(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork, faults: FaultInjector
) -> None:
    hosts = await make_hosts()
    faults.refuse(PRIMARY, subnet_id=network.subnet_ids[0])

    cluster = await hosts.create(ALICE, 1_800_000_000.0)

    assert (await _describe(raw_ec2, cluster.primary_id))["SubnetId"] == network.subnet_ids[1]
    assert hosts.stats.capacity_refusals == 1
    faults.refuse(PRIMARY)  # every subnet
    with pytest.raises(EndpointError, match=r"no capacity for a m5\.large primary"):
        await hosts.create(BOB, 1_800_000_000.0)
    assert await hosts.find(BOB) == ()


async def test_types_ec2_does_not_know_are_configuration_errors(make_hosts: Factory) -> None:
    hosts = await make_hosts()
    await hosts.check([PRIMARY, "t3.micro"])
    with pytest.raises(ConfigurationError, match=r"m5\.bogus"):
        await hosts.check([PRIMARY, "m5.bogus"])
    bogus = await make_hosts(primary_type="m5.bogus")
    with pytest.raises(EndpointError, match="InvalidInstanceType"):
        await bogus.create(ALICE, 1_800_000_000.0)
    assert await bogus.find(ALICE) == ()


async def test_reserved_custom_tags_and_an_oversized_boot_script_are_refused(make_hosts: Factory) -> None:
    with pytest.raises(ConfigurationError, match="reserved"):
        await make_hosts(custom_tags={"swarm-autoscaler/keeper": "x"})
    hosts = await make_hosts(user_data=lambda key, cid, profile: "#" * (17 * 1024))
    with pytest.raises(ConfigurationError, match="user data"):
        await hosts.create(ALICE, 1_800_000_000.0)
    assert hosts.stats.api_calls["RunInstances"] == 0


async def test_unreachable_ec2_is_an_endpoint_error(make_hosts: Factory) -> None:
    hosts = await make_hosts(endpoint="http://127.0.0.1:9", retry_attempts=1, timeout=2.0)
    with pytest.raises(EndpointError, match=r"127\.0\.0\.1:9"):
        await hosts.list_clusters()


async def test_workers_whose_primary_is_gone_are_listed_as_ending_clusters_and_terminated(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    hosts = await make_hosts()
    live = await hosts.create(ALICE, 1_800_000_000.0)
    gone = await hosts.create(BOB, 1_800_000_000.0)
    live_worker = await _worker(raw_ec2, network, live.cluster_id, worker_tags(hosts._name, ALICE))
    orphans = [
        await _worker(raw_ec2, network, gone.cluster_id, worker_tags(hosts._name, BOB)) for _ in range(2)
    ]
    # a worker of another keeper's vanished cluster, and one without the keeper's worker tag: not ours
    foreign = await _worker(raw_ec2, network, "kc-00000000000000aa", worker_tags("someone-else", BOB))
    untagged = await _worker(raw_ec2, network, "kc-00000000000000bb")
    await raw_ec2.terminate_instances(InstanceIds=[gone.primary_id])  # by someone else

    listed = {c.cluster_id: c for c in await hosts.list_clusters()}  # the first listing looks for orphans

    assert set(listed) == {live.cluster_id, gone.cluster_id}
    orphan = listed[gone.cluster_id]
    assert orphan.state == ClusterState.ENDING and orphan.key == BOB and "2 worker(s)" in orphan.reason
    assert await hosts.terminate(gone.cluster_id) == 0
    for instance_id in orphans:
        assert (await _describe(raw_ec2, instance_id))["State"]["Name"] in ("shutting-down", "terminated")
    for instance_id in (live_worker, foreign, untagged, live.primary_id):
        assert (await _describe(raw_ec2, instance_id))["State"]["Name"] in ("pending", "running")
    describes = hosts.stats.api_calls["DescribeInstances"]
    for _ in range(SWEEP_EVERY - 1):  # the look for orphans is periodic: listings in between make one call
        await hosts.list_clusters()
    assert hosts.stats.api_calls["DescribeInstances"] == describes + SWEEP_EVERY - 1
    assert [c.cluster_id for c in await hosts.list_clusters()] == [live.cluster_id]


async def test_machines_lists_primary_and_workers_with_owner_type_and_spot_price(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    """Usage's source: every machine of this keeper, terminated ones too, attributed from its tags; a
    spot worker carries the spot price EC2 reports, an on-demand one none (its list price is used)."""
    hosts = await make_hosts()
    cluster = await hosts.create(ALICE, 1_800_000_000.5)
    on_demand = await _worker(raw_ec2, network, cluster.cluster_id, worker_tags(hosts._name, ALICE))
    tags = {**worker_tags(hosts._name, ALICE), OWNER_TAG: OWNER_VALUE, CLUSTER_TAG: cluster.cluster_id}
    result = await raw_ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        SubnetId=network.subnet_ids[0],
        InstanceMarketOptions={"MarketType": "spot"},
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )
    spot = result["Instances"][0]["InstanceId"]
    await _worker(raw_ec2, network, "kc-someone-else", worker_tags("another-keeper", BOB))
    await raw_ec2.terminate_instances(InstanceIds=[on_demand])

    machines = {m.instance_id: m for m in await hosts.machines()}

    assert set(machines) == {cluster.primary_id, on_demand, spot}
    assert {(m.user_id, m.wallet_id, m.cluster_id) for m in machines.values()} == {
        ("alice", "w1", cluster.cluster_id)
    }
    assert (
        machines[cluster.primary_id].instance_type == PRIMARY
        and machines[cluster.primary_id].ended_at is None
    )
    assert machines[on_demand].ended_at is not None and machines[on_demand].spot_price_per_hour is None
    price = machines[spot].spot_price_per_hour
    assert price is not None and price > 0
    assert machines[spot].price_per_second == price / 3600


async def test_a_cluster_s_autoscaler_lists_its_instances_from_the_keeper_as_from_ec2(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork, moto_server: MotoServer
) -> None:
    """One paged DescribeInstances by the keeper serves every cluster: its autoscaler (the daemon's EC2
    adapter, `KeeperListedCloud`) reads its workers over the keeper's API (a real aiohttp server, the
    moto server behind the keeper) and sees what its own DescribeInstances would list, ownership tags
    checked again; nothing of another cluster; a listing older than its limit is an EndpointError."""
    hosts = await make_hosts()
    alice, bob = await hosts.create(ALICE, 1_800_000_000.0), await hosts.create(BOB, 1_800_000_000.0)
    mine = {
        await _worker(raw_ec2, network, alice.cluster_id, worker_tags(hosts._name, ALICE)) for _ in range(3)
    }
    await _worker(raw_ec2, network, bob.cluster_id, worker_tags(hosts._name, BOB))
    await raw_ec2.terminate_instances(InstanceIds=[next(iter(sorted(mine)))])  # listed for an hour
    keeper = Keeper(hosts, FakeProbe(), InProcessLocks(), KeeperTiming(), interval=60.0)
    before = hosts.stats.api_calls["DescribeInstances"]
    await keeper.discover()
    assert hosts.stats.api_calls["DescribeInstances"] == before + 1  # both clusters, workers and all
    app = build_keeper_app(keeper, "admin-secret", KeeperMetrics())
    common: dict[str, Any] = {
        "cluster_name": alice.cluster_id,
        "region": network.region,
        "endpoint": moto_server.endpoint,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
        "allowed_types": {},
        "subnet_ids": network.subnet_ids,
        "security_group_ids": [network.security_group_id],
        "join_command": lambda: None,
    }
    async with TestClient(TestServer(app)) as client, Ec2Cloud(**common) as direct:
        url = str(client.make_url(f"/v1/primaries/{alice.cluster_id}/instances"))
        token = listing_token("admin-secret", alice.cluster_id)
        async with KeeperListedCloud(listing_url=url, listing_token=token, **common) as listed:
            from_ec2 = await direct.list_instances()
            from_keeper = await listed.list_instances()
            assert {i.id for i in from_keeper} == mine == {i.id for i in from_ec2}
            assert sorted(from_keeper, key=lambda i: i.id) == sorted(from_ec2, key=lambda i: i.id)
            assert direct.stats.api_calls["DescribeInstances"] == 1
            assert listed.stats.api_calls["DescribeInstances"] == 0 and listed.listings == 1
            # The listing names the cluster's primary: every worker it launches will carry its ARN
            # (the primaries' IAM policy compares it with ${ec2:SourceInstanceARN}).
            assert listed.primary_arn == instance_arn(network.region, "123456789012", alice.primary_id)
        # A stale listing or a refused token: the cluster lists from EC2 itself (a keeper that is down
        # must not stop its clusters scaling), once per fallback interval, and says why.
        async with KeeperListedCloud(listing_url=url, listing_token=token, max_age=-1.0, **common) as stale:
            assert {i.id for i in await stale.list_instances()} == mine
            assert stale.lost is not None and "old" in stale.lost
            assert stale.stats.api_calls["DescribeInstances"] == 1 and stale.fallbacks == 1
        async with KeeperListedCloud(listing_url=url, listing_token="wrong", **common) as refused:
            assert {i.id for i in await refused.list_instances()} == mine
            assert {i.id for i in await refused.list_instances()} == mine  # within the interval: reused
            assert refused.lost is not None and "401" in refused.lost
            assert refused.stats.api_calls["DescribeInstances"] == 1 and refused.fallbacks == 1
            # No listing has named the primary: a launch is not sent (IAM would refuse it untagged).
            result = await refused.launch("m5.large", 1, {})
            assert result.instances == () and "primary" in (result.error or "")
            assert refused.stats.api_calls.get("RunInstances", 0) == 0
        # Both the keeper and EC2 unreachable: only then does the tick act on nothing.
        broken = dict(common, endpoint="http://127.0.0.1:9", retry_attempts=1)
        async with KeeperListedCloud(listing_url=url, listing_token="wrong", **broken) as blind:
            with pytest.raises(EndpointError):
                await blind.list_instances()


async def test_the_keeper_ends_workers_past_a_cluster_s_maximum_and_those_naming_another_primary(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    """Stands in for a user's code on alice's primary, holding the primary's role (IAM lets it launch
    workers naming that primary, however many): it launches past the cluster's maximum, and one worker
    under bob's cluster id with its own ARN (billed to bob's cluster, which IAM cannot tell). EC2 is moto
    (it counts nothing); the keeper's own listing finds both: on its next discovery it terminates the
    newest workers beyond the maximum and the forged one, logs one line each and counts a
    `worker-trimmed` action; the older workers, bob's own and both primaries keep running."""
    maximum = 2
    hosts = await make_hosts()
    alice, bob = await hosts.create(ALICE, 1_800_000_000.0), await hosts.create(BOB, 1_800_000_000.0)
    await hosts.list_clusters()
    alice_arn, bob_arn = hosts.primary_arn(alice.cluster_id), hosts.primary_arn(bob.cluster_id)
    assert alice_arn and bob_arn and alice_arn != bob_arn

    def tags(key: ClusterKey, arn: str) -> dict[str, str]:
        return {**worker_tags(hosts._name, key), PRIMARY_TAG: arn}

    older = [
        await _worker(raw_ec2, network, alice.cluster_id, tags(ALICE, alice_arn)) for _ in range(maximum)
    ]
    bobs = await _worker(raw_ec2, network, bob.cluster_id, tags(BOB, bob_arn))
    await asyncio.sleep(1.1)  # EC2's LaunchTime has whole seconds: the excess is the newer by a second
    newer = [await _worker(raw_ec2, network, alice.cluster_id, tags(ALICE, alice_arn)) for _ in range(2)]
    forged = await _worker(raw_ec2, network, bob.cluster_id, tags(BOB, alice_arn))
    actions: list[str] = []
    keeper = Keeper(
        hosts, FakeProbe(), InProcessLocks(), KeeperTiming(), interval=60.0, max_workers=maximum,
        on_action=actions.append,
    )  # fmt: skip
    try:
        await keeper.discover()
        for _ in range(100):  # each cluster's task takes its lease
            if keeper.held == 2:
                break
            await asyncio.sleep(0.02)
        assert keeper.held == 2
        with capture_logs() as logs:
            await keeper.discover()
    finally:
        await keeper.stop()

    states = {iid: (await _describe(raw_ec2, iid))["State"]["Name"] for iid in [*older, *newer, bobs, forged]}
    ended = {iid for iid, state in states.items() if state in ("shutting-down", "terminated")}
    assert ended == {*newer, forged}, states
    for primary in (alice.primary_id, bob.primary_id):
        assert (await _describe(raw_ec2, primary))["State"]["Name"] in ("pending", "running")
    assert actions.count("worker-trimmed") == 3
    lines = [r for r in logs if r.get("event") == "worker ended by the keeper"]
    assert {(r["cluster_id"], r["instance_id"]) for r in lines} == {
        *((alice.cluster_id, iid) for iid in newer),
        (bob.cluster_id, forged),
    }
    assert {r["reason"] for r in lines} == {
        f"beyond the cluster's maximum of {maximum}",
        "names another cluster's primary",
    }


async def test_a_worker_no_longer_past_the_maximum_on_a_fresh_read_is_not_ended(
    make_hosts: Factory, raw_ec2: Any, network: LocalNetwork
) -> None:
    """The keeper's listing can be a whole interval old when it trims. Stands in for a cluster whose own
    autoscaler ended one of its older workers after the listing: the listing still finds two workers past
    the maximum of 2, a fresh read (moto, over HTTP) only the newest. Only that one is terminated; the other
    is no longer beyond the maximum, and ending it would end somebody's work."""
    maximum = 2
    hosts = await make_hosts()
    alice = await hosts.create(ALICE, 1_800_000_000.0)
    await hosts.list_clusters()
    arn = hosts.primary_arn(alice.cluster_id)
    assert arn
    tags = {**worker_tags(hosts._name, ALICE), PRIMARY_TAG: arn}
    older = [await _worker(raw_ec2, network, alice.cluster_id, tags) for _ in range(maximum)]
    await asyncio.sleep(1.1)  # EC2's LaunchTime has whole seconds
    middle = await _worker(raw_ec2, network, alice.cluster_id, tags)
    await asyncio.sleep(1.1)
    newest = await _worker(raw_ec2, network, alice.cluster_id, tags)
    await hosts.list_clusters()  # the listing: 4 running, 2 past the maximum
    await raw_ec2.terminate_instances(InstanceIds=[older[0]])  # the cluster's autoscaler, after it

    ended = await hosts.trim(maximum, [alice.cluster_id])

    assert [iid for _, iid, _ in ended] == [newest]
    assert (await _describe(raw_ec2, middle))["State"]["Name"] in ("pending", "running")
    assert (await _describe(raw_ec2, newest))["State"]["Name"] in ("shutting-down", "terminated")
