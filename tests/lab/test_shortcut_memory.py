"""The machine emulator's shortcut boot (the in-memory swarm's machines: they join and run an in-process
dask worker instead of running their user data) publishes the memory a real machine's worker publishes:
the type's RAM minus `AUTOSCALER_EC2_MEMORY_OVERHEAD_PERCENT`, read from the worker env file the daemon's
user data writes (`config.worker.worker_env`), not the type's full RAM.

The first test runs the real daemon (built from settings by `open_daemon`) on the local cloud: moto over
HTTP for EC2, a real dask scheduler, the in-memory swarm standing in for dockerd. What a real worker would
publish is what `docker/worker-entrypoint.sh` passes to `dask worker` from that env file
(tests/lab/test_worker_entrypoint.py runs it)."""

from __future__ import annotations

import asyncio

import pytest
from tests.e2e.helpers import ec2_client, instance_state, wait_for

from swarm_autoscaler.adapters.ec2_support import POOL_STOP_LINE
from swarm_autoscaler.config.types import MEMORY_OVERHEAD_PERCENT, AllowedType
from swarm_autoscaler.config.worker import (
    with_worker_env,
    worker_env,
    worker_env_script,
    worker_resources,
)
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions
from swarm_autoscaler_lab.localcloud.machines import (
    Machine,
    MachineEmulator,
    MemoryJoiner,
    published,
    worker_env_in,
)
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

pytestmark = [pytest.mark.timeout(120)]

AMI = "ami-12345678"
M5_LARGE = CATALOGUE["m5.large"]  # 8 GiB


async def test_a_shortcut_worker_publishes_the_ram_the_daemon_counts() -> None:
    """The daemon keeps one m5.large as its reserve; that machine's in-process worker publishes 8 GiB
    less the daemon's overhead setting (10 %, not the default, so the figure is the setting's)."""
    options = LocalCloudOptions(
        fast=True, cluster_name="shortcut-ram", allowed_types={"m5.large": {"reserve": 1}}
    )
    async with (
        LocalCloud(options) as lc,
        lc.daemon({"AUTOSCALER_EC2_MEMORY_OVERHEAD_PERCENT": "10"}) as daemon,
    ):
        stop = asyncio.Event()
        run = asyncio.create_task(daemon.run(stop))
        try:
            assert lc.scheduler is not None
            scheduler = lc.scheduler
            await wait_for(lambda: bool(scheduler.workers), 60, "the reserve machine's worker")
            workers = list(lc.scheduler.workers.values())
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
    assert len(workers) == 1, "the reserve machine's worker never registered"
    expected = worker_resources(M5_LARGE, AllowedType(ami_id=AMI), 10.0)
    assert workers[0].resources["RAM"] == expected["RAM"] == 8 * 2**30 - round(8 * 2**30 * 0.10)
    assert workers[0].resources["CPU"] == 2 and workers[0].nthreads == 2


def test_the_shortcut_reads_the_worker_env_the_daemon_writes_into_the_user_data() -> None:
    """A type's boot script as the daemon renders it (worker env first, then the operator's script): the
    shortcut finds the variables the machine's env file would hold, and publishes them; user data without
    them (a test's own launch) has none."""
    allowed = {"m5.large": AllowedType(ami_id=AMI, boot_script="#!/bin/bash\necho operator step\n")}
    script = with_worker_env(allowed, CATALOGUE, MEMORY_OVERHEAD_PERCENT)["m5.large"]
    env = worker_env(M5_LARGE, allowed["m5.large"], MEMORY_OVERHEAD_PERCENT)
    assert worker_env_in(script + "docker swarm join --token T 10.0.0.1:2377\n") == env
    resources, nthreads = published(env)
    assert resources["RAM"] == 8 * 2**30 - round(8 * 2**30 * 0.075) and nthreads == 2
    assert worker_env_in("#!/bin/sh\ndocker swarm join --token T 10.0.0.1:2377\n") is None


def test_a_machine_launched_without_a_worker_env_gets_the_default_overhead() -> None:
    """A test's own launch (no worker env in its user data): the emulator publishes the same function's
    figures for the type with the daemon's default memory overhead (7.5 %), never the type's full RAM."""
    emulator = MachineEmulator(
        ec2_endpoint="http://127.0.0.1:9",  # never called: only the emulator's reading of a machine
        region="us-east-1",
        tag_filters={},
        orchestrator=MemorySwarm(),
        joiner=MemoryJoiner(MemorySwarm()),
        scheduler_address="",
        catalogue=CATALOGUE,
    )
    machine = Machine("i-0123456789abcdef0", "ip-10-0-1-23", "m5.large", seen_at=0.0)
    resources, nthreads = emulator.worker_publishes(machine)
    assert resources["RAM"] == 8 * 2**30 - round(8 * 2**30 * 0.075) < M5_LARGE.resources.ram
    assert resources["instance-type:m5.large"] == 1e9 and nthreads == 2


async def test_a_pool_machine_started_again_publishes_what_its_first_boot_wrote() -> None:
    """A warm-pool machine's first boot writes the worker env file and stops; the user data of its start
    only joins (the pool's rewrite), and its volume still holds the file. Its worker publishes that file's
    RAM (10 % kept back here), not the default overhead nor the type's full RAM. The user data is written
    as the EC2 adapter writes it: the worker env lines, then the pool's stop line; then a join line."""
    options = LocalCloudOptions(fast=True, cluster_name="shortcut-pool", allowed_types={"m5.large": {}})
    async with LocalCloud(options) as lc:
        assert lc.network is not None and lc.scheduler is not None and lc.emulator is not None
        swarm, emulator, scheduler = lc.orchestrator, lc.emulator, lc.scheduler
        assert isinstance(swarm, MemorySwarm)
        first = worker_env_script(M5_LARGE, AllowedType(ami_id=AMI), 10.0) + f"{POOL_STOP_LINE}\n"
        ec2 = ec2_client(lc)
        reply = ec2.run_instances(
            ImageId=lc.network.ami_id,
            InstanceType="m5.large",
            MinCount=1,
            MaxCount=1,
            SubnetId=lc.network.subnet_ids[0],
            UserData=f"#!/bin/bash\n{first}",
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in lc.owner_tags().items()],
                }
            ],
        )
        iid = reply["Instances"][0]["InstanceId"]
        await wait_for(lambda: instance_state(lc, iid) == "stopped", 30, "the pool machine to stop itself")
        join = f"#!/bin/bash\ndocker swarm join --token {swarm.join_token} {swarm.manager_address}\n"
        ec2.modify_instance_attribute(InstanceId=iid, UserData={"Value": join.encode()})
        ec2.start_instances(InstanceIds=[iid])
        await wait_for(lambda: bool(scheduler.workers), 30, "the started machine's worker")
        [worker] = scheduler.workers.values()
        assert emulator.prepared_total == 1 and emulator.joined_total == 1
    assert worker.resources["RAM"] == 8 * 2**30 - round(8 * 2**30 * 0.10)
