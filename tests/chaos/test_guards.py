"""The chaos world's guards catch what they must, driven by hand (no daemon): a termination of a machine
whose worker runs a task, and a drain of a node whose worker the scheduler kept with a unique result;
nothing is recorded for a machine whose worker is gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import boto3

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.adapters.ec2 import owner_tags
from swarm_autoscaler.adapters.swarm import SwarmOrchestrator
from swarm_autoscaler.core.model import Availability
from swarm_autoscaler_lab.localcloud.cloudhost import CloudHost, WorldOptions, _work

QUIET = WorldOptions(
    seed=5,
    boot_delay=0.5,
    boot_jitter=0.0,
    keep_rate=1.0,  # the scheduler keeps every worker it is asked to retire
    docker_latency=(0.0, 0.0),
    conflict_rate=0.0,
    slow_ec2_rate=0.0,
    emulator_interval=0.3,
)


async def _until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _ec2(world: CloudHost) -> Any:
    return boto3.client(
        "ec2",
        endpoint_url=world.ec2_endpoint,
        region_name=world.network.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _launch(world: CloudHost, count: int) -> list[str]:
    reply = _ec2(world).run_instances(
        ImageId=world.network.ami_id,
        InstanceType="m5.large",
        MinCount=count,
        MaxCount=count,
        SubnetId=world.network.subnet_ids[0],
        UserData=f"#!/bin/sh\ndocker swarm join --token {world.swarm.join_token} 127.0.0.1:2377\n",
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": k, "Value": v} for k, v in owner_tags(world.options.cluster_name).items()],
            }
        ],
    )
    return [i["InstanceId"] for i in reply["Instances"]]


async def test_guards_record_busy_terminations_and_drains_of_kept_workers() -> None:
    async with CloudHost(QUIET) as world:
        busy_id, kept_id = await asyncio.to_thread(_launch, world, 2)
        assert world.emulator is not None
        machines = world.emulator.machines
        await _until(lambda: busy_id in machines and kept_id in machines, "the machines to boot")
        busy, kept = machines[busy_id].hostname, machines[kept_id].hostname
        await _until(lambda: world.worker_load(busy) and world.worker_load(kept), "both workers")
        address = {str(ws.name): ws.address for ws in world.scheduler.workers.values()}

        task = world.client.submit(_work, 3.0, workers=[address[busy]], pure=False)
        await _until(lambda: (world.worker_load(busy) or (0, 0))[0] == 1, "the task to run")
        await asyncio.to_thread(_ec2(world).terminate_instances, InstanceIds=[busy_id])

        async with DaskWorkload(str(world.scheduler.address)) as workload:
            assert await workload.retire([address[kept]]) == ()  # kept: a late result only it holds
        node = world.swarm.by_hostname(kept)
        assert node is not None
        async with SwarmOrchestrator(world.docker_url) as swarm:
            await swarm.set_availability(node.id, Availability.DRAIN)
            await _until(lambda: world.worker_load(kept) is None, "the drained node's worker to stop")
            await asyncio.to_thread(_ec2(world).terminate_instances, InstanceIds=[kept_id])
            await swarm.remove(node.id)
        await world.client.cancel([task])

        seen = [(h.kind, h.hostname, h.processing, h.unique_results) for h in world.hits]
        assert seen == [("terminate", busy, 1, 0), ("drain", kept, 0, 1)]
        assert world.disruptions == {"terminate": 2, "drain": 1, "remove": 1}
        assert world.report()["faults"]["retire_kept"] == 1
