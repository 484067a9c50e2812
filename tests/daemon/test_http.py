"""/metrics and /healthz served by a real aiohttp server, scraped over HTTP; the daemon runs over fakes
with a stepped clock, so "ticks stopped" is a clock step, not a wait."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.fakes import CATALOGUE, FakeCloud, FakeLock, FakeWorkload, SteppedClock, small_policy

from swarm_autoscaler.core.model import GIB, Instance, InstanceState, Resources, Task, Worker
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import STALE_TICKS, Metrics, build_app
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler.runtime.http import start_http
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

POLICY = small_policy(6)
POLL = 5.0
CLUSTER = "http-test"


@dataclass
class Served:
    clock: SteppedClock
    cloud: FakeCloud
    workload: FakeWorkload
    daemon: Daemon
    base: str
    session: aiohttp.ClientSession

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path) as response:
            return response.status, await response.text()

    async def healthz(self) -> tuple[int, dict[str, Any]]:
        async with self.session.get(self.base + "/healthz") as response:
            return response.status, await response.json()

    async def samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Every sample of the scrape by sample name: (labels, value)."""
        status, text = await self.get("/metrics")
        assert status == 200
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    clock = SteppedClock()
    cloud = FakeCloud(clock, CATALOGUE, cluster_name=CLUSTER)
    workload = FakeWorkload()
    metrics = Metrics(CLUSTER)
    daemon = Daemon(
        cluster_name=CLUSTER,
        ports=Ports(InFlightCloud(cloud, clock), MemorySwarm(cluster_name=CLUSTER), workload),
        lock=FakeLock("a"),
        policy=POLICY,
        catalogue=CATALOGUE,
        poll_interval=POLL,
        on_tick=metrics.observe_tick,
    )
    metrics.follow(daemon)
    app = build_app(metrics, lambda: daemon.last_success, POLL, clock)
    runner = await start_http(app, "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        async with aiohttp.ClientSession() as session:
            yield Served(clock, cloud, workload, daemon, f"http://{host}:{port}", session)
    finally:
        await runner.cleanup()


def value(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    matching = [v for lbl, v in samples if all(lbl.get(k) == want for k, want in labels.items())]
    assert len(matching) == 1, (labels, samples)
    return matching[0]


async def test_metrics_scrape_shows_buckets_work_actions_failures_and_tick_durations(served: Served) -> None:
    clock = served.clock
    booting = Instance("i-booting", "m5.xlarge", InstanceState.PENDING, clock.now - 10, "ip-10-0-0-5")
    served.cloud.instances[booting.id] = booting
    served.cloud.refuse_types = {"m5.large"}
    small = [Task(f"small-{i}", Resources(1, GIB)) for i in range(6)]
    impossible = Task("impossible", Resources(512, GIB))
    served.workload.unrunnable = [*small, impossible]

    first = await served.daemon.tick_once()
    assert first is not None and first.acted
    for _ in range(2):  # a refusal, the fallback launch, then a tick that sees it
        clock.step(POLL)
        assert await served.daemon.tick_once() is not None
    got = await served.samples()

    buckets = {(lbl["bucket"], lbl["instance_type"]): v for lbl, v in got["autoscaler_bucket_size"]}
    assert all(lbl["cluster"] == CLUSTER for lbl, _ in got["autoscaler_bucket_size"])
    assert sum(v for (_, itype), v in buckets.items() if itype == "m5.xlarge") >= 2  # booting + fallback
    assert not any(itype == "m5.large" and v for (_, itype), v in buckets.items())  # every launch refused
    # pending counts every unrunnable task (model.Plan.pending), the impossible one included
    assert value(got["autoscaler_pending_tasks"], cluster=CLUSTER) == len(small) + 1
    assert value(got["autoscaler_unplaceable_tasks"], cluster=CLUSTER) == 1

    refused = value(got["autoscaler_actions_total"], kind="Launch", outcome="capacity")
    assert refused >= 1
    assert value(got["autoscaler_launch_failures_total"], reason="capacity") == refused
    assert value(got["autoscaler_actions_total"], kind="Launch", outcome="ok") >= 1
    launch_calls = [args for kind, args in served.cloud.calls if kind == "launch"]
    assert sum(v for lbl, v in got["autoscaler_actions_total"] if lbl["kind"] == "Launch") == len(
        launch_calls
    )

    assert value(got["autoscaler_cordoned_nodes"], cluster=CLUSTER) == 0
    assert value(got["autoscaler_tick_duration_seconds_count"], cluster=CLUSTER) == 3
    assert value(got["autoscaler_tick_duration_seconds_bucket"], cluster=CLUSTER, le="+Inf") == 3
    assert value(got["autoscaler_is_leader"], cluster=CLUSTER) == 1
    assert value(got["autoscaler_last_successful_tick_timestamp_seconds"], cluster=CLUSTER) == clock.now


async def test_a_failed_tick_counts_as_an_error_and_still_times_the_tick(served: Served) -> None:
    from swarm_autoscaler.errors import EndpointError

    served.cloud.fail_list = EndpointError("http://ec2.local", "connection refused")
    assert await served.daemon.tick_once() is None
    got = await served.samples()
    assert value(got["autoscaler_tick_errors_total"], cluster=CLUSTER) == 1
    assert value(got["autoscaler_tick_duration_seconds_count"], cluster=CLUSTER) == 1


async def test_healthz_is_ok_after_a_tick_and_503_with_the_reason_once_ticks_stop(served: Served) -> None:
    status, body = await served.healthz()
    assert status == 503 and body["status"] == "starting"

    assert await served.daemon.tick_once() is not None
    status, body = await served.healthz()
    assert (status, body["status"]) == (200, "ok")

    limit = STALE_TICKS * POLL + 5.0
    served.clock.step(limit - 1)  # still within the limit
    assert (await served.healthz())[0] == 200

    served.clock.step(2)  # no tick for longer than the limit
    status, body = await served.healthz()
    assert status == 503 and body["status"] == "stale"
    assert "last successful tick" in body["reason"] and f"{limit:.0f}s" in body["reason"]

    served.cloud.fail_list = RuntimeError("ec2 down")  # a failing tick does not make it healthy again
    await served.daemon.tick_once()
    assert (await served.healthz())[0] == 503

    served.cloud.fail_list = None
    assert await served.daemon.tick_once() is not None
    assert (await served.healthz())[0] == 200


async def test_cordoned_nodes_are_counted(served: Served) -> None:
    """Two machines of a type, each running one small task: consolidation cordons one of them."""
    for n in (1, 2):
        host = f"ip-10-0-0-{n}"
        inst = Instance(f"i-{n}", "m5.xlarge", InstanceState.RUNNING, served.clock.now - 600, host)
        served.cloud.instances[inst.id] = inst
        swarm = served.daemon.ports.orchestrator
        assert isinstance(swarm, MemorySwarm)
        swarm.join(host, swarm.join_token)
        running = Task(f"run-{n}", Resources(1, GIB), executing=True)
        worker = Worker(f"tcp://10.0.0.{n}:1", host, host, Resources(4, 16 * GIB), processing=(running,))
        served.workload.workers.append(worker)
    await served.daemon.tick_once()  # cordons one
    served.clock.step(POLL)
    await served.daemon.tick_once()  # sees it cordoned
    got = await served.samples()
    assert value(got["autoscaler_cordoned_nodes"], cluster=CLUSTER) == 1
    assert value(got["autoscaler_actions_total"], kind="Cordon", outcome="ok") == 1
