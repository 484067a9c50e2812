"""The daemon built from settings (`open_daemon`, as `swarm-autoscaler run` does) on the local cloud with
`AUTOSCALER_EC2_INTERRUPTION_QUEUE_URL` set: it reads a spot warning for its machine from the SQS queue
in the background, and its next tick finds the machine interrupted, terminates it and launches its
replacement. A queue it cannot read stops the start with one error naming the variable."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiobotocore.session import get_session

from swarm_autoscaler.core.actions import Launch, Terminate
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
async def lc() -> AsyncIterator[LocalCloud]:
    async with LocalCloud(LocalCloudOptions(fast=True, cluster_name="notices", min_instances=1)) as cloud:
        yield cloud


@pytest.fixture
async def sqs(lc: LocalCloud) -> AsyncIterator[Any]:
    async with get_session().create_client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=lc.moto.endpoint,
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
    ) as client:
        yield client


def spot_warning(instance_id: str) -> str:
    return json.dumps(
        {
            "version": "0",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "time": datetime.fromtimestamp(time.time() + 1, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
    )


async def test_a_notice_in_the_queue_gets_the_machine_replaced_and_terminated(
    lc: LocalCloud, sqs: Any
) -> None:
    queue = await sqs.create_queue(QueueName=f"notices-{time.monotonic_ns()}")
    url = queue["QueueUrl"]
    async with lc.daemon({"AUTOSCALER_EC2_INTERRUPTION_QUEUE_URL": url}) as daemon:
        first = await daemon.tick_once()
        assert first is not None and first.plan.of_kind(Launch)  # the minimum of one
        (machine,) = [i for i in await daemon.ports.cloud.list_instances() if i.alive]
        await sqs.send_message(QueueUrl=url, MessageBody=spot_warning(machine.id))
        for _ in range(100):  # the background reader tags it
            if any(i.interrupted_at for i in await daemon.ports.cloud.list_instances()):
                break
            await asyncio.sleep(0.1)
        # The next tick plans the termination and the replacement together. The machine may join the swarm
        # between that plan and its act (the emulator boots it meanwhile): the act path then skips the
        # Terminate on its fresh read, and a later tick terminates it. Tick until one has.
        results = []
        for _ in range(30):
            result = await daemon.tick_once()
            assert result is not None
            results.append(result)
            if any(isinstance(o.action, Terminate) and o.ok for o in result.outcomes):
                break
            await asyncio.sleep(0.2)
    planned = next(r for r in results if r.plan.of_kind(Terminate))
    assert [m.key for m in planned.cluster.interrupted] == [machine.id]
    assert [a.instance_ids for a in planned.plan.of_kind(Terminate)] == [(machine.id,)]  # type: ignore[union-attr]
    assert planned.plan.of_kind(Launch)  # the replacement, in the same plan
    assert any(isinstance(o.action, Launch) and o.ok for o in planned.outcomes), planned.outcomes
    terminated = [o for r in results for o in r.outcomes if isinstance(o.action, Terminate) and o.ok]
    assert [o.action.instance_ids for o in terminated] == [(machine.id,)], [r.outcomes for r in results]  # type: ignore[attr-defined]
    launches = sum(len(r.plan.of_kind(Launch)) for r in results)
    assert launches == 1, "the replacement is launched once, not again when a later tick terminates"


async def test_a_queue_that_cannot_be_read_stops_the_start_naming_the_variable(lc: LocalCloud) -> None:
    missing = f"{lc.moto.endpoint}/123456789012/no-such-queue-{time.monotonic_ns()}"
    with pytest.raises(EndpointError) as caught:
        async with lc.daemon({"AUTOSCALER_EC2_INTERRUPTION_QUEUE_URL": missing}):
            pass
    assert caught.value.setting == "AUTOSCALER_EC2_INTERRUPTION_QUEUE_URL"
    assert "does not exist" in caught.value.detail
