"""The machine emulator boots machines concurrently, as EC2 does: each worker is up at its boot time
(`boot_delay` plus a jitter draw), not after the machines seen before it have joined one by one."""

from __future__ import annotations

import asyncio
from typing import Any

from distributed import Scheduler

from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import InstanceType
from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer
from swarm_autoscaler_lab.localcloud.machines import MachineEmulator, MemoryJoiner
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

JOIN_S = 1.5  # each join takes this long, as a real `docker swarm join` takes its time (long enough that
# the bound below leaves 3 s for a worker to start on a loaded machine: 0.4 s left 0.8 s, and failed at load 10)


class SlowJoiner(MemoryJoiner):
    """A memory joiner whose joins take `JOIN_S`; counts how many were under way at once."""

    def __init__(self, swarm: MemorySwarm) -> None:
        super().__init__(swarm)
        self.in_flight = 0
        self.most_in_flight = 0

    async def join(self, hostname: str, token: str, manager_address: str) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(JOIN_S)
            await super().join(hostname, token, manager_address)
        finally:
            self.in_flight -= 1


async def all_workers_up(s: Scheduler, n: int) -> None:
    for _ in range(1200):  # polled: the scheduler offers no event for this
        if len(s.workers) >= n:
            return
        await asyncio.sleep(0.05)


def one_cpu(itype: InstanceType) -> dict[str, float]:
    return {"CPU": 1.0}


async def test_machines_launched_together_boot_together(
    raw_ec2: Any, network: LocalNetwork, moto_server: MotoServer
) -> None:
    swarm = MemorySwarm()
    joiner = SlowJoiner(swarm)
    tags = {"test-emulator": "concurrent"}
    user_data = f"#!/bin/sh\ndocker swarm join --token {swarm.join_token} {swarm.manager_address}\n"
    await raw_ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType="t3.small",
        MinCount=4,
        MaxCount=4,
        SubnetId=network.subnet_ids[0],
        UserData=user_data,  # the client base64-encodes it
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as s:
        emulator = MachineEmulator(
            ec2_endpoint=moto_server.endpoint,
            region=network.region,
            tag_filters=tags,
            orchestrator=swarm,
            joiner=joiner,
            scheduler_address=str(s.address),
            catalogue=CATALOGUE,
            boot_delay=1.0,
            boot_jitter=0.5,
            worker_resources=one_cpu,
            seed=3,
        )
        runner = asyncio.create_task(emulator.run(0.1))
        try:
            await asyncio.wait_for(all_workers_up(s, 4), 30)
        finally:
            emulator.stopping = True
            await runner
            booted = list(emulator.machines.values())
            await emulator.close()
    assert joiner.most_in_flight >= 2  # the joins overlapped: one at a time would never exceed 1
    delays = [m.boot_at - m.seen_at for m in booted]
    assert len(booted) == 4 and all(1.0 <= d < 1.5 for d in delays) and len(set(delays)) == 4, delays
    late = [m.worker_up_at - m.boot_at for m in booted if m.worker_up_at is not None]
    # One join after another would put the last worker at least 3 joins (4.5 s) behind its boot time.
    assert len(late) == 4 and max(late) < 3 * JOIN_S, late
