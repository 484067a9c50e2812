"""The simulator's dynamic mode: service traces through the real planner and the same task-to-demand
conversion as the swarm services adapter, on a simulated swarm that places service tasks."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from swarm_autoscaler.config.settings import TimingSettings
from swarm_autoscaler.core.model import Availability, Policy, Resources, TypePolicy
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.sim import cli
from swarm_autoscaler_lab.sim.config import (
    SimEc2Settings,
    build_sim_settings,
    load_sim_settings,
    priced_catalogue,
)
from swarm_autoscaler_lab.sim.dynamic import ServiceRun, simulate_services, summarize_services
from swarm_autoscaler_lab.sim.engine import Options
from swarm_autoscaler_lab.sim.faults import ScriptedFaults
from swarm_autoscaler_lab.sim.servicetrace import (
    Scale,
    ServiceSpec,
    format_service_trace,
    parse_service_trace,
    read_service_trace,
)
from swarm_autoscaler_lab.sim.swarmsim import ServiceWorld, meets
from swarm_autoscaler_lab.sim.trace import TraceError
from swarm_autoscaler_lab.sim.world import Knobs

SCENARIOS = Path(__file__).parents[2] / "scenarios" / "services"
HEADER = "at_s,service,replicas,cpus,ram_gib,gpus,constraints,duration_s\n"
KNOBS = Knobs(join_s=60.0, join_jitter_s=0.0, shutdown_s=20.0)
GPU = "node.labels.instance-type==g4dn.xlarge"


def policy(max_instances: int = 10, min_instances: int = 0) -> Policy:
    types = tuple(TypePolicy(n, overhead=Resources()) for n in ("m5.large", "m5.xlarge", "g4dn.xlarge"))
    return Policy(
        allowed_types=types,
        min_instances=min_instances,
        max_instances=max_instances,
        max_start_time=300.0,
        drain_delay=60.0,
        termination_delay=60.0,
        node_down_timeout=120.0,
    )


class Watch:
    """After every tick: no drained node holds a task; the availabilities and terminations seen."""

    def __init__(self) -> None:
        self.drained: set[str] = set()
        self.terminated: set[str] = set()
        self.ticks = 0

    def __call__(self, run: ServiceRun, result: TickResult) -> None:
        world = run.world
        self.ticks += 1
        for node in world.nodes.values():
            if node.availability is Availability.DRAIN:
                assert not world.on_node(node.id), f"drained node {node.hostname} holds a task"
                self.drained.add(node.instance_id)
        for inst in world.instances.values():
            if inst.ended_at is not None:
                self.terminated.add(inst.id)


def simulate(text: str, p: Policy | None = None, **kw: object) -> tuple[ServiceRun, Watch]:
    p = p or policy()
    watch = Watch()
    options = Options(tick_s=10.0, knobs=KNOBS)
    run = asyncio.run(
        simulate_services(parse_service_trace(text), p, priced_catalogue(p), options, on_tick=watch, **kw)  # type: ignore[arg-type]
    )
    return run, watch


def test_a_service_needing_more_cpu_than_the_fleet_launches_machines_then_scales_to_zero() -> None:
    # 5 replicas of 1.5 CPUs: one per m5.large (2 CPUs), none fits on the empty fleet
    run, watch = simulate(HEADER + "0,web,5,1.5,2,0,,\n900,web,0,,,,,\n")
    world = run.world
    summary = summarize_services(run)
    assert world.launches >= 3 and summary["tasks_started"] == 5
    assert 60.0 <= summary["wait_max_s"] <= 200.0  # a join (60 s), a tick, the task's start
    assert summary["busy_disruptions"] == 0 and run.finished
    # scaled to 0: every machine drained, then terminated; nothing left alive
    assert not world.alive() and world.terminations == world.launches
    assert len(watch.terminated) == world.launches and watch.terminated <= watch.drained


def test_a_constraint_no_type_satisfies_is_unplaceable_with_its_reason_and_buys_nothing() -> None:
    text = (
        HEADER
        + "0,legacy,2,1,1,0,node.labels.zone==onprem,\n0,gpu,1,1,1,0,node.labels.instance-type==p3.2xlarge,\n"
    )
    run, _ = simulate(text)
    reasons = set(run.unplaceable.values())
    assert len(run.unplaceable) == 3
    assert any("node.labels.zone==onprem" in r for r in reasons)
    assert any("p3.2xlarge" in r for r in reasons)
    assert run.world.launches == 0 and run.finished
    assert all(t.state == "pending" for t in run.world.tasks.values())


def test_a_type_constraint_places_the_task_on_that_type_and_gpus_are_reserved() -> None:
    text = HEADER + f"0,viewer,2,1,2,1,{GPU},600\n0,web,1,1,2,0,,600\n"
    seen: dict[str, str] = {}

    def where(run: ServiceRun, result: TickResult) -> None:
        for task in run.world.tasks.values():
            if task.state == "running":
                seen[task.id] = run.world.nodes[task.node_id].type_name

    p = policy()
    options = Options(tick_s=10.0, knobs=KNOBS)
    run = asyncio.run(
        simulate_services(parse_service_trace(text), p, priced_catalogue(p), options, on_tick=where)
    )
    viewers = [t for k, t in seen.items() if k.startswith("viewer.")]
    assert viewers == ["g4dn.xlarge", "g4dn.xlarge"]  # one GPU each: two machines
    assert sum(1 for i in run.world.instances.values() if i.type_name == "g4dn.xlarge") == 2
    assert len(seen) == 3 and not run.world.violations


def test_scaling_down_keeps_the_nodes_still_running_tasks_and_retires_the_rest() -> None:
    run, watch = simulate(HEADER + "0,web,6,1.5,2,0,,\n600,web,2,,,,,\n1800,web,0,,,,,\n")
    assert not run.world.violations and watch.drained
    # at 1200 s (after the scale-down settled) exactly the two machines running web were left
    run2, _ = simulate(HEADER + "0,web,6,1.5,2,0,,\n600,web,2,,,,,\n")
    world = run2.world
    assert run2.finished and not world.violations
    held = {t.node_id for t in world.tasks.values() if t.state == "running"}
    assert len(held) == 2 and len(world.alive()) == 2
    assert {world.instances[i.id].node_id for i in world.alive()} == held


def test_restarts_and_refused_launches_never_disrupt_a_task() -> None:
    faults = ScriptedFaults(
        1, refused_calls=frozenset({1, 3}), never_join=frozenset({2}), restarts=frozenset({5, 9})
    )
    run, _ = simulate(HEADER + f"0,web,4,1.5,2,0,,1200\n100,viewer,1,1,2,1,{GPU},900\n", faults=faults)
    assert run.finished and not run.world.violations and run.restarts == 2
    assert summarize_services(run)["tasks_started"] == 5


def test_the_world_counts_a_drained_or_terminated_node_with_a_task_as_a_busy_disruption() -> None:
    p = policy()
    world = ServiceWorld(priced_catalogue(p), {}, {})
    world.schedule([Scale(150.0, ServiceSpec("web", 1.0, 1.0, 0), 2)])  # once both nodes joined
    for name in ("m5.large", "m5.large"):
        world.launch(name, 1, {"instance-type": name})
    world.advance(world.now + 300.0)
    first, second = sorted(world.nodes.values(), key=lambda n: n.id)
    assert [len(world.on_node(n.id)) for n in (first, second)] == [1, 1]  # spread, one per node
    world.set_availability(first.id, Availability.PAUSE)  # paused: its task stays
    assert len(world.on_node(first.id)) == 1 and not world.violations
    world.set_availability(first.id, Availability.DRAIN)
    assert len(world.violations) == 1 and "drain set" in world.violations[0].what
    assert len(world.on_node(second.id)) == 2  # swarm re-created the task on the other node
    world.terminate([second.instance_id])
    assert len(world.violations) == 2 and world.lost == 3
    assert len([t for t in world.tasks.values() if t.state == "pending"]) == 2  # swarm re-creates them


def test_swarm_placement_constraints() -> None:
    p = policy()
    world = ServiceWorld(priced_catalogue(p), {}, {})
    world.launch("g4dn.xlarge", 1, {"instance-type": "g4dn.xlarge", "zone": "a"})
    world.advance(world.now + 100.0)
    node = next(iter(world.nodes.values()))
    assert meets((GPU, "node.role==worker", "node.labels.zone!=b"), node)
    assert not meets(("node.labels.zone==b",), node)
    assert not meets(("node.role==manager",), node)
    assert meets((f"node.hostname=={node.hostname}",), node)


def test_the_trace_format() -> None:
    changes = parse_service_trace(
        HEADER + f"0,a,2,1,2,0,{GPU};node.role==worker,60\n30,a,3,,,,,\n10,b,1,0.5,,,,\n"
    )
    assert [(c.at_s, c.spec.name, c.replicas) for c in changes] == [(0, "a", 2), (10, "b", 1), (30, "a", 3)]
    assert changes[0].spec.constraints == (GPU, "node.role==worker") and changes[2].spec == changes[0].spec
    assert parse_service_trace(format_service_trace(changes)) == changes
    # a later row of the service before the end cancels the end: a stays at 3
    world = ServiceWorld(priced_catalogue(policy()), {}, {})
    world.schedule(changes)
    world.advance(world.now + 120.0)
    assert world.replicas == {"a": 3, "b": 1}
    for bad, words in (
        ("0,a,1,1,1,0,,\n5,a,1,2,1,0,,\n", "changes its reservations"),
        ("0,a,1,0,0,0,,\n", "must reserve"),
        ("0,a,1.5,1,1,0,,\n", "whole number"),
        ("0,,1,1,1,0,,\n", "service name"),
        ("0,a,1,1,1,0,,0\n", "duration_s must be positive"),
    ):
        with pytest.raises(TraceError, match=words):
            parse_service_trace(HEADER + bad, "t.csv")
    with pytest.raises(TraceError, match="header"):
        parse_service_trace("submit_s,duration_s,cpus,ram_gib,gpus,instance_type\n")


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *extra])


def test_the_bundled_service_scenario_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert read_service_trace(SCENARIOS / "interactive.csv")
    assert load_sim_settings(SCENARIOS / "interactive.env").policy.max_instances == 20
    args = _args("--services", str(SCENARIOS / "interactive.csv"), "--json")
    assert args.handler(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "dynamic" and out["finished"] and out["busy_disruptions"] == 0
    assert out["tasks_unplaceable"] == 1 and "node.labels.zone==onprem" in out["unplaceable_reasons"][0]
    assert out["launches"] > 0 and out["terminations"] == out["launches"]  # all services end: back to 0
    table = _args("--services", str(SCENARIOS / "interactive.csv"))
    assert table.handler(table) == 0 and "busy_disruptions" in capsys.readouterr().out
    wrong = _args("--services", str(SCENARIOS / "interactive.csv"), "--policy", "static")
    assert wrong.handler(wrong) == 2 and "runs ours only" in capsys.readouterr().err


def test_settings_from_the_daemon_loader_run_a_service_trace() -> None:
    ec2 = SimEc2Settings.model_validate({"allowed_types": {"m5.large": {}}, "max_instances": 2})
    settings = build_sim_settings(TimingSettings(poll_interval=10.0), ec2)
    p = settings.policy
    run = asyncio.run(
        simulate_services(
            parse_service_trace(HEADER + "0,web,4,1.5,2,0,,600\n"),
            p,
            settings.catalogue,
            Options(tick_s=10.0, knobs=KNOBS),
        )
    )
    assert run.peak_instances == 2 and run.max_exceeded == 0  # the maximum holds: two replicas wait
    assert summarize_services(run)["tasks_started"] == 2 and not run.world.violations
