"""A keeper user's code on their primary attacks another cluster's worker of the same keeper, at the wire.

What stands in for what:
- EC2 is a moto server; the keeper (`Ec2Primaries`) launches two clusters' primaries there, alice's and
  bob's, and its listing computes each primary's instance ARN.
- IAM is `iam_eval` with `docker/iam-primary-policy.json`, put in front of moto by the local EC2's gate
  (`FaultInjector.gate`): every request is translated into the authorizations AWS makes for it
  (`iam_requests`, with the tags the instances hold in moto at that moment) and decided before moto
  sees it; a refusal is EC2's 403 `UnauthorizedOperation`. moto itself evaluates no condition, so every
  refusal here is the evaluator's verdict, and "nothing changed" is moto's state read back afterwards.
- Each primary's instance-profile credentials are an access key of its own: the gate maps it to the
  primary's instance ARN as `ec2:SourceInstanceARN`, which AWS sets from the instance the credentials
  were issued to (a user cannot choose it). The test's own key (arranging and reading moto, and the
  keeper's) is not gated: the keeper's and daemon's policies are evaluated in `test_iam_conditions.py`.
- Each cluster's autoscaler is the daemon's adapter as a keeper cluster runs it (`KeeperListedCloud`):
  it launches through the keeper's launch route (a real aiohttp server; the keeper signs RunInstances
  with its own key), since the primaries' role holds no RunInstances. What a user's code can still ask of
  that route (past the maximum, over budget, another type, another cluster, oversize user data) is
  refused there: `tests/adapters/ec2/test_keeper_launches.py`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import botocore.session
import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from aiohttp.test_utils import TestServer
from botocore.exceptions import ClientError
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, join_command
from tests.audit.iam_eval import ALLOW, Request, decide
from tests.audit.iam_requests import authorizations
from tests.audit.test_iam_conditions import SOURCE, policy
from tests.keeper.fakes import FakeProbe

from swarm_autoscaler.adapters.ec2 import PRIMARY_TAG, Ec2Cloud
from swarm_autoscaler.adapters.ec2_launch_token import LAUNCH_TOKEN_TAG
from swarm_autoscaler.adapters.keeper_listing import KeeperListedCloud
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.adapters.ec2_workers import Ec2Workers
from swarm_autoscaler.keeper.adapters.tags import worker_tags
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import listing_token
from swarm_autoscaler.keeper.launches import Launches
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.locks import InProcessLocks
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer

ALICE_KEY, BOB_KEY = "AKIAPRIMARYALICE0001", "AKIAPRIMARYBOB000001"  # each primary's profile credentials
ALICE, BOB = ClusterKey("alice", "w1"), ClusterKey("bob", "w2")
SECRET = "the-keeper-s-api-token"


class IamGate:
    """The gate's check: the primaries' policy, with each primary's key standing for its instance."""

    def __init__(self, moto: MotoServer, granted: dict[str, Any], sources: dict[str, str]) -> None:
        self._granted, self._sources = granted, sources
        self._reader = botocore.session.get_session().create_client(
            "ec2", region_name="us-east-1", endpoint_url=moto.endpoint,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        )  # fmt: skip  # sync, from the server's thread: the nested read is the test's own key, not gated
        self.refused: list[tuple[str, str]] = []

    def _tags(self, instance_id: str) -> dict[str, str]:
        try:
            pages = self._reader.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError:
            return {}
        return {t["Key"]: t["Value"] for res in pages for i in res["Instances"] for t in i.get("Tags", ())}

    def __call__(self, action: str, params: dict[str, str], access_key: str) -> str | None:
        source = self._sources.get(access_key)
        if source is None:
            return None
        for sent in authorizations(action, params, self._tags):
            request = Request(sent.action, sent.resource, {**sent.context, SOURCE: [source]})
            if decide(self._granted, request) != ALLOW:
                self.refused.append((action, request.resource))
                return f"not authorized to perform {request.action} on {request.resource}"
        return None


async def _state(raw_ec2: Any, instance_id: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    (res,) = (await raw_ec2.describe_instances(InstanceIds=[instance_id]))["Reservations"]
    raw = res["Instances"][0]
    return raw["State"]["Name"], {t["Key"]: t["Value"] for t in raw.get("Tags", ())}, raw


@dataclass
class World:
    """The keeper (its EC2 adapter, its service and its launch route over real HTTP) on the moto server,
    and a factory of clusters' autoscalers, each with its primary's credentials."""

    hosts: Ec2Primaries
    keeper: Keeper
    autoscaler: Callable[[str, str], Awaitable[Ec2Cloud]]


@asynccontextmanager
async def keeper_world(
    moto_server: MotoServer, network: LocalNetwork, keeper_name: str
) -> AsyncIterator[World]:
    access = {"region": network.region, "endpoint": moto_server.endpoint, "secret_access_key": SECRET_KEY,
              "retry_attempts": 1, "retry_initial": 0.01, "retry_max": 0.05}  # fmt: skip
    hosts = await Ec2Primaries(
        keeper_name=keeper_name, primary_type="m5.large", ami_id=network.ami_id,
        user_data=lambda key, cid, profile: "#!/bin/bash\n", subnet_ids=network.subnet_ids,
        security_group_ids=[network.security_group_id], access_key_id=ACCESS_KEY, **access,
    ).start()  # fmt: skip
    clouds: list[Ec2Cloud] = []
    keeper = Keeper(hosts, FakeProbe(), InProcessLocks(), KeeperTiming(), interval=60.0, clock=hosts.now)
    launcher = Ec2Workers(hosts, keeper_name=keeper_name, amis={"m5.large": network.ami_id},
                          security_group_ids=[network.security_group_id])  # fmt: skip
    launches = Launches(keeper, launcher, {"m5.large": ("on-demand",)}, 4, tuple(network.subnet_ids))
    server = TestServer(build_keeper_app(keeper, SECRET, KeeperMetrics(), launches=launches))
    await server.start_server()

    async def autoscaler(cluster_id: str, access_key: str) -> Ec2Cloud:
        """A cluster's own autoscaler on its primary, with that primary's credentials."""
        cloud = await KeeperListedCloud(
            listing_url=str(server.make_url(f"/v1/primaries/{cluster_id}/instances")),
            listing_token=listing_token(SECRET, cluster_id), cluster_name=cluster_id,
            allowed_types={"m5.large": (network.ami_id, "#!/bin/bash\n")}, subnet_ids=network.subnet_ids,
            security_group_ids=[network.security_group_id], join_command=join_command,
            access_key_id=access_key, **access,
        ).start()  # fmt: skip
        await cloud.list_instances()  # the keeper's listing names the primary
        clouds.append(cloud)
        return cloud

    try:
        yield World(hosts, keeper, autoscaler)
    finally:
        for cloud in clouds:
            await cloud.close()
        await server.close()
        await keeper.stop()
        await hosts.close()


async def test_a_primary_cannot_touch_another_cluster_s_worker_and_moto_shows_nothing_changed(
    moto_server: MotoServer, network: LocalNetwork, faults: FaultInjector, raw_ec2: Any
) -> None:
    keeper_name = f"keeper-attack-{id(faults)}"
    async with keeper_world(moto_server, network, keeper_name) as world:
        await _attack_a_neighbour(world, moto_server, network, faults, raw_ec2, keeper_name)


async def _attack_a_neighbour(
    world: World,
    moto_server: MotoServer,
    network: LocalNetwork,
    faults: FaultInjector,
    raw_ec2: Any,
    keeper_name: str,
) -> None:
    hosts, keeper, autoscaler = world.hosts, world.keeper, world.autoscaler
    try:
        alice, bob = await hosts.create(ALICE, 1_800_000_000.0), await hosts.create(BOB, 1_800_000_000.0)
        await keeper.discover()
        alice_arn, bob_arn = hosts.primary_arn(alice.cluster_id), hosts.primary_arn(bob.cluster_id)
        assert alice_arn and bob_arn and alice_arn != bob_arn
        gate = IamGate(
            moto_server, policy("primary", KEEPER_NAME=keeper_name), {ALICE_KEY: alice_arn, BOB_KEY: bob_arn}
        )
        faults.gate(gate)

        # The legitimate requests, through the gate: each autoscaler launches its worker through the
        # keeper (which signs the launch) and tags its hostname with its own role.
        alices_cloud = await autoscaler(alice.cluster_id, ALICE_KEY)
        bobs_cloud = await autoscaler(bob.cluster_id, BOB_KEY)
        (alices_worker,) = (await alices_cloud.launch("m5.large", 1, {})).instances
        (bobs_worker,) = (await bobs_cloud.launch("m5.large", 1, {})).instances
        assert gate.refused == []
        assert alices_cloud.stats.api_calls.get("RunInstances", 0) == 0  # the keeper launched them
        assert alices_cloud.stats.api_calls.get("CreateTags", 0) == 1  # the hostname, its own worker
        before_state, before_tags, raw = await _state(raw_ec2, bobs_worker.id)
        assert before_tags[PRIMARY_TAG] == bob_arn
        assert "IamInstanceProfile" not in raw  # no credentials on the worker for a task to read
        count_before = len((await raw_ec2.describe_instances())["Reservations"])

        # The attacks: a user's code on alice's primary, with that primary's credentials.
        cluster_tags = [{"Key": k, "Value": v} for k, v in {**worker_tags(keeper_name, ALICE),
                        "managed-by": "swarm-autoscaler", "swarm-autoscaler/cluster": alice.cluster_id}.items()]  # fmt: skip

        def launch(extra: dict[str, str]) -> dict[str, Any]:
            tags = cluster_tags + [{"Key": k, "Value": v} for k, v in extra.items()]
            return {"ImageId": network.ami_id, "InstanceType": "m5.large", "MinCount": 1, "MaxCount": 5,
                    "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}]}  # fmt: skip

        bob_id = [bobs_worker.id]
        attacks: list[tuple[str, dict[str, Any]]] = [
            ("terminate_instances", {"InstanceIds": bob_id}),
            ("stop_instances", {"InstanceIds": bob_id}),
            ("start_instances", {"InstanceIds": bob_id}),
            ("modify_instance_attribute", {"InstanceId": bobs_worker.id, "DisableApiTermination": {"Value": True}}),
            ("create_tags", {"Resources": bob_id, "Tags": [{"Key": "swarm-autoscaler/hostname", "Value": "x"}]}),
            ("create_tags", {"Resources": bob_id, "Tags": [{"Key": PRIMARY_TAG, "Value": alice_arn}]}),
            ("run_instances", launch({PRIMARY_TAG: alice_arn})),  # its own worker, as launches used to be
            ("run_instances", launch({})),  # no primary tag
            ("run_instances", launch({PRIMARY_TAG: bob_arn})),
            ("run_instances", launch({PRIMARY_TAG: alice_arn, "swarm-autoscaler/keeper": keeper_name,
                                      "swarm-autoscaler/keeper/cluster-id": "kc-0000000000000009"})),
        ]  # fmt: skip
        session = get_session()
        config = AioConfig(retries={"total_max_attempts": 1, "mode": "standard"})
        async with session.create_client(
            "ec2", region_name="us-east-1", endpoint_url=moto_server.endpoint, config=config,
            aws_access_key_id=ALICE_KEY, aws_secret_access_key=SECRET_KEY,
        ) as stolen:  # fmt: skip
            for operation, kwargs in attacks:
                with pytest.raises(ClientError) as refused:
                    await getattr(stolen, operation)(**kwargs)
                assert refused.value.response["Error"]["Code"] == "UnauthorizedOperation", operation

        after_state, after_tags, _ = await _state(raw_ec2, bobs_worker.id)
        assert (after_state, after_tags) == (before_state, before_tags)
        assert len((await raw_ec2.describe_instances())["Reservations"]) == count_before  # nothing launched
        assert len(gate.refused) == len(attacks)

        # The same gate lets each primary end its own worker: the refusals above are the condition's.
        await alices_cloud.terminate([alices_worker.id])
        await bobs_cloud.terminate([bobs_worker.id])
        assert len(gate.refused) == len(attacks)
        for worker in (alices_worker, bobs_worker):
            assert (await _state(raw_ec2, worker.id))[0] in ("shutting-down", "terminated")
        print(json.dumps({"attacks_refused": len(attacks), "own_terminations_allowed": 2}))
    finally:
        faults.gate(None)


async def test_a_primary_cannot_retype_or_rewire_its_own_worker_and_its_warm_pool_still_starts(
    moto_server: MotoServer, network: LocalNetwork, faults: FaultInjector, raw_ec2: Any
) -> None:
    """A user's code on their primary, with the primary's credentials, against their own stopped worker
    (the primaries' role may modify it, for the warm pool's user data): turning it into another type
    (past the keeper's offered types and budget, named or in the generic `Attribute=instanceType` form),
    protecting it from the keeper's terminate, turning off its source/destination check, changing its
    shutdown behaviour, retagging its launch token and starting it itself (StartInstances: only the
    keeper starts, within the maximum) are each EC2's `UnauthorizedOperation` (the evaluator's verdict
    at the gate), and moto shows the worker unchanged. The cluster's own warm pool passes the same gate:
    its autoscaler stops the worker, then starts it (ModifyInstanceAttribute of user data and CreateTags
    with its own role, the start through the keeper's start route), and moto holds the rewritten user
    data."""
    keeper_name = f"keeper-retype-{id(faults)}"
    async with keeper_world(moto_server, network, keeper_name) as world:
        alice = await world.hosts.create(ALICE, 1_800_000_000.0)
        await world.keeper.discover()
        alice_arn = world.hosts.primary_arn(alice.cluster_id)
        assert alice_arn
        gate = IamGate(moto_server, policy("primary", KEEPER_NAME=keeper_name), {ALICE_KEY: alice_arn})
        faults.gate(gate)
        try:
            cloud = await world.autoscaler(alice.cluster_id, ALICE_KEY)
            (worker,) = (await cloud.launch("m5.large", 1, {}, pool=True)).instances
            await cloud.stop_instances([worker.id])
            before = await _state(raw_ec2, worker.id)
            assert before[0] == "stopped" and gate.refused == []
            user_data = await raw_ec2.describe_instance_attribute(InstanceId=worker.id, Attribute="userData")

            attacks: list[dict[str, Any]] = [
                {"InstanceType": {"Value": "p5.48xlarge"}},
                {"Attribute": "instanceType", "Value": "p5.48xlarge"},
                {"DisableApiTermination": {"Value": True}},
                {"SourceDestCheck": {"Value": False}},
                {"InstanceInitiatedShutdownBehavior": {"Value": "terminate"}},
            ]
            config = AioConfig(retries={"total_max_attempts": 1, "mode": "standard"})
            async with get_session().create_client(
                "ec2", region_name="us-east-1", endpoint_url=moto_server.endpoint, config=config,
                aws_access_key_id=ALICE_KEY, aws_secret_access_key=SECRET_KEY,
            ) as stolen:  # fmt: skip
                for change in attacks:
                    with pytest.raises(ClientError) as refused:
                        await stolen.modify_instance_attribute(InstanceId=worker.id, **change)
                    assert refused.value.response["Error"]["Code"] == "UnauthorizedOperation", change
                retag = [{"Key": LAUNCH_TOKEN_TAG, "Value": "a-token-of-its-choosing"}]
                with pytest.raises(ClientError) as refused:
                    await stolen.create_tags(Resources=[worker.id], Tags=retag)
                assert refused.value.response["Error"]["Code"] == "UnauthorizedOperation"
                # starting it itself (past the maximum, the keeper would not know): only the keeper starts
                with pytest.raises(ClientError) as refused:
                    await stolen.start_instances(InstanceIds=[worker.id])
                assert refused.value.response["Error"]["Code"] == "UnauthorizedOperation"
            after = await _state(raw_ec2, worker.id)
            assert after[:2] == before[:2] and after[2]["InstanceType"] == "m5.large"
            assert len(gate.refused) == len(attacks) + 2

            started = await cloud.start_instances([worker.id])  # the start itself through the keeper's route
            assert ([i.id for i in started.instances], started.error) == ([worker.id], None)
            assert len(gate.refused) == len(attacks) + 2  # the warm pool's own requests all passed
            assert (await _state(raw_ec2, worker.id))[0] in ("pending", "running")
            rewritten = await raw_ec2.describe_instance_attribute(InstanceId=worker.id, Attribute="userData")
            assert rewritten["UserData"] != user_data["UserData"]
            await cloud.terminate([worker.id])
            print(json.dumps({"own_worker_attacks_refused": len(attacks) + 2, "warm_pool_start_allowed": 1}))
        finally:
            faults.gate(None)
