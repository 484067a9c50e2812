"""The real boot path on real dockerd nodes: the daemon's machines run their own user data and their dask
workers are the tasks of the worker global service (`docker/worker-stack.yml`), not workers the emulator
starts.

Phases (each one's duration is printed): the image in the manager's engine (built once and cached under
build/image), the worker service deployed, a burst of queued tasks scaled up for (each new instance boots
from its user data: it writes its worker env file and runs the `docker swarm join` the daemon rendered, on
its own dockerd node), the tasks run on the swarm-started workers of the new nodes, then the fleet drains
and terminates back to its minimum (zero).

What stands in for AWS: moto for EC2, a dockerd per machine (`localcloud.userdata`: user data decoded as
cloud-init would and run by bash in the node's UTS namespace with the node's `/etc/swarm-autoscaler`), and
the image loaded into each new node before its user data runs (a real AMI bakes it in or pulls it from a
registry). The daemon runs in-process here (`lc.daemon()`); the daemon as a service is `test_stack.py`.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from distributed import Client
from tests.e2e.helpers import (
    WORKER_SERVICE,
    booting_from_user_data,
    hostname_of,
    owned_instances,
    phase,
    short_names,
    start,
    wait_for,
)

from swarm_autoscaler.core.actions import Terminate
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud

pytestmark = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.timeout(900)]

SERVICE = WORKER_SERVICE


async def test_machines_boot_from_user_data_into_the_worker_service(cloud: LocalCloud) -> None:
    lc = cloud
    assert lc.emulator is not None and lc.scheduler is not None
    manager = lc.local_swarm.manager
    phases: dict[str, float] = {}
    t = time.monotonic()
    emulator = lc.emulator
    scheduler = lc.scheduler
    before = set(owned_instances(lc, ("pending", "running", "shutting-down", "terminated")))
    # the image in the manager's engine and the worker service deployed (each node's own
    # /etc/swarm-autoscaler, see userdata.node_etc); then each machine boots from its user data
    async with booting_from_user_data(lc):
        t = phase("image and worker service", t, phases)
        # the team's image (docker/worker.Dockerfile) from the private registry (standing in for ECR),
        # which has distributed and the entrypoint script but not swarm_autoscaler
        label = '{{index .Spec.Labels "com.docker.stack.image"}}'
        ref = await manager.docker("service", "inspect", SERVICE, "--format", label)
        assert lc.registry is not None and ref.startswith(f"{lc.registry.host}/team/dask-worker:"), ref
        probe = "import importlib.util as u, sys; sys.exit(u.find_spec('swarm_autoscaler') is not None)"
        await manager.docker("run", "--rm", "--network", "none", "--entrypoint", "python3", ref, "-c", probe)
        async with lc.daemon() as daemon:
            running = await start(daemon)
            try:
                async with Client(lc.scheduler_address, asynchronous=True) as client:
                    # 3 tasks of 2 CPUs each on m5.large (2 CPUs): one machine each
                    futures = [  # time.sleep: the worker image can import it (not this test module)
                        client.submit(
                            time.sleep,
                            1.0,
                            key=f"boot-{i}",
                            pure=False,
                            resources={"CPU": 2, "RAM": GIB, "instance-type:m5.large": 1},
                        )
                        for i in range(3)
                    ]
                    await wait_for(
                        lambda: bool(scheduler.workers), 300, "a worker started by swarm on a new node"
                    )
                    t = phase("scale up (launch, boot from user data, join, worker service task)", t, phases)
                    await asyncio.wait_for(client.gather(futures), 300)
                    ran_on = await client.who_has(futures)
                    workers = {addr: scheduler.workers[addr] for addrs in ran_on.values() for addr in addrs}
                    results = [(str(ws.name), dict(ws.resources)) for ws in workers.values()]
                    t = phase("tasks run", t, phases)
                    # each node that ran the work pulled the image from the registry; none had a
                    # tarball loaded (a worker is named after its node: its OS hostname)
                    for ws in workers.values():
                        node = lc.local_swarm.nodes[str(ws.name)]
                        images = await node.docker("image", "ls", "--format", "{{.Repository}}")
                        assert ref.rsplit(":", 1)[0] in images.split(), images
                        assert "swarm-autoscaler" not in images.split(), images
                launched = {
                    iid: inst
                    for iid, inst in owned_instances(
                        lc, ("pending", "running", "shutting-down", "terminated")
                    ).items()
                    if iid not in before
                }
                hostnames = {hostname_of(i) for i in launched.values()}
                names = short_names(name for name, _ in results)
                # the tasks ran on workers named after the new machines' hostnames ...
                assert names and names <= hostnames, (names, hostnames)
                # ... publishing the type's resources (m5.large: 2 CPUs, 8 GiB less the default memory
                # overhead of 7.5%; no overhead of its own configured)
                for _, resources in results:
                    assert resources["CPU"] == 2 and resources["RAM"] == 8 * GIB - round(8 * GIB * 0.075)
                    assert resources["instance-type:m5.large"] == 1e9
                # ... which swarm started from the global service, not the emulator
                assert all(m.worker is None for m in emulator.machines.values())
                ps = await manager.docker(
                    "service", "ps", SERVICE, "--filter", "desired-state=running", "--format", "{{.Node}}"
                )
                assert names <= short_names(ps.split()), ps
                await wait_for(lambda: not owned_instances(lc), 180, "the fleet back at its minimum (0)")
                await wait_for(lambda: not scheduler.workers, 60, "every dask worker gone")
                # The tick that terminated is recorded when it ends, which can be after moto already
                # shows the fleet gone: wait for a later tick with nothing to do before reading the
                # record (as test_scaling does). A run under load halted the daemon mid-tick and found
                # no Terminate recorded for the 3 machines it had terminated.
                results = running.record.results
                seen = len(results)
                await wait_for(
                    lambda: len(results) > seen and not results[-1].plan.actions,
                    20,
                    "a tick with nothing to do",
                )
                phase("drain and terminate to the minimum", t, phases)
                terminated = {iid for a in running.record.of(Terminate) for iid in a.instance_ids}
                assert set(launched) <= terminated
            finally:
                await running.halt()
    print("phases:", {k: round(v, 1) for k, v in phases.items()}, flush=True)
