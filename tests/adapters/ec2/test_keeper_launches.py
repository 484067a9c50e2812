"""The keeper's launch route (`POST /v1/primaries/<id>/launches`, `keeper.launches`) over real HTTP, the
keeper's EC2 adapters (`Ec2Primaries`, `Ec2Workers`) behind it on a moto server.

What stands in for what: moto stands in for EC2 and evaluates no IAM (what the primaries' role may do is
the evaluator's verdict, `tests/audit`); the HTTP client stands in for a user's code on their primary,
which holds the cluster's token (it is in the primary's boot script) and can send the keeper any body.
The keeper is the real `Keeper` with its listing (`discover`), in-process locks and a probe that is never
asked. "Nothing launched" is moto's state read back after each refusal.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, join_command, wire
from tests.keeper.fakes import FakeProbe

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, OWNER_TAG, OWNER_VALUE, PRIMARY_TAG
from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG, ticket
from swarm_autoscaler.adapters.keeper_listing import KeeperListedCloud
from swarm_autoscaler.core.model import Node
from swarm_autoscaler.daemon.join import JoinDesk
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.adapters.ec2_workers import Ec2Workers
from swarm_autoscaler.keeper.adapters.tags import WORKER_KEEPER_TAG, WORKER_USER_TAG, WORKER_WALLET_TAG
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import listing_token
from swarm_autoscaler.keeper.launches import Launches
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.locks import InProcessLocks
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer

SECRET = "admin-secret-of-the-launch-test"
ALICE, BOB = ClusterKey("alice", "w1"), ClusterKey("bob", "w2")
MAXIMUM = 3
names = itertools.count(1)


@dataclass
class Setup:
    keeper: Keeper
    hosts: Ec2Primaries
    client: TestClient[Any, Any]
    alice: str
    bob: str
    arns: dict[str, str]


@pytest.fixture
async def setup(moto_server: MotoServer, network: LocalNetwork) -> AsyncIterator[Setup]:
    name = f"keeper-launch-{next(names)}"
    hosts = await Ec2Primaries(
        keeper_name=name, region=network.region, endpoint=moto_server.endpoint, access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY, primary_type="m5.large", ami_id=network.ami_id,
        user_data=lambda key, cid, profile: "#!/bin/bash\n", subnet_ids=network.subnet_ids,
        security_group_ids=[network.security_group_id], key_name=network.key_name,
        iam_instance_profile=network.instance_profile, custom_tags={"team": "science"},
        retry_initial=0.01, retry_max=0.05,
    ).start()  # fmt: skip
    keeper = Keeper(hosts, FakeProbe(), InProcessLocks(), KeeperTiming(), interval=60.0, clock=hosts.now)
    workers = Ec2Workers(
        hosts, keeper_name=name, amis={"m5.large": network.ami_id, "t3.micro": network.ami_id},
        security_group_ids=[network.security_group_id], key_name=network.key_name,
        custom_tags={"team": "science"},
    )  # fmt: skip
    launches = Launches(
        keeper, workers, types={"m5.large": ("spot", "on-demand"), "t3.micro": ("on-demand",)},
        maximum=MAXIMUM, subnets=tuple(network.subnet_ids),
    )  # fmt: skip
    alice = await hosts.create(ALICE, hosts.now())
    bob = await hosts.create(BOB, hosts.now())
    await keeper.discover()
    arns = {cid: hosts.primary_arn(cid) or "" for cid in (alice.cluster_id, bob.cluster_id)}
    app = build_keeper_app(keeper, SECRET, KeeperMetrics(), launches=launches)
    try:
        async with TestClient(TestServer(app)) as client:
            yield Setup(keeper, hosts, client, alice.cluster_id, bob.cluster_id, arns)
    finally:
        await keeper.stop()
        await hosts.close()


def body(network: LocalNetwork, **changes: Any) -> dict[str, Any]:
    sent: dict[str, Any] = {
        "instance_type": "m5.large",
        "count": 1,
        "market": "on-demand",
        "subnet_id": network.subnet_ids[0],
        "user_data": "#!/bin/bash\necho worker ${HOSTNAME} [ok]\n",
        "client_token": f"t{next(names)}",
        "labels": {"role": "gpu"},
    }
    sent.update(changes)
    return sent


async def post(setup: Setup, cid: str, sent: Any, token: str | None = None) -> tuple[int, dict[str, Any]]:
    bearer = token if token is not None else listing_token(SECRET, cid)
    data = sent if isinstance(sent, bytes) else json.dumps(sent).encode()
    response = await setup.client.post(
        f"/v1/primaries/{cid}/launches", data=data, headers={"Authorization": f"Bearer {bearer}"}
    )
    answer: dict[str, Any] = await response.json()
    return response.status, answer


async def workers_of(raw_ec2: Any, cid: str) -> list[dict[str, Any]]:
    found = await raw_ec2.describe_instances(Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [cid]}])
    return [raw for res in found["Reservations"] for raw in res["Instances"]]


def tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", ())}


async def test_a_launch_through_the_route_carries_only_what_the_keeper_forces(
    setup: Setup, network: LocalNetwork, raw_ec2: Any
) -> None:
    """The legitimate launch: 200 with the instances in DescribeInstances' shape; on EC2 (read back from
    moto, and the request checked at the wire) the keeper's AMI, subnet, security group, no instance
    profile, IMDSv2 with a hop limit of 1, the user data as sent, and the tags the keeper forces (the
    cluster, its user and wallet, the primary's ARN the keeper computed) beside the asked-for label."""
    sent_wire = wire(setup.hosts, "RunInstances")
    sent = body(network, count=2)
    status, answer = await post(setup, setup.alice, sent)
    assert status == 200, answer
    ids = {raw["InstanceId"] for raw in answer["instances"]}
    assert len(ids) == 2
    found = {raw["InstanceId"]: raw for raw in await workers_of(raw_ec2, setup.alice)}
    assert set(found) == ids
    for raw in found.values():
        held = tags(raw)
        assert held[PRIMARY_TAG] == setup.arns[setup.alice]
        assert held[OWNER_TAG] == OWNER_VALUE and held[CLUSTER_TAG] == setup.alice
        assert held[WORKER_KEEPER_TAG] == setup.hosts._name
        assert (held[WORKER_USER_TAG], held[WORKER_WALLET_TAG]) == ("alice", "w1")
        assert held["swarm-autoscaler/label/role"] == "gpu" and held["team"] == "science"
        assert raw["ImageId"] == network.ami_id and raw["SubnetId"] == network.subnet_ids[0]
        assert "IamInstanceProfile" not in raw
    (call,) = sent_wire
    assert call["MetadataOptions.HttpTokens"] == "required"
    assert call["MetadataOptions.HttpPutResponseHopLimit"] == "1"
    assert "IamInstanceProfile.Name" not in call and "IamInstanceProfile.Arn" not in call
    assert call["ClientToken"] == f"{setup.alice}-{sent['client_token']}"
    assert base64.b64decode(call["UserData"]).decode() == sent["user_data"]
    assert call["SecurityGroupId.1"] == network.security_group_id


async def test_every_launch_past_the_cluster_s_scope_is_refused_and_moto_shows_nothing_launched(
    setup: Setup, network: LocalNetwork, raw_ec2: Any
) -> None:
    """A user's code on alice's primary, with the cluster's token, asks the keeper for what the
    primaries' role used to let it do (and more): each is a 4xx with one "request refused" line, and no
    instance appears in moto under either cluster."""
    status, _ = await post(setup, setup.alice, body(network, count=MAXIMUM - 1))
    assert status == 200  # the maximum leaves room for one more
    before = {cid: len(await workers_of(raw_ec2, cid)) for cid in (setup.alice, setup.bob)}
    alice_token = listing_token(SECRET, setup.alice)
    oversize = "#" * (16 * 1024 + 1)
    refusals: list[tuple[str, str, Any, str | None, int]] = [
        ("past the maximum", setup.alice, body(network, count=2), None, 429),
        ("a type the keeper does not offer", setup.alice, body(network, instance_type="p4d.24xlarge"), None, 403),
        ("spot for an on-demand type", setup.alice, body(network, instance_type="t3.micro", market="spot"), None, 403),
        ("a subnet that is not the keeper's", setup.alice, body(network, subnet_id="subnet-0forged"), None, 403),
        ("oversize user data", setup.alice, body(network, user_data=oversize), None, 400),
        ("user data over 16 KiB in UTF-8", setup.alice, body(network, user_data="é" * 8193), None, 400),
        ("naming the primary itself", setup.alice, body(network, primary_arn=setup.arns[setup.alice]), None, 400),
        ("an instance profile", setup.alice, body(network, iam_instance_profile="admin"), None, 400),
        ("another AMI", setup.alice, body(network, image_id="ami-0deadbeef"), None, 400),
        ("bob's cluster with alice's token", setup.bob, body(network), alice_token, 401),
        ("no token", setup.alice, body(network), "", 401),
        ("a cluster the keeper does not know", "kc-00000000000000ff", body(network), None, 404),
        ("not JSON", setup.alice, b"\x80not json", None, 400),
        ("a count of zero", setup.alice, body(network, count=0), None, 400),
        ("a count that is a string", setup.alice, body(network, count="1"), None, 400),
        ("labels past the limit", setup.alice, body(network, labels={f"k{i}": "v" for i in range(31)}), None, 400),
    ]  # fmt: skip
    for what, cid, sent, token, expected in refusals:
        with capture_logs() as logs:
            status, answer = await post(setup, cid, sent, token)
        assert status == expected, (what, status, answer)
        assert "error" in answer
        assert [line["event"] for line in logs] == ["request refused"], what
    after = {cid: len(await workers_of(raw_ec2, cid)) for cid in (setup.alice, setup.bob)}
    assert after == before


async def test_a_launch_while_over_budget_or_after_the_end_is_refused(
    setup: Setup, network: LocalNetwork, raw_ec2: Any
) -> None:
    """The keeper's budget state (what `read_budgets` finds; set here as it would) refuses every launch
    of the wallet's clusters with 402, not only a hold the user's scheduler could lift; an ended cluster
    gets 409. Bob's cluster, in another wallet, still launches."""
    setup.keeper.over_budget["w1"] = setup.keeper.clock() - 10.0
    status, answer = await post(setup, setup.alice, body(network))
    assert status == 402, answer
    assert await workers_of(raw_ec2, setup.alice) == []
    status, _ = await post(setup, setup.bob, body(network))
    assert status == 200
    await setup.keeper.end(BOB)
    status, answer = await post(setup, setup.bob, body(network))
    assert status == 409, answer
    assert len(await workers_of(raw_ec2, setup.bob)) == 1


async def test_the_count_is_read_fresh_from_ec2_not_from_the_listing(
    setup: Setup, network: LocalNetwork, raw_ec2: Any
) -> None:
    """Workers the keeper's last listing does not show (launched since: here by hand, as an older
    autoscaler holding RunInstances would have) count against the maximum: the keeper reads the cluster's
    pending and running workers from EC2 at the launch, under the cluster's lock."""
    listed = {
        "managed-by": "swarm-autoscaler", CLUSTER_TAG: setup.alice, WORKER_KEEPER_TAG: setup.hosts._name,
    }  # fmt: skip
    await raw_ec2.run_instances(
        ImageId=network.ami_id, InstanceType="m5.large", MinCount=MAXIMUM, MaxCount=MAXIMUM,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in listed.items()]}],
    )  # fmt: skip
    status, answer = await post(setup, setup.alice, body(network))
    assert status == 429, answer
    assert len(await workers_of(raw_ec2, setup.alice)) == MAXIMUM


async def test_a_cluster_s_autoscaler_launches_through_the_keeper_and_reads_its_refusals_as_ec2_s(
    setup: Setup, network: LocalNetwork, moto_server: MotoServer, faults: FaultInjector, raw_ec2: Any
) -> None:
    """The daemon's EC2 adapter as a keeper cluster runs it (`KeeperListedCloud`, what `cluster_env`
    configures) sends no RunInstances of its own: its launch is the keeper's route (real HTTP), spread over
    the subnets as before. EC2's capacity refusal, forwarded by the keeper with its code, backs off that
    subnet only; the keeper's refusal past the maximum ends the launch cleanly (no exception: what was
    launched, and the type backed off everywhere, which the planner reads as a capacity refusal)."""
    url = str(setup.client.make_url(f"/v1/primaries/{setup.alice}/instances"))
    common: dict[str, Any] = {
        "cluster_name": setup.alice, "region": network.region, "endpoint": moto_server.endpoint,
        "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
        "allowed_types": {"m5.large": (network.ami_id, "echo booting")}, "subnet_ids": network.subnet_ids,
        "security_group_ids": [network.security_group_id], "join_command": join_command,
        "capacity_backoff_jitter": 0.0, "retry_initial": 0.01, "retry_max": 0.05,
    }  # fmt: skip
    token = listing_token(SECRET, setup.alice)
    async with KeeperListedCloud(listing_url=url, listing_token=token, **common) as cloud:
        await cloud.list_instances()  # the listing names the primary
        assert cloud.launch_url.endswith(f"/v1/primaries/{setup.alice}/launches")
        faults.refuse("m5.large", subnet_id=network.subnet_ids[0])
        result = await cloud.launch("m5.large", 2, {"role": "gpu"})
        assert len(result.instances) == 2 and result.error is None
        assert {i.labels["role"] for i in result.instances} == {"gpu"}
        assert cloud.stats.api_calls.get("RunInstances", 0) == 0  # the primary's own client sent none
        blocked = {(u.type_name, u.subnet_id) for u in cloud.unavailable(cloud.now())}
        assert blocked == {("m5.large", network.subnet_ids[0])}  # EC2's refusal, read as EC2's
        faults.allow()
        found = {raw["InstanceId"]: tags(raw) for raw in await workers_of(raw_ec2, setup.alice)}
        assert set(found) == {i.id for i in result.instances}
        assert all(t[PRIMARY_TAG] == setup.arns[setup.alice] for t in found.values())
        assert all("swarm-autoscaler/hostname" in t for t in found.values())  # its own retag, allowed

        with capture_logs() as logs:
            past = await cloud.launch("m5.large", 3, {})
        assert len(await workers_of(raw_ec2, setup.alice)) <= MAXIMUM
        assert len(past.instances) <= MAXIMUM - 2 and past.error is None and past.refused
        assert any(line["event"].startswith("the keeper refused a launch") for line in logs)
        assert cloud.stats.api_calls.get("RunInstances", 0) == 0


async def test_a_worker_whose_type_its_primary_changed_is_ended_at_the_next_listing(
    setup: Setup, network: LocalNetwork, raw_ec2: Any
) -> None:
    """What the primaries' role still allows on its own workers (stop, modify, start) turns a launched
    worker into a type the keeper does not offer; moto (which evaluates no IAM) takes the change. The
    keeper's next listing ends that worker and keeps the other."""
    status, answer = await post(setup, setup.alice, body(network, count=2))
    assert status == 200, answer
    kept, changed = sorted(raw["InstanceId"] for raw in answer["instances"])
    await raw_ec2.stop_instances(InstanceIds=[changed])
    await raw_ec2.modify_instance_attribute(InstanceId=changed, InstanceType={"Value": "t3.micro"})
    await raw_ec2.start_instances(InstanceIds=[changed])
    await setup.keeper.discover()
    offered = {setup.alice: frozenset({"m5.large"})}
    ended = await setup.hosts.trim(MAXIMUM, [setup.alice], offered)
    assert ended == [(setup.alice, changed, "type t3.micro is not one the keeper offers")]
    states = {raw["InstanceId"]: raw["State"]["Name"] for raw in await workers_of(raw_ec2, setup.alice)}
    assert states[kept] == "running" and states[changed] in ("shutting-down", "terminated")


async def start(
    setup: Setup, cid: str, ids: list[str], token: str | None = None
) -> tuple[int, dict[str, Any]]:
    bearer = token if token is not None else listing_token(SECRET, cid)
    response = await setup.client.post(
        f"/v1/primaries/{cid}/starts",
        data=json.dumps({"instance_ids": ids}).encode(),
        headers={"Authorization": f"Bearer {bearer}"},
    )
    answer: dict[str, Any] = await response.json()
    return response.status, answer


async def test_warm_pool_workers_are_started_by_the_keeper_only_within_the_maximum(
    setup: Setup, network: LocalNetwork, raw_ec2: Any
) -> None:
    """The start route (`POST /v1/primaries/<id>/starts`), which stands in for StartInstances now that
    the primaries' role has none: alice's stopped warm-pool workers start while the cluster stays within
    its maximum; one more is 429, bob's stopped worker or alice's running one is 403, another cluster's
    token 401, and moto shows each of those still as it was. (The stops stand for her autoscaler's own
    StopInstances, which its role keeps.)"""
    status, answer = await post(setup, setup.alice, body(network, count=MAXIMUM, pool=True))
    assert status == 200, answer
    pool = [raw["InstanceId"] for raw in answer["instances"]]
    status, answer = await post(setup, setup.bob, body(network, pool=True))
    bobs = answer["instances"][0]["InstanceId"]
    await raw_ec2.stop_instances(InstanceIds=[*pool, bobs])
    status, answer = await post(setup, setup.alice, body(network))  # one running: two slots left
    assert status == 200, answer
    running = answer["instances"][0]["InstanceId"]

    def state_of(found: list[dict[str, Any]]) -> dict[str, str]:
        return {raw["InstanceId"]: raw["State"]["Name"] for raw in found}

    assert await start(setup, setup.alice, pool[:2]) == (
        200,
        {"cluster_id": setup.alice, "started": pool[:2]},
    )
    refusals = [
        (setup.alice, [pool[2]], None, 429),  # past the maximum of 3
        (setup.alice, [bobs], None, 403),  # another cluster's worker
        (setup.alice, [running], None, 403),  # not stopped
        (setup.bob, [pool[2]], listing_token(SECRET, setup.alice), 401),
    ]
    for cid, ids, token, expected in refusals:
        status, answer = await start(setup, cid, ids, token)
        assert status == expected, (ids, answer)
    states = state_of(await workers_of(raw_ec2, setup.alice)) | state_of(await workers_of(raw_ec2, setup.bob))
    assert states[pool[2]] == states[bobs] == "stopped"
    assert {states[pool[0]], states[pool[1]], states[running]} <= {"pending", "running"}
    # Retyped while stopped (should AWS not refuse the primaries' ModifyInstanceAttribute of the type),
    # it is no worker the keeper offers (c5.large is not among this keeper's types): 403 even with room, and it stays stopped.
    await raw_ec2.terminate_instances(InstanceIds=[running])
    await raw_ec2.modify_instance_attribute(InstanceId=pool[2], InstanceType={"Value": "c5.large"})
    status, answer = await start(setup, setup.alice, [pool[2]])
    assert status == 403 and "worker types" in answer["error"], answer
    assert state_of(await workers_of(raw_ec2, setup.alice))[pool[2]] == "stopped"


async def test_a_keeper_cluster_s_worker_gets_a_join_ticket_not_the_token_and_only_it_can_use_it(
    setup: Setup, network: LocalNetwork, moto_server: MotoServer, raw_ec2: Any
) -> None:
    """A keeper cluster's autoscaler with `AUTOSCALER_EC2_JOIN_URL` (the keeper's default boot script sets
    it to the primary's own address) launches through the keeper with a join ticket in the user data and
    the ticket's nonce in the body; the keeper tags the nonce on the worker. The RunInstances the keeper
    sends, captured at the wire and its user data base64-decoded once as EC2 does, holds no join token
    (what a read-only principal reads with DescribeInstanceAttribute); the cluster's join desk (`JoinDesk`
    over that autoscaler's own DescribeInstances by address, moto standing in for EC2 with the keeper's
    tags on the worker) answers the token to the worker's private IP with its ticket, and refuses the same
    ticket from another address and a wrong ticket from the worker's."""
    sent_wire = wire(setup.hosts, "RunInstances")
    url = str(setup.client.make_url(f"/v1/primaries/{setup.alice}/instances"))
    token = listing_token(SECRET, setup.alice)
    async with KeeperListedCloud(
        listing_url=url, listing_token=token, cluster_name=setup.alice, region=network.region,
        endpoint=moto_server.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
        allowed_types={"m5.large": (network.ami_id, "echo booting")}, subnet_ids=network.subnet_ids,
        security_group_ids=[network.security_group_id], join_command=join_command,
        join_urls=["https://10.0.0.9:8443/v1/join"], retry_initial=0.01, retry_max=0.05,
    ) as cloud:  # fmt: skip
        await cloud.list_instances()  # the listing names the primary
        result = await cloud.launch("m5.large", 1, {})
        (worker,) = result.instances
        (call,) = sent_wire  # the keeper's RunInstances: the primary sent none
        join_token, _ = await join_command()
        user_data = base64.b64decode(call["UserData"]).decode()
        assert join_token not in user_data and "docker swarm join --token SWMTKN" not in user_data
        assert "https://10.0.0.9:8443/v1/join" in user_data
        (raw,) = [r for r in await workers_of(raw_ec2, setup.alice) if r["InstanceId"] == worker.id]
        nonce = tags(raw)[JOIN_NONCE_TAG]
        assert ticket(join_token, nonce) in user_data
        assert tags(raw)[PRIMARY_TAG] == setup.arns[setup.alice]  # the keeper's forced tags still hold

        async def no_nodes() -> tuple[Node, ...]:
            return ()

        desk = JoinDesk(
            machines_at=cloud.machines_at, join_command=join_command, list_nodes=no_nodes,
            clock=cloud.now, max_start_time=600.0, ready=True,
        )  # fmt: skip
        address = raw["PrivateIpAddress"]
        status, answer, _ = await desk.answer(address, ticket(join_token, nonce))
        assert status == 200 and answer["token"] == join_token
        assert (await desk.answer("10.200.0.1", ticket(join_token, nonce)))[0] == 403
        assert (await desk.answer(address, ticket(join_token, "0" * 32)))[0] == 403
