"""EC2's interruption notices read from an SQS queue on the moto server over HTTP: a notice for a machine
of ours becomes its `interrupted-at` tag (read back by every listing), the message is deleted once
handled, another cluster's machine is never tagged, a malformed message is deleted and counted, and a
notice is kept in the queue while EC2 cannot be read. Queue names are unique: moto's state is shared."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiobotocore.session import get_session
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, CloudFactory
from tests.adapters.ec2.test_ec2_primaries import _worker

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.adapters.ec2_interruptions import (
    MALFORMED,
    NOT_OURS,
    REBALANCE,
    SCHEDULED_CHANGE,
    SPOT_INTERRUPTION,
    Malformed,
    SqsInterruptions,
    parse_event,
)
from swarm_autoscaler.adapters.ec2_support import to_instance
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.adapters.tags import worker_tags
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer

queue_ids = itertools.count()


def event(detail_type: str, instance_id: str, at: float | None = None, **detail: Any) -> str:
    stamp = datetime.fromtimestamp(time.time() + 1 if at is None else at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps(
        {
            "version": "0",
            "id": "7e1b8c5e-0000-4000-8000-000000000000",
            "detail-type": detail_type,
            "source": "aws.ec2",
            "account": "123456789012",
            "time": stamp,
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, **detail},
        }
    )


def spot_warning(instance_id: str, at: float | None = None) -> str:
    return event(
        "EC2 Spot Instance Interruption Warning", instance_id, at, **{"instance-action": "terminate"}
    )


@pytest.fixture
async def sqs(moto_server: MotoServer) -> AsyncIterator[Any]:
    async with get_session().create_client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=moto_server.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    ) as client:
        yield client


@pytest.fixture
async def queue_url(sqs: Any) -> str:
    created = await sqs.create_queue(
        QueueName=f"interruptions-{next(queue_ids)}-{time.monotonic_ns()}",
        Attributes={"VisibilityTimeout": "1"},
    )
    return str(created["QueueUrl"])


async def reader(cloud: Ec2Cloud, queue_url: str, kinds: list[str]) -> SqsInterruptions:
    return await SqsInterruptions(
        queue_url=queue_url,
        cloud=cloud,
        region="us-east-1",
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        wait_seconds=0,
        on_message=kinds.append,
        retry_initial=0.01,
        retry_max=0.05,
    ).start()


async def left_in(sqs: Any, queue_url: str) -> int:
    attrs = await sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )
    return sum(int(v) for v in attrs["Attributes"].values())


async def test_a_spot_warning_tags_our_machine_and_is_deleted(
    make_cloud: CloudFactory, sqs: Any, queue_url: str
) -> None:
    cloud = await make_cloud()
    (machine, other) = (await cloud.launch("c5.large", 2, {})).instances
    await sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning(machine.id))
    kinds: list[str] = []
    notices = await reader(cloud, queue_url, kinds)
    await notices.check()
    result = await notices.poll_once()
    await notices.close()

    assert [n.instance_id for n in result.ours] == [machine.id] and kinds == [SPOT_INTERRUPTION]
    listed = {i.id: i for i in await cloud.list_instances()}
    assert listed[machine.id].interrupted_at == pytest.approx(result.ours[0].at)
    assert listed[other.id].interrupted_at is None
    assert await left_in(sqs, queue_url) == 0


async def test_rebalance_and_scheduled_change_count_and_are_kept_apart(
    make_cloud: CloudFactory, sqs: Any, queue_url: str
) -> None:
    cloud = await make_cloud()
    (machine,) = (await cloud.launch("c5.large", 1, {})).instances
    first = time.time() + 1
    await sqs.send_message(
        QueueUrl=queue_url, MessageBody=event("EC2 Instance Rebalance Recommendation", machine.id, first)
    )
    health = {
        "source": "aws.health",
        "detail-type": "AWS Health Event",
        "time": datetime.fromtimestamp(first + 60, UTC).isoformat(),
        "detail": {
            "service": "EC2",
            "eventTypeCategory": "scheduledChange",
            "affectedEntities": [{"entityValue": machine.id}],
        },
    }
    kinds: list[str] = []
    notices = await reader(cloud, queue_url, kinds)
    await notices.poll_once()
    await sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(health))
    await notices.poll_once()
    later = event("EC2 Instance Rebalance Recommendation", machine.id, first + 120)
    await sqs.send_message(QueueUrl=queue_url, MessageBody=later)
    await notices.poll_once()
    await notices.close()

    assert kinds == [REBALANCE, SCHEDULED_CHANGE, REBALANCE]
    (listed,) = await cloud.list_instances()
    # A rebalance recommendation is advice (core/interrupt.py): its own tag, not an interruption's.
    assert listed.rebalance_at == pytest.approx(first, abs=1)  # a second one keeps the first time
    assert listed.interrupted_at == pytest.approx(first + 60, abs=1)


async def test_another_clusters_machine_is_never_tagged(
    make_cloud: CloudFactory, sqs: Any, queue_url: str
) -> None:
    ours, theirs = await make_cloud(), await make_cloud()
    (foreign,) = (await theirs.launch("c5.large", 1, {})).instances
    await sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning(foreign.id))
    await sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning("i-0123456789abcdef0"))  # gone
    kinds: list[str] = []
    notices = await reader(ours, queue_url, kinds)
    result = await notices.poll_once()
    await notices.close()

    assert result.ours == () and kinds == [NOT_OURS, NOT_OURS]
    (listed,) = await theirs.list_instances()
    assert listed.interrupted_at is None
    assert await left_in(sqs, queue_url) == 0


async def test_a_malformed_message_is_deleted_and_counted_and_the_good_one_still_handled(
    make_cloud: CloudFactory, sqs: Any, queue_url: str
) -> None:
    cloud = await make_cloud()
    (machine,) = (await cloud.launch("c5.large", 1, {})).instances
    await sqs.send_message(QueueUrl=queue_url, MessageBody="{not json")
    await sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"detail-type": "x", "detail": {}}))
    await sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning(machine.id))
    kinds: list[str] = []
    notices = await reader(cloud, queue_url, kinds)
    for _ in range(3):  # moto may hand the messages out over several receives
        await notices.poll_once()
    await notices.close()

    assert sorted(kinds) == sorted([MALFORMED, MALFORMED, SPOT_INTERRUPTION])
    (listed,) = await cloud.list_instances()
    assert listed.interrupted_at is not None
    assert await left_in(sqs, queue_url) == 0


async def test_a_notice_stays_in_the_queue_while_ec2_cannot_be_read(
    make_cloud: CloudFactory, sqs: Any, queue_url: str, faults: FaultInjector
) -> None:
    cloud = await make_cloud(retry_attempts=1)
    (machine,) = (await cloud.launch("c5.large", 1, {})).instances
    await sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning(machine.id))
    kinds: list[str] = []
    notices = await reader(cloud, queue_url, kinds)
    faults.fail("DescribeInstances", 1, status=400, code="UnauthorizedOperation", message="no")
    with pytest.raises(EndpointError):
        await notices.poll_once()
    assert kinds == [] and await left_in(sqs, queue_url) == 1

    for _ in range(30):  # visible again after the queue's 1 s visibility timeout
        if (await notices.poll_once(wait_seconds=1)).ours:
            break
    await notices.close()
    assert kinds == [SPOT_INTERRUPTION]
    (listed,) = await cloud.list_instances()
    assert listed.interrupted_at is not None


async def test_a_notice_older_than_the_machine_is_stale_and_not_tagged(
    make_cloud: CloudFactory, sqs: Any, queue_url: str
) -> None:
    cloud = await make_cloud()
    (machine,) = (await cloud.launch("c5.large", 1, {})).instances
    await sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning(machine.id, at=time.time() - 3600))
    notices = await reader(cloud, queue_url, [])
    await notices.poll_once()
    await notices.close()
    (listed,) = await cloud.list_instances()
    assert listed.interrupted_at is None


@pytest.mark.parametrize(
    "body",
    [
        "",
        "[]",
        json.dumps(
            {
                "detail-type": "EC2 Spot Instance Interruption Warning",
                "time": "2026-01-01T00:00:00Z",
                "detail": {},
            }
        ),
        json.dumps(
            {"detail-type": "EC2 Spot Instance Interruption Warning", "detail": {"instance-id": "i-1"}}
        ),
    ],
)
def test_bodies_that_are_not_a_notice_are_malformed(body: str) -> None:
    with pytest.raises(Malformed):
        parse_event(body)


def test_another_event_is_ignored_not_malformed() -> None:
    assert parse_event(event("EC2 Instance State-change Notification", "i-1", state="stopping")) == ()


async def test_an_interruption_notice_for_a_cluster_s_worker_reaches_its_autoscaler_through_the_listing(
    moto_server: MotoServer, raw_ec2: Any, network: LocalNetwork, sqs: Any, queue_url: str
) -> None:
    """A keeper cluster's autoscaler has no queue of its own: the keeper reads the account's queue
    (moto's SQS, the events as EventBridge sends them) with the daemon's reader, tags the worker it
    names, and the worker's entry in the keeper's listing carries the notice, which the autoscaler's
    adapter reads as `Instance.interrupted_at` (a rebalance recommendation as `rebalance_at`). Another
    keeper's worker is not tagged."""
    hosts = Ec2Primaries(
        keeper_name="keeper-notices",
        region=network.region,
        endpoint=moto_server.endpoint,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        primary_type="m5.large",
        ami_id=network.ami_id,
        user_data=lambda key, cid, profile: "#!/bin/bash\n",
        subnet_ids=network.subnet_ids,
        security_group_ids=[network.security_group_id],
    )
    await hosts.start()
    cluster = await hosts.create(ClusterKey("alice", "w1"), 1_800_000_000.0)
    warned = await _worker(
        raw_ec2, network, cluster.cluster_id, worker_tags(hosts._name, ClusterKey("alice", "w1"))
    )
    advised = await _worker(
        raw_ec2, network, cluster.cluster_id, worker_tags(hosts._name, ClusterKey("alice", "w1"))
    )
    foreign = await _worker(
        raw_ec2, network, "kc-someone-else", worker_tags("another-keeper", ClusterKey("bob", "none"))
    )
    for body in (
        spot_warning(warned),
        event("EC2 Instance Rebalance Recommendation", advised),
        spot_warning(foreign),
    ):
        await sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    kinds: list[str] = []
    notices = await reader(hosts, queue_url, kinds)  # type: ignore[arg-type]
    await notices.poll_once()
    await notices.close()
    assert sorted(kinds) == ["not-ours", "rebalance", "spot-interruption"]

    await hosts.list_clusters()
    listed = hosts.listing(cluster.cluster_id)
    assert listed is not None
    parsed = [dict(raw, LaunchTime=datetime.fromisoformat(raw["LaunchTime"])) for raw in listed[1]]
    by_id = {i.id: i for i in map(to_instance, parsed) if i is not None}
    assert by_id[warned].interrupted_at is not None and by_id[warned].rebalance_at is None
    assert by_id[advised].rebalance_at is not None and by_id[advised].interrupted_at is None
    described = await raw_ec2.describe_instances(InstanceIds=[foreign])
    assert "swarm-autoscaler/interrupted-at" not in str(described)
    await hosts.close()
