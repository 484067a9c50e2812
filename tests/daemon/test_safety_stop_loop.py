"""The safety stop in the loop (core/safety.py): a daemon over fakes (FakeCloud for EC2, the in-memory
swarm for docker, FakeWorkload for the scheduler) whose swarm loses most of its nodes at once, as a
network partition between managers and workers does. It terminates nothing, logs one warning, sets
`autoscaler_scale_down_halted`, and resumes when the nodes come back."""

from __future__ import annotations

from structlog.testing import capture_logs
from tests.daemon.test_act import World
from tests.fakes import CATALOGUE, FakeCloud, FakeLock, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Instance, InstanceState, NodeStatus
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import Metrics
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

CLUSTER = "partition"
HOSTS = [f"ip-10-0-0-{n}" for n in range(1, 6)]


async def test_a_partition_halts_scale_down_in_the_loop_and_it_resumes_after() -> None:
    clock = SteppedClock()
    cloud = FakeCloud(clock, CATALOGUE)
    swarm = MemorySwarm(cluster_name=CLUSTER)
    for n, host in enumerate(HOSTS, 1):
        inst = Instance(f"i-{n:04d}", "m5.large", InstanceState.RUNNING, clock.now - 600, host)
        cloud.instances[inst.id] = inst
        swarm.join(host, swarm.join_token, {OWNERSHIP_LABEL: CLUSTER})
    workers = [World.worker(n) for n in range(1, 6)]  # an idle dask worker on each machine
    workload = FakeWorkload(workers=list(workers))
    metrics = Metrics(CLUSTER)
    daemon = Daemon(
        cluster_name=CLUSTER,
        ports=Ports(InFlightCloud(cloud), swarm, workload),
        lock=FakeLock("a"),
        policy=small_policy(5),  # node_down_timeout: the default 300 s
        catalogue=CATALOGUE,
        poll_interval=5.0,
        lock_ttl=30.0,
        on_tick=metrics.observe_tick,
    )
    assert await daemon.tick_once() is not None  # the fleet is seen whole: its nodes marked ready
    clock.step(5)
    for host in HOSTS[:3]:  # the partition: 3 of 5 nodes look down, their workers unreachable
        swarm.set_status(host, NodeStatus.DOWN)
    workload.workers[:] = workers[3:]
    with capture_logs() as logs:
        for _ in range(4):  # past node_down_timeout and every scale-down delay
            assert await daemon.tick_once() is not None
            clock.step(200)
    halted = [e for e in logs if e["event"] == "scale-down halted"]
    assert len(halted) == 1 and halted[0]["log_level"] == "warning", logs  # one warning line
    assert "3 of 5 owned nodes are down" in halted[0]["reason"]
    assert metrics.registry.get_sample_value("autoscaler_scale_down_halted", {"cluster": CLUSTER}) == 1
    assert not [c for c in cloud.calls if c[0] == "terminate"] and len(swarm.nodes) == 5

    for host in HOSTS[:3]:  # the partition heals
        swarm.set_status(host, NodeStatus.READY)
    workload.workers[:] = workers
    with capture_logs() as logs:
        for _ in range(4):
            assert await daemon.tick_once() is not None
            clock.step(200)
    assert [e["event"] for e in logs if "scale-down" in e["event"]] == [
        "scale-down resumed: enough nodes are back"
    ]
    assert metrics.registry.get_sample_value("autoscaler_scale_down_halted", {"cluster": CLUSTER}) == 0
    # the idle fleet is scaled down again (nothing pending, min 0)
    assert [c for c in cloud.calls if c[0] == "terminate"]
