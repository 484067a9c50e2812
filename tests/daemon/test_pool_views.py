"""The warm pool in the metrics, the `status` view and the demo dashboard."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from tests.builders import NOW, assemble, machine, make_instance, make_policy

from swarm_autoscaler.core.actions import Launch, Plan, Start
from swarm_autoscaler.core.model import InstanceState, PoolPhase, TypePolicy
from swarm_autoscaler.daemon.act import Outcome
from swarm_autoscaler.daemon.commands import pool_lines, print_status
from swarm_autoscaler.daemon.metrics import Metrics
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.demo.dashboard import View, render

GPU = "g4dn.xlarge"
POLICY = make_policy((TypePolicy("m5.large"), TypePolicy(GPU, warm_pool=3, minimum=1)))


def _result() -> TickResult:
    stopped = make_instance(1, GPU, InstanceState.STOPPED)
    stopping = make_instance(2, GPU, InstanceState.STOPPING)
    preparing = dataclasses.replace(make_instance(3, GPU, age=30), pool=PoolPhase.PREPARE)
    inst, node, worker = machine(4, GPU)  # started from the pool 42 s ago, its worker up
    started = dataclasses.replace(inst, pool=PoolPhase.START, launched_at=NOW - 42)
    snapshot = assemble(
        (stopped, None, None), (stopping, None, None), (preparing, None, None), (started, node, worker)
    )
    start, launch = Start(("i-0001",), GPU, "work"), Launch(GPU, 2, "work")
    refill = Launch(GPU, 1, "refill", pool=True)
    outcomes = (Outcome(start, True), Outcome(launch, True), Outcome(refill, True))
    return TickResult(snapshot, POLICY, Plan((start, launch, refill)), outcomes, True)


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, {"cluster": "c", **labels})
    return value


def test_pool_metrics() -> None:
    metrics = Metrics("c")
    result = _result()
    metrics.observe_tick(result, 0.1, None)
    for state, count in (("stopped", 1), ("stopping", 1), ("preparing", 1)):
        assert _sample(metrics, "autoscaler_warm_pool_machines", instance_type=GPU, state=state) == count
    assert _sample(metrics, "autoscaler_machines_added_total", instance_type=GPU, source="pool") == 1
    assert _sample(metrics, "autoscaler_machines_added_total", instance_type=GPU, source="launch") == 2
    assert _sample(metrics, "autoscaler_pool_start_seconds_count", instance_type=GPU) == 1
    assert _sample(metrics, "autoscaler_pool_start_seconds_sum", instance_type=GPU) == 42
    metrics.observe_tick(result, 0.1, None)  # the same machine is observed once
    assert _sample(metrics, "autoscaler_pool_start_seconds_count", instance_type=GPU) == 1


def test_status_and_dashboard_show_the_pool() -> None:
    result = _result()
    [line] = pool_lines(result)
    assert line == f"warm pool {GPU}: stopped=2, preparing=1, starting=0 (size 3); base 1 running"
    console = Console(record=True, width=200)
    print_status(result, console)
    text = console.export_text()
    assert line in text and "i-0001" in text  # the stopped instance is listed
    view = View(pool=[line])
    view.record_actions(result, 1.0)
    console = Console(record=True, width=200)
    console.print(render(view))
    text = console.export_text()
    assert "warm pool and base" in text and line in text
    assert f"Start 1x{GPU} from the pool" in text and f"Launch 1x{GPU} into the pool" in text
