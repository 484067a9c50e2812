"""Least privilege, evaluated: each role's policy (`docker/iam-policy.json` for the daemon,
`docker/iam-keeper-policy.json`, `docker/iam-primary-policy.json` for a keeper cluster's primary) allows
every request the product really sends, and denies the forged ones an attacker holding that role's
credentials would send.

The real requests are what reached a moto server over HTTP (`FaultInjector.record`) while the product's
own adapters launched (on demand, spot and into the warm pool), tagged, stopped, started and terminated
machines. moto evaluates no IAM condition, so each request is translated into the authorizations AWS
makes for it (`iam_requests`, from the EC2 and IAM documentation) and decided by `iam_eval`: a small
evaluator of the condition operators the policies use, itself tested on both sides in
`test_iam_eval.py`. The placeholders (`@CLUSTER_NAME@`, ...) are filled in as the README's quick start
does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, join_command
from tests.audit.iam_eval import ALLOW, Request, decide
from tests.audit.iam_requests import EC2, authorizations, tag_context

from swarm_autoscaler.adapters.ec2 import PRIMARY_TAG, Ec2Cloud
from swarm_autoscaler.adapters.ec2_launch_token import LAUNCH_TOKEN_TAG
from swarm_autoscaler.adapters.ec2_support import to_instance
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.adapters.ec2_workers import Ec2Workers
from swarm_autoscaler.keeper.adapters.tags import instance_arn, worker_tags
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.ports import WorkerLaunch
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer

DOCKER = Path(__file__).resolve().parents[2] / "docker"
ROLES = {
    "daemon": "iam-policy.json",
    "keeper": "iam-keeper-policy.json",
    "primary": "iam-primary-policy.json",
}


def policy(role: str, **names: str) -> dict[str, Any]:
    """The role's policy with its placeholders filled in (`CLUSTER_NAME="x"` fills `@CLUSTER_NAME@`)."""
    text = (DOCKER / ROLES[role]).read_text()
    for name, value in names.items():
        text = text.replace(f"@{name}@", value)
    assert "@" not in text, f"{ROLES[role]}: a placeholder left unfilled"
    loaded: dict[str, Any] = json.loads(text)
    return loaded


async def _tags_by_id(raw_ec2: Any) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    async for page in raw_ec2.get_paginator("describe_instances").paginate():  # every test's, all pages
        for res in page["Reservations"]:
            for raw in res["Instances"]:
                found[raw["InstanceId"]] = {t["Key"]: t["Value"] for t in raw.get("Tags", ())}
    return found


async def _raw(raw_ec2: Any, instance_id: str) -> dict[str, Any]:
    (res,) = (await raw_ec2.describe_instances(InstanceIds=[instance_id]))["Reservations"]
    found: dict[str, Any] = res["Instances"][0]
    return found


async def _denied(
    faults: FaultInjector, raw_ec2: Any, granted: dict[str, Any], source: str = ""
) -> list[tuple[Request, str]]:
    """Every authorization of the recorded requests that `granted` does not allow, with its decision;
    `source`: the instance ARN AWS puts in `ec2:SourceInstanceARN` when the caller signs with that
    instance's profile credentials (none for the daemon's and the keeper's own keys)."""
    tags = await _tags_by_id(raw_ec2)
    calls = faults.recorded()
    assert calls, "nothing was recorded: the test exercised nothing"
    refused = []
    for call in calls:
        for sent in authorizations(call.action, call.params, lambda i: tags.get(i, {})):
            request = (
                Request(sent.action, sent.resource, {**sent.context, SOURCE: [source]}) if source else sent
            )
            verdict = decide(granted, request)
            if verdict != ALLOW:
                refused.append((request, verdict))
    return refused


async def test_every_request_the_daemon_sends_is_allowed_by_its_policy_only_for_its_own_name(
    make_cloud: Any, faults: FaultInjector, raw_ec2: Any, network: LocalNetwork
) -> None:
    cloud: Ec2Cloud = await make_cloud()
    name = cloud._cluster
    faults.record()
    (spot,) = (await cloud.launch("m5.large", 1, {"role": "gpu"})).instances
    (warm,) = (await cloud.launch("m5.large", 1, {}, pool=True)).instances
    await cloud.stop_instances([warm.id])
    await cloud.start_instances([warm.id])
    await cloud.terminate([spot.id, warm.id])
    actions = {c.action for c in faults.recorded()}
    assert {"RunInstances", "CreateTags", "StopInstances", "StartInstances", "TerminateInstances"} <= actions
    role = network.instance_profile or ""
    mine = policy("daemon", CLUSTER_NAME=name, QUEUE_NAME="q", WORKER_ROLE=role)
    assert await _denied(faults, raw_ec2, mine) == []
    # The same requests under another deployment's name: every launch, tag and disruption refused.
    other = policy("daemon", CLUSTER_NAME=name + "-other", QUEUE_NAME="q", WORKER_ROLE=role)
    refused = {r.action for r, _ in await _denied(faults, raw_ec2, other)}
    assert {"ec2:RunInstances", "ec2:CreateTags", "ec2:TerminateInstances", "ec2:StopInstances"} <= refused


async def test_every_request_the_keeper_and_a_primary_send_is_allowed_by_their_policies(
    moto_server: MotoServer, network: LocalNetwork, faults: FaultInjector, raw_ec2: Any
) -> None:
    """The keeper launches, retags and ends a cluster (its primary and its workers) and launches the
    cluster's workers (on demand, spot, into the warm pool: the launch route's `Ec2Workers`); the
    cluster's own autoscaler (on the primary, under the primary's role) tags and ends its worker, and its
    launch of its own (how workers were launched before the route) is refused."""
    access = {"region": network.region, "endpoint": moto_server.endpoint, "access_key_id": ACCESS_KEY,
              "secret_access_key": SECRET_KEY, "retry_initial": 0.01, "retry_max": 0.05}  # fmt: skip
    keeper_name = f"keeper-iam-{id(faults)}"
    hosts = await Ec2Primaries(
        keeper_name=keeper_name, primary_type="m5.large", ami_id=network.ami_id,
        user_data=lambda key, cid, profile: "#!/bin/bash\n", subnet_ids=network.subnet_ids,
        security_group_ids=[network.security_group_id], key_name=network.key_name,
        iam_instance_profile=network.instance_profile, custom_tags={"team": "science"}, **access,
    ).start()  # fmt: skip
    key = ClusterKey("alice", "w1")
    try:
        faults.record()
        cluster = await hosts.create(key, 1_800_000_000.0)
        await hosts.update(cluster.cluster_id, heartbeat=1_800_000_100.0)
        keeper_calls = faults.recorded()
        primary_policy = policy("primary", KEEPER_NAME=keeper_name)
        keeper_policy = policy(
            "keeper", KEEPER_NAME=keeper_name, PRIMARY_ROLE=network.instance_profile or "", QUEUE_NAME="*"
        )
        assert await _denied(faults, raw_ec2, keeper_policy) == []

        # The keeper launches the cluster's workers: they carry its worker tags and the ARN of the
        # cluster's primary, which its listing computed.
        await hosts.list_clusters()
        primary_arn = hosts.primary_arn(cluster.cluster_id)
        assert primary_arn == instance_arn(network.region, "123456789012", cluster.primary_id)
        launcher = Ec2Workers(
            hosts, keeper_name=keeper_name, amis={"m5.large": network.ami_id},
            security_group_ids=[network.security_group_id], key_name=network.key_name,
            custom_tags={"team": "science"},
        )  # fmt: skip
        faults.record()
        made = []
        # (the last with a join ticket's nonce, which the keeper tags at launch: `launches.LaunchBody`)
        runs = (("od", False, False), ("spot", True, False), ("pool", False, True), ("ticket", False, False))
        for token, spot, pool in runs:
            made += await launcher.launch(
                WorkerLaunch(cluster.cluster_id, key, primary_arn, "m5.large", 1, spot, network.subnet_ids[0],
                             "#!/bin/bash\n", token, (("role", "gpu"),), pool, "",
                             join_nonce="ab" * 16 if token == "ticket" else "")
            )  # fmt: skip
        assert {c.action for c in faults.recorded()} == {"RunInstances"}
        assert await _denied(faults, raw_ec2, keeper_policy) == []
        # Under another keeper's name: every worker launch refused.
        other_keeper = policy(
            "keeper", KEEPER_NAME=keeper_name + "-other", PRIMARY_ROLE=network.instance_profile or "", QUEUE_NAME="*"
        )  # fmt: skip
        assert {r.action for r, _ in await _denied(faults, raw_ec2, other_keeper)} >= {"ec2:RunInstances"}

        # The keeper starts the cluster's warm-pool worker (the start route's `Ec2Workers`), once stopped.
        pool_worker = made[2]["InstanceId"]
        await raw_ec2.stop_instances(InstanceIds=[pool_worker])  # stands for its autoscaler's own stop
        faults.record()
        assert await launcher.stopped_workers(
            cluster.cluster_id, primary_arn, [pool_worker], {"m5.large"}
        ) == {pool_worker}
        await launcher.start(cluster.cluster_id, [pool_worker])
        assert {c.action for c in faults.recorded()} == {"DescribeInstances", "StartInstances"}
        assert await _denied(faults, raw_ec2, keeper_policy) == []
        assert {r.action for r, _ in await _denied(faults, raw_ec2, other_keeper)} == {"ec2:StartInstances"}

        # The cluster's own autoscaler on the primary, with the primary's role.
        autoscaler = await Ec2Cloud(
            cluster_name=cluster.cluster_id, allowed_types={"m5.large": (network.ami_id, "#!/bin/bash\n")},
            subnet_ids=network.subnet_ids, security_group_ids=[network.security_group_id],
            custom_tags=worker_tags(keeper_name, key), join_command=join_command, **access,
        ).start()  # fmt: skip
        try:
            autoscaler.primary_arn = primary_arn
            worker = made[0]["InstanceId"]
            faults.record()
            await autoscaler._tag_hostname(to_instance(await _raw(raw_ec2, worker)))  # type: ignore[arg-type]
            # its join desk's fresh read of a booting worker by address (`daemon.join`): a describe only
            (raw_worker,) = [raw for raw in made if raw["InstanceId"] == worker]
            joining = await autoscaler.machines_at(raw_worker["PrivateIpAddress"])
            assert [m.instance.id for m in joining] == [worker]
            await autoscaler.terminate([worker])
            assert {c.action for c in faults.recorded()} == {
                "DescribeInstances",
                "CreateTags",
                "TerminateInstances",
            }
            assert await _denied(faults, raw_ec2, primary_policy, primary_arn) == []
            # The same requests signed on another cluster's primary: every tag and end refused.
            other = primary_arn.rsplit("/", 1)[0] + "/i-0another"
            refused = {r.action for r, _ in await _denied(faults, raw_ec2, primary_policy, other)}
            assert refused == {"ec2:CreateTags", "ec2:TerminateInstances"}
            # Its own launch, tagged as launches were before the route, is refused by the primaries'
            # policy: `test_primary_attacks.py` sends it through the IAM gate, which refuses it before
            # moto. Not sent here: moto evaluates no IAM, so it would be recorded as a request of the
            # product's, and the audit of every recorded request (`test_iam_policy.py`) would fail on it.
        finally:
            await autoscaler.close()

        faults.record()
        assert await hosts.terminate(cluster.cluster_id) == 1
        assert {c.action for c in faults.recorded()} >= {"TerminateInstances"}
        assert await _denied(faults, raw_ec2, keeper_policy) == []
        assert {c.action for c in keeper_calls} >= {"RunInstances", "CreateTags"}
    finally:
        await hosts.close()


SOURCE = "ec2:SourceInstanceARN"  # set by AWS on requests signed with an instance profile's credentials
A_ARN = f"{EC2}instance/i-0primary1"  # cluster kc-1's primary: the attacker's, in the primary's table
B_ARN = f"{EC2}instance/i-0primary2"  # cluster kc-2's primary: a neighbour of the same keeper
OURS = {"managed-by": "swarm-autoscaler", "swarm-autoscaler/cluster": "prod"}
FOREIGN: dict[str, str] = {"Name": "the billing database"}
NEIGHBOUR = {"managed-by": "swarm-autoscaler", "swarm-autoscaler/cluster": "staging"}  # same name scheme
PRIMARY = {
    "managed-by": "swarm-autoscaler",
    "swarm-autoscaler/keeper": "k1",
    "swarm-autoscaler/keeper/cluster-id": "kc-1",
}
WORKER_1 = {
    "managed-by": "swarm-autoscaler",
    "swarm-autoscaler/cluster": "kc-1",
    "swarm-autoscaler-keeper": "k1",
    PRIMARY_TAG: A_ARN,
}
WORKER_2 = {
    "managed-by": "swarm-autoscaler",
    "swarm-autoscaler/cluster": "kc-2",
    "swarm-autoscaler-keeper": "k1",
    PRIMARY_TAG: B_ARN,
}


def on(action: str, tags: dict[str, str], requested: dict[str, str] | None = None) -> Request:
    context = tag_context("aws:ResourceTag", tags)
    if requested is not None:
        context |= tag_context("aws:RequestTag", requested)
    return Request(f"ec2:{action}", f"{EC2}instance/i-0123", context)


def launch(tags: dict[str, str]) -> Request:
    return Request("ec2:RunInstances", f"{EC2}instance/*", tag_context("aws:RequestTag", tags))


def modify(tags: dict[str, str], **wire: str) -> Request:
    """A ModifyInstanceAttribute of instance i-0123 (holding `tags`), its form parameters as botocore
    sends them (`InstanceType.Value=...`), translated by `iam_requests` as for the recorded requests."""
    params = {"InstanceId": "i-0123", **{k.replace("__", "."): v for k, v in wire.items()}}
    (request,) = authorizations("ModifyInstanceAttribute", params, lambda _: tags)
    return request


# A worker's attributes a user's code on its primary must not change: its type (past the keeper's
# offered types and budget), its protection from the keeper's terminate or stop, its shutdown behaviour,
# its source/destination check, whether its volumes outlive it, ... The warm pool changes only user data.
RETYPES_AND_REWIRES = [
    {"InstanceType__Value": "p5.48xlarge"},
    {"Attribute": "instanceType", "Value": "p5.48xlarge"},  # the generic form of the same request
    {"DisableApiTermination__Value": "true"},
    {"DisableApiStop__Value": "true"},
    {"InstanceInitiatedShutdownBehavior__Value": "stop"},
    {"SourceDestCheck__Value": "false"},
    {
        "BlockDeviceMapping__1__DeviceName": "/dev/xvda",
        "BlockDeviceMapping__1__Ebs__DeleteOnTermination": "false",
    },
    {"EbsOptimized__Value": "true"},
    {"EnaSupport__Value": "false"},
    {"SriovNetSupport__Value": "simple"},
    {"Kernel__Value": "aki-1"},
    {"Ramdisk__Value": "ari-1"},
]


def signed_on(source: str, requests: list[Request]) -> list[Request]:
    """`requests` as AWS sees them when signed with the credentials of instance `source`'s profile."""
    return [Request(r.action, r.resource, {**r.context, SOURCE: [source]}) for r in requests]


def as_role(role: str, requests: list[Request]) -> list[Request]:
    """A primary's requests come from its instance (A_ARN); the daemon's and the keeper's carry no
    instance ARN (their keys are theirs, or their instance runs no user code)."""
    return signed_on(A_ARN, requests) if role == "primary" else requests


def forged() -> dict[str, list[Request]]:
    """Per role, requests an attacker with that role's credentials would send; every one must fail."""
    anything = ["TerminateInstances", "StopInstances", "StartInstances", "ModifyInstanceAttribute"]
    return {
        "daemon": [
            on("CreateTags", FOREIGN, {"managed-by": "swarm-autoscaler", "swarm-autoscaler/cluster": "prod"}),
            on("CreateTags", NEIGHBOUR, {"swarm-autoscaler/cluster": "prod"}),  # adopt a neighbour's
            on("CreateTags", OURS, {"swarm-autoscaler/cluster": "staging"}),  # hand ours away
            on("CreateTags", OURS, {"managed-by": "someone-else"}),
            on("CreateTags", OURS, {"Name": "renamed"}),
            Request(
                "ec2:CreateTags",
                f"{EC2}instance/*",
                {"ec2:CreateAction": ["RunInstances"], **tag_context("aws:RequestTag", {"x": "y"})},
            ),
            Request("ec2:DeleteTags", f"{EC2}instance/i-0123", tag_context("aws:ResourceTag", OURS)),
            on("CreateTags", OURS, {LAUNCH_TOKEN_TAG: "a-token-of-its-choosing"}),  # set only at launch
            launch({}),
            launch({"managed-by": "swarm-autoscaler"}),
            launch({"managed-by": "swarm-autoscaler", "swarm-autoscaler/cluster": "staging"}),
            *[on(a, FOREIGN) for a in anything],
            *[on(a, NEIGHBOUR) for a in anything],
            Request(
                "iam:PassRole",
                "arn:aws:iam::123456789012:role/admin",
                {"iam:PassedToService": ["ec2.amazonaws.com"]},
            ),
            Request(
                "iam:PassRole",
                "arn:aws:iam::123456789012:role/workers",
                {"iam:PassedToService": ["lambda.amazonaws.com"]},
            ),
            Request("sqs:ReceiveMessage", "arn:aws:sqs:us-east-1:123456789012:payroll-events"),
            Request("ec2:RunInstances", f"{EC2}dedicated-host/h-1"),
        ],
        "keeper": [
            on("TerminateInstances", OURS),  # the daemon's worker
            on("TerminateInstances", {**PRIMARY, "swarm-autoscaler/keeper": "k2"}),  # another keeper's
            on("TerminateInstances", FOREIGN),
            on("StopInstances", PRIMARY),
            on("CreateTags", PRIMARY, {"swarm-autoscaler/keeper/user": "mallory"}),  # move it to a user
            on("CreateTags", PRIMARY, {"swarm-autoscaler/keeper/profile": "gpu"}),  # fixed at launch
            on("CreateTags", PRIMARY, {"swarm-autoscaler/keeper": "k2"}),
            on("CreateTags", FOREIGN, {"swarm-autoscaler/keeper/state": "running"}),
            on("CreateTags", PRIMARY, {LAUNCH_TOKEN_TAG: "kc-1-0"}),  # the launch token: at launch only
            on("CreateTags", WORKER_1, {LAUNCH_TOKEN_TAG: "kc-1-t1"}),
            launch({"managed-by": "swarm-autoscaler"}),
            launch({"managed-by": "swarm-autoscaler", "swarm-autoscaler/keeper": "k2"}),
            launch({**WORKER_1, "swarm-autoscaler-keeper": "k2"}),  # another keeper's worker
            launch({k: v for k, v in WORKER_1.items() if k != PRIMARY_TAG}),  # a worker naming no primary
            launch({**WORKER_1, "swarm-autoscaler/cluster": "prod"}),  # the daemon's cluster name
            Request(
                "iam:PassRole",
                "arn:aws:iam::123456789012:role/admin",
                {"iam:PassedToService": ["ec2.amazonaws.com"]},
            ),
        ],
        "primary": [  # a user's code on their primary, through the metadata service
            *[on(a, PRIMARY) for a in anything],  # their own or another user's primary
            on("CreateTags", PRIMARY, {"swarm-autoscaler/keeper/state": "running"}),
            *[on(a, OURS) for a in anything],  # the daemon's workers
            *[on(a, FOREIGN) for a in anything],
            on("CreateTags", WORKER_2, {"swarm-autoscaler/cluster": "kc-1"}),  # take a neighbour's worker
            on("CreateTags", WORKER_1, {LAUNCH_TOKEN_TAG: "kc-1-t1"}),  # its own worker's launch token
            *[modify(WORKER_1, **change) for change in RETYPES_AND_REWIRES],  # its own worker, retyped
            on("StartInstances", WORKER_1),  # its own worker, past the maximum: only the keeper starts
            launch({"managed-by": "swarm-autoscaler", "swarm-autoscaler/cluster": "kc-1"}),  # off the keeper
            launch(
                {
                    "managed-by": "swarm-autoscaler",
                    "swarm-autoscaler/cluster": "prod",
                    "swarm-autoscaler-keeper": "k1",
                }
            ),
            launch(WORKER_1),  # its own worker, as it launched them before the keeper's launch route
            Request("ec2:RunInstances", f"{EC2}subnet/subnet-1"),
            Request(
                "ec2:CreateTags",
                f"{EC2}instance/*",
                {"ec2:CreateAction": ["RunInstances"], **tag_context("aws:RequestTag", WORKER_1)},
            ),
            Request(
                "iam:PassRole",
                "arn:aws:iam::123456789012:role/primaries",
                {"iam:PassedToService": ["ec2.amazonaws.com"]},
            ),
        ],
    }


def granted(role: str) -> dict[str, Any]:
    names = {"daemon": {"CLUSTER_NAME": "prod", "QUEUE_NAME": "prod-interruptions", "WORKER_ROLE": "workers"},
             "keeper": {"KEEPER_NAME": "k1", "PRIMARY_ROLE": "primaries", "QUEUE_NAME": "k1-interruptions"}, "primary": {"KEEPER_NAME": "k1"}}  # fmt: skip
    return policy(role, **names[role])


def test_every_forged_request_is_refused_by_the_role_s_policy() -> None:
    for role, requests in forged().items():
        allowed = [r for r in as_role(role, requests) if decide(granted(role), r) == ALLOW]
        assert allowed == [], f"{role} allows forged requests: {allowed}"


def test_the_legitimate_twins_of_the_forged_requests_are_allowed() -> None:
    """The other side of the forged table: the same shapes, as the product sends them, pass (so the
    refusals above come from the conditions, not from a policy that allows nothing)."""
    allowed = {
        "daemon": [
            on("CreateTags", OURS, {"swarm-autoscaler/hostname": "ip-10-0-0-1"}),
            launch(OURS), *[on(a, OURS) for a in ("TerminateInstances", "StopInstances", "StartInstances")],
            launch({**OURS, LAUNCH_TOKEN_TAG: "0123abcd"}),
            Request("ec2:CreateTags", f"{EC2}instance/*", {"ec2:CreateAction": ["RunInstances"],
                    **tag_context("aws:RequestTag", {**OURS, LAUNCH_TOKEN_TAG: "0123abcd"})}),
            Request("iam:PassRole", "arn:aws:iam::123456789012:role/workers", {"iam:PassedToService": ["ec2.amazonaws.com"]}),
            Request("sqs:ReceiveMessage", "arn:aws:sqs:us-east-1:123456789012:prod-interruptions"),
        ],
        "keeper": [on("TerminateInstances", PRIMARY), on("TerminateInstances", WORKER_1),
                   on("CreateTags", PRIMARY, {"swarm-autoscaler/keeper/state": "ending"}),
                   launch({"managed-by": "swarm-autoscaler", "swarm-autoscaler/keeper": "k1"}), launch(WORKER_1),
                   launch({**WORKER_1, LAUNCH_TOKEN_TAG: "kc-1-t1"}), on("StartInstances", WORKER_1)],
        "primary": [on(a, WORKER_1) for a in ("TerminateInstances", "StopInstances", "ModifyInstanceAttribute")]
                   + [on("CreateTags", WORKER_1, {"swarm-autoscaler/hostname": "ip-10-0-0-1"}),
                      modify(WORKER_1, UserData__Value="IyEvYmluL2Jhc2gK"),  # the warm pool's rewrite
                      modify(WORKER_1, Attribute="userData", Value="IyEvYmluL2Jhc2gK")],
    }  # fmt: skip
    for role, requests in allowed.items():
        refused = [r for r in as_role(role, requests) if decide(granted(role), r) != ALLOW]
        assert refused == [], f"{role} refuses what the product sends: {refused}"


def _neighbour_attacks() -> list[Request]:
    """What a user's code on cluster kc-1's primary sends, with that primary's role, against kc-2's
    worker (same keeper, same role): each disruptive action, a retag (plain, taking the worker over, and
    rewriting its primary tag to kc-1's so the next request passes), a launch without the primary tag,
    with kc-2's ARN, and tagged as a primary of the keeper."""
    disrupt = ["TerminateInstances", "StopInstances", "StartInstances", "ModifyInstanceAttribute"]
    worker_1_launch = {k: v for k, v in WORKER_1.items() if k != PRIMARY_TAG}
    return [
        *[on(a, WORKER_2) for a in disrupt],
        on("CreateTags", WORKER_2, {"swarm-autoscaler/hostname": "ip-10-0-0-9"}),
        on("CreateTags", WORKER_2, {PRIMARY_TAG: A_ARN}),
        on("CreateTags", WORKER_1, {PRIMARY_TAG: B_ARN}),  # hand its own worker to the neighbour's ARN
        launch(worker_1_launch),
        launch({**WORKER_1, PRIMARY_TAG: B_ARN}),
        launch({**WORKER_2}),
        launch({**WORKER_1, "swarm-autoscaler/keeper": "k1", "swarm-autoscaler/keeper/cluster-id": "kc-9"}),
        Request("ec2:CreateTags", f"{EC2}instance/*", {"ec2:CreateAction": ["RunInstances"],
                **tag_context("aws:RequestTag", {**WORKER_1, PRIMARY_TAG: B_ARN})}),
    ]  # fmt: skip


def test_a_primary_s_role_no_longer_reaches_another_cluster_s_workers_of_the_same_keeper() -> None:
    """The gap this test used to state (IAM could not tell one cluster's primary from another's under
    one role) is closed by the primary tag: every worker names the primary that launched it, and the
    primaries' policy compares it with `${ec2:SourceInstanceARN}`, which AWS sets from the instance
    whose profile signed the request (a user cannot choose it). Evaluated by `iam_eval` (moto evaluates
    no condition): each attack is refused, and its legitimate twin (kc-2's primary on kc-2's worker) is
    allowed, so the refusals come from the primary condition."""
    attacks = _neighbour_attacks()
    allowed = [r for r in signed_on(A_ARN, attacks) if decide(granted("primary"), r) == ALLOW]
    assert allowed == [], f"a primary reaches its neighbour's workers: {allowed}"
    # its own (StartInstances aside: only the keeper starts a worker, within the maximum)
    disrupt = [r for r in attacks[:5] if r.action != "ec2:StartInstances"]
    assert len(disrupt) == 4
    assert all(decide(granted("primary"), r) == ALLOW for r in signed_on(B_ARN, disrupt))
    # Credentials that are not an instance's (a primary's keys copied elsewhere are still its instance's
    # to AWS; keys of no instance carry no ARN): nothing on any worker.
    assert all(decide(granted("primary"), r) != ALLOW for r in [*disrupt, on("TerminateInstances", WORKER_1)])
