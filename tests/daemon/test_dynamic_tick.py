"""Dynamic mode through the daemon's tick, over the in-memory fakes: service tasks turned into the
workload by `core.services`, an unplaceable constraint reported with its reason in a log line and in the
metric, and a launch for the tasks that can run."""

from __future__ import annotations

from prometheus_client import generate_latest
from structlog.testing import capture_logs
from tests.fakes import CATALOGUE, FakeCloud, FakeLock, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.core.actions import Launch
from swarm_autoscaler.core.model import GIB, Resources
from swarm_autoscaler.core.services import ServiceTask, service_view
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import Metrics
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

CLUSTER = "dyn"
POLICY = small_policy(4)
REASON = "constrained to node.labels.zone==eu, which no machine the daemon launches carries"


def tasks() -> list[ServiceTask]:
    zoned = [
        ServiceTask(
            f"zoned-{i}", "gui", "pending", needs=Resources.of(1, GIB), constraints=("node.labels.zone==eu",)
        )
        for i in range(2)
    ]
    return [*zoned, ServiceTask("web-0", "web", "pending", needs=Resources.of(2, GIB))]


def daemon_over(workload: FakeWorkload, metrics: Metrics) -> Daemon:
    clock = SteppedClock()
    daemon = Daemon(
        cluster_name=CLUSTER,
        ports=Ports(
            InFlightCloud(FakeCloud(clock, CATALOGUE, cluster_name=CLUSTER), clock),
            MemorySwarm(cluster_name=CLUSTER),
            workload,
        ),
        lock=FakeLock("a"),
        policy=POLICY,
        catalogue=CATALOGUE,
        poll_interval=5.0,
        on_tick=metrics.observe_tick,
    )
    metrics.follow(daemon)
    return daemon


def gauge(metrics: Metrics, name: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(f'{name}{{cluster="{CLUSTER}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not scraped")


async def test_an_unplaceable_constraint_is_logged_with_its_reason_and_counted() -> None:
    view = service_view([], tasks(), tuple(CATALOGUE.values()), POLICY, CLUSTER)
    workload = FakeWorkload(unrunnable=list(view.unrunnable))
    metrics = Metrics(CLUSTER)
    daemon = daemon_over(workload, metrics)

    with capture_logs() as logs:
        result = await daemon.tick_once()
        again = await daemon.tick_once()  # nothing new: the reason is not logged again
    assert result is not None and again is not None
    assert [(u.task_key, u.reason) for u in result.plan.unplaceable] == [
        ("zoned-0", REASON),
        ("zoned-1", REASON),
    ]
    warned = [e for e in logs if e["event"] == "unplaceable"]
    assert [(e["log_level"], e["reason"], e["tasks"], e["keys"]) for e in warned] == [
        ("warning", REASON, 2, ["zoned-0", "zoned-1"])
    ]
    ticks = [e for e in logs if e["event"] == "tick"]
    assert ticks and all(e["unplaceable"] == 2 for e in ticks)
    assert gauge(metrics, "autoscaler_unplaceable_tasks") == 2
    assert gauge(metrics, "autoscaler_pending_tasks") == 3
    # the unconstrained task still buys its machine: the unplaceable ones do not block it
    assert sum(a.count for a in result.plan.of_kind(Launch)) == 1  # type: ignore[attr-defined]


async def test_a_new_unplaceable_task_is_logged_once_more() -> None:
    workload = FakeWorkload()
    metrics = Metrics(CLUSTER)
    daemon = daemon_over(workload, metrics)
    with capture_logs() as logs:
        for count in (1, 1, 2, 0, 1):
            view = service_view([], tasks()[:count], tuple(CATALOGUE.values()), POLICY, CLUSTER)
            workload.unrunnable = list(view.unrunnable)
            assert await daemon.tick_once() is not None
    warned = [e["keys"] for e in logs if e["event"] == "unplaceable"]
    assert warned == [["zoned-0"], ["zoned-0", "zoned-1"], ["zoned-0"]]
    assert gauge(metrics, "autoscaler_unplaceable_tasks") == 1
