"""The operator's kit in docker/: the Grafana dashboard and the Prometheus alert rules use only metrics a
running daemon and a running keeper expose on /metrics, and the rules are valid (promtool, when
installed: scripts/ensure-services.sh installs Debian's prometheus package, which ships it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from tests.fakes import CATALOGUE, FakeCloud, FakeLock, FakeWorkload, SteppedClock, small_policy
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.core.model import GIB, Instance, InstanceState, Resources, Task
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.metrics import Metrics, build_app
from swarm_autoscaler.daemon.tick import Ports
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.runtime.http import start_http
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docker" / "grafana-dashboard.json"
ALERTS = ROOT / "docker" / "alerts.yml"
ALERT_TESTS = ROOT / "docker" / "alerts.test.yml"
CLUSTER = "kit-test"
METRIC = re.compile(r"\b(?:autoscaler|keeper)_[a-zA-Z0-9_]+")
# The series each exposed family gives Prometheus, by its type (prometheus_client's exposition).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
    "summary": ("", "_count", "_sum", "_created"),
}


def exposed_series(text: str) -> set[str]:
    """Every series name a scrape of `text` gives, including those of labelled families without a
    sample yet (their HELP and TYPE are exposed from the start)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


@pytest.fixture
async def daemon_served() -> AsyncIterator[tuple[str, FakeCloud]]:
    """A daemon over fakes that ran two ticks (a launch, an unplaceable task) served over real HTTP."""
    clock = SteppedClock()
    cloud = FakeCloud(clock, CATALOGUE, cluster_name=CLUSTER)
    cloud.instances["i-1"] = Instance("i-1", "m5.large", InstanceState.PENDING, clock.now - 10, "ip-10-0-0-5")
    workload = FakeWorkload()
    # one whole-machine task fits the pending machine, two more need a launch each; one fits nothing
    workload.unrunnable = [Task(f"whole-{i}", Resources(2, GIB)) for i in range(3)]
    workload.unrunnable.append(Task("impossible", Resources(512, GIB)))
    metrics = Metrics(CLUSTER)
    daemon = Daemon(
        cluster_name=CLUSTER,
        ports=Ports(InFlightCloud(cloud, clock), MemorySwarm(cluster_name=CLUSTER), workload),
        lock=FakeLock("a"),
        policy=small_policy(6),
        catalogue=CATALOGUE,
        poll_interval=5.0,
        on_tick=metrics.observe_tick,
    )
    metrics.follow(daemon)
    for _ in range(2):
        assert await daemon.tick_once() is not None
        clock.step(5.0)
    runner = await start_http(build_app(metrics, lambda: daemon.last_success, 5.0, clock), "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        async with aiohttp.ClientSession() as session, session.get(f"http://{host}:{port}/metrics") as got:
            assert got.status == 200
            yield await got.text(), cloud
    finally:
        await runner.cleanup()


@pytest.fixture
def daemon_scrape(daemon_served: tuple[str, FakeCloud]) -> str:
    return daemon_served[0]


@pytest.fixture
async def keeper_scrape() -> AsyncIterator[str]:
    now = 1_000_000.0
    keeper = Keeper(
        FakeHosts(), FakeProbe(), SharedLocks(lambda: now).for_replica("a"), KeeperTiming(), interval=0.05
    )
    app = build_keeper_app(keeper, "kit-test-token-0123", KeeperMetrics())
    try:
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/metrics")
            assert response.status == 200
            yield await response.text()
    finally:
        await keeper.stop()


def test_the_kit_uses_metrics_of_both_services() -> None:
    used = {m for e in dashboard_expressions() for m in METRIC.findall(e)}
    used |= {m for r in alert_rules() for m in METRIC.findall(r["expr"])}
    assert {"autoscaler_is_leader", "autoscaler_instances", "autoscaler_max_instances"} <= used
    assert any(m.startswith("keeper_") for m in used)


async def test_every_metric_of_the_dashboard_and_the_rules_is_exposed(
    daemon_scrape: str, keeper_scrape: str
) -> None:
    exposed = exposed_series(daemon_scrape) | exposed_series(keeper_scrape)
    assert "autoscaler_actions_total" in exposed and "keeper_requests_total" in exposed
    for source, exprs in (
        ("docker/grafana-dashboard.json", dashboard_expressions()),
        ("docker/alerts.yml", [r["expr"] for r in alert_rules()]),
    ):
        missing = sorted({m for e in exprs for m in METRIC.findall(e)} - exposed)
        assert not missing, f"{source} uses metrics no daemon or keeper exposes: {missing}"


async def test_instances_and_their_maximum_are_exposed_with_their_values(
    daemon_served: tuple[str, FakeCloud],
) -> None:
    text, cloud = daemon_served
    values = {
        s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels
    }
    values |= {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels == {"cluster": CLUSTER}
    }
    assert values["autoscaler_max_instances"] == 6
    alive = sum(1 for i in cloud.instances.values() if i.alive)
    assert alive == 3  # the pending machine and the two launched in the first tick, seen by the second
    assert values["autoscaler_instances"] == alive


def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert re.fullmatch(r"\d+m", rule["for"]), rule["alert"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_accepts_the_rules_and_their_unit_tests_pass(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True, check=False, timeout=60
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # The dashboard's queries parse as PromQL too: checked as recording rules.
    exprs = [e.replace("$cluster", ".*") for e in dashboard_expressions() if not e.startswith("label_values")]
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"panel:{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    parsed = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr
