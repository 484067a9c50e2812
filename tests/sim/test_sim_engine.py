"""The engine end to end: the real planner through run_tick, restarts, baselines, report, CLI."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from swarm_autoscaler.config.settings import InvalidSettingsError, TimingSettings
from swarm_autoscaler.core.actions import Plan
from swarm_autoscaler.core.model import GIB, Policy, Snapshot, TypePolicy
from swarm_autoscaler.core.plan import plan as real_plan
from swarm_autoscaler_lab.sim import cli
from swarm_autoscaler_lab.sim.baselines import AdaptiveLike, QueueRule, Static
from swarm_autoscaler_lab.sim.config import (
    SimEc2Settings,
    SimSettings,
    build_sim_settings,
    load_sim_settings,
    priced_catalogue,
)
from swarm_autoscaler_lab.sim.engine import Options
from swarm_autoscaler_lab.sim.faults import RandomFaults
from swarm_autoscaler_lab.sim.report import cost_lb, makespan_lb, percentile
from swarm_autoscaler_lab.sim.runner import POLICIES, default_options, run_trace
from swarm_autoscaler_lab.sim.table import markdown, mean_of, misses, spread
from swarm_autoscaler_lab.sim.trace import Job

ENV = (
    "AUTOSCALER_POLL_INTERVAL=10s\n"
    'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {}, "m5.xlarge": {"reserve": 1}}\n'
    "AUTOSCALER_EC2_MAX_INSTANCES=4\n"
)


def settings(max_instances: int = 4, min_instances: int = 0) -> SimSettings:
    ec2 = SimEc2Settings.model_validate(
        {"allowed_types": {"m5.large": {}}, "max_instances": max_instances, "min_instances": min_instances}
    )
    return build_sim_settings(TimingSettings(poll_interval=10.0), ec2)


JOBS = tuple(Job(i, 20.0 * i, 300.0 + 10 * i, 1.0, 2.0, 0) for i in range(8))


class Recording:
    """The real planner, counting the snapshots it is handed."""

    name = "ours"
    stops_when_done = False

    def __init__(self) -> None:
        self.snapshots = 0

    def new_planner(self) -> Any:
        def planner(snapshot: Snapshot, policy: Policy) -> Plan:
            self.snapshots += 1
            return real_plan(snapshot, policy)

        return planner


def test_ours_runs_the_real_planner_through_run_tick_and_settles() -> None:
    import asyncio

    from swarm_autoscaler_lab.sim.engine import simulate
    from swarm_autoscaler_lab.sim.report import summarize

    st = settings()
    strategy = Recording()
    run = asyncio.run(simulate(JOBS, st.policy, st.catalogue, strategy, default_options(st)))
    s = summarize(run, st.catalogue)
    assert strategy.snapshots == run.ticks > 0
    assert s["completed_jobs"] == 8 and run.finished
    assert s["busy_terminations"] == 0 and s["max_exceeded"] == 0
    assert 0 < s["peak_instances"] <= 4 and s["launches"] == s["terminations"]
    assert s["cost_usd"] >= s["cost_lb_usd"] > 0 and s["makespan_s"] >= s["makespan_lb_s"]
    assert not run.world.alive()


def test_restarting_the_daemon_every_tick_changes_nothing() -> None:
    """The daemon's state lives in tags and marks only: a restart before every tick gives the same run,
    machines that never join included. The one exception is its memory of the work seen (idle learning,
    core/arrivals.py), which a restart loses by design: restarted every tick, the daemon plans exactly
    as with idle learning off (the settings' delays), which is what the steady run here is given."""
    st = settings()
    unlearned = dataclasses.replace(st, policy=dataclasses.replace(st.policy, idle_learning=False))
    faults = RandomFaults(seed=3, never_join_rate=0.2)
    _, steady = run_trace(JOBS, unlearned, "ours", default_options(st), faults)
    options = Options(tick_s=st.poll_interval, knobs=default_options(st).knobs, restart_every=1)
    run, restarted = run_trace(JOBS, st, "ours", options, faults)
    assert restarted.pop("restarts") == run.ticks - 1 > 10 and steady.pop("restarts") == 0
    assert restarted == steady
    assert steady["completed_jobs"] == 8 and steady["busy_terminations"] == 0


def test_restarts_with_capacity_refusals_stay_safe() -> None:
    """Refusal back-offs are daemon memory (lost on restart, so retries may come sooner); safety holds."""
    st = settings()
    faults = RandomFaults(seed=3, refusal_rate=0.3, never_join_rate=0.2)
    options = Options(tick_s=st.poll_interval, knobs=default_options(st).knobs, restart_every=2)
    _, s = run_trace(JOBS, st, "ours", options, faults)
    assert s["completed_jobs"] == 8 and s["busy_terminations"] == 0 and s["max_exceeded"] == 0
    assert s["restarts"] > 10


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_completes_the_trace_safely(name: str) -> None:
    run, s = run_trace(JOBS, settings(), name)
    assert s["policy"] == name and s["completed_jobs"] == 8
    assert s["busy_terminations"] == 0 and s["max_exceeded"] == 0
    if name == "static":
        assert s["launches"] == 4 and s["terminations"] == 0 and run.finished
    else:
        assert s["terminations"] == s["launches"]


def test_queue_rule_adds_one_machine_per_tick() -> None:
    jobs = tuple(Job(i, 0.0, 600.0, 2.0, 2.0, 0) for i in range(20))
    run, s = run_trace(jobs, settings(max_instances=5), "queue-rule")
    booting = [x.booting for x in run.samples[:6]]
    assert booting == [1, 2, 3, 4, 5, 5] and s["peak_instances"] == 5


def test_adaptive_target_follows_distributed_formula() -> None:
    from swarm_autoscaler.core.model import Resources, Task, Worker

    a = AdaptiveLike(mean_duration=60.0)
    task = Task("t", Resources(1, GIB))
    empty = Snapshot(0.0, (), (), (), (), (task,) * 3)
    assert a.target(empty) == 3  # min(ceil(3 * 60 / 5), 3 tasks), no workers yet
    w = Worker("a", "a", "h", Resources(4, GIB), processing=(task,) * 8)
    assert a.target(Snapshot(0.0, (), (), (), (w,), ())) == 2  # 8 threads wanted / 4 per worker
    # dask's own estimates: unknown tasks cost 0.5 s, or twice the longest run of their shape so far
    assert AdaptiveLike().target(empty) == 1  # ceil(3 x 0.5 s / 5 s): few machines for unknown work
    running = Task("r", Resources(1, GIB), executing=True, started=0.0)
    busy = Worker("a", "a", "h", Resources(4, GIB), processing=(running, task, task, task))
    assert (
        AdaptiveLike().target(Snapshot(10.0, (), (), (), (busy,), ())) == 1
    )  # 4 x 20 s / 5 s = 16, min 4 tasks
    known = replace(task, expected=30.0)
    assert AdaptiveLike().target(Snapshot(0.0, (), (), (), (), (known,) * 3)) == 3  # min(18, 3 tasks)
    for cls, source in (
        (QueueRule, "always-on base"),
        (AdaptiveLike, "adaptive_target"),
        (Static, "maximum size"),
    ):
        assert source in (cls.__doc__ or "")


def test_lower_bounds_from_the_trace() -> None:
    policy = Policy((TypePolicy("m5.large"), TypePolicy("m5.xlarge")), min_instances=1, max_instances=3)
    catalogue = priced_catalogue(policy)
    jobs = (Job(0, 0.0, 3600.0, 1.0, 2.0, 0), Job(1, 100.0, 3600.0, 4.0, 4.0, 0))
    assert makespan_lb(jobs) == 3700.0
    # job 0: half an m5.large for an hour; job 1: a whole m5.xlarge for an hour
    assert cost_lb(jobs, policy, catalogue) == pytest.approx(0.096 / 2 + 0.192)
    lazy = (Job(0, 0.0, 36.0, 1.0, 2.0, 0), Job(1, 7164.0, 36.0, 1.0, 2.0, 0))
    assert cost_lb(lazy, policy, catalogue) == pytest.approx(0.096 * 2)  # the always-on floor dominates
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 95) == 0.0


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *extra])


def test_cli_json_plot_and_sibling_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from swarm_autoscaler_lab.sim.trace import write_trace

    trace = tmp_path / "t.csv"
    write_trace(trace, JOBS)
    (tmp_path / "t.env").write_text(ENV)  # no AMI ids, no scheduler URL: not needed to simulate
    png = tmp_path / "out.png"
    args = _args(tmp_path, "--trace", str(trace), "--json", "--plot", str(png), "--refusal-rate", "0.1")
    assert args.handler(args) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("completed_jobs", "makespan_s", "wait_p50_s", "wait_p95_s", "instance_seconds", "cost_usd",
                "launches", "terminations", "peak_instances", "busy_terminations", "max_exceeded",
                "makespan_lb_s", "cost_lb_usd", "makespan_ratio", "cost_ratio"):  # fmt: skip
        assert key in out
    assert out["completed_jobs"] == 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = _args(tmp_path, "--trace", str(trace), "--policy", "static")
    assert table.handler(table) == 0
    assert "busy_terminations" in capsys.readouterr().out


def test_the_readme_table_runs_a_scenario_as_the_command_does(capsys: pytest.CaptureFixture[str]) -> None:
    scenarios = Path(__file__).parents[2] / "scenarios"
    args = _args(scenarios, "--trace", str(scenarios / "gpu_surge.csv"), "--json")
    assert args.handler(args) == 0
    printed = json.loads(capsys.readouterr().out)
    tabled = run_all_of(scenarios, "gpu_surge")
    assert printed == tabled


def run_all_of(directory: Path, name: str) -> dict[str, Any]:
    """The table's seed-0 run of `ours` on one scenario (on a folder holding just that scenario)."""
    import shutil
    import tempfile

    from swarm_autoscaler_lab.sim.table import run_seeds

    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".csv", ".env"):
            shutil.copy(directory / f"{name}{suffix}", Path(tmp) / f"{name}{suffix}")
        return dict(run_seeds(Path(tmp), seeds=1)[0][name]["ours"])


def test_cli_reports_bad_input_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,duration_s,cpus,ram_gib,gpus,instance_type\n0,60,1,2,0,\n0,x,1,2,0,\n")
    (tmp_path / "t.env").write_text(ENV)
    args = _args(tmp_path, "--trace", str(trace))
    assert args.handler(args) == 2
    assert f"{trace}:3: duration_s='x' is not a number" in capsys.readouterr().err
    trace.write_text("submit_s,duration_s,cpus,ram_gib,gpus,instance_type\n0,60,1,2,0,\n")
    (tmp_path / "t.env").write_text('AUTOSCALER_EC2_ALLOWED_TYPES={"m9.huge": {}}\n')
    assert args.handler(args) == 2
    assert "AUTOSCALER_EC2_ALLOWED_TYPES" in capsys.readouterr().err


def test_sim_settings_need_no_ami_but_refuse_what_the_daemon_refuses(tmp_path: Path) -> None:
    env = tmp_path / "s.env"
    env.write_text(
        'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {"overhead": {"cpus": 0.5, "ram_gib": 1}}, '
        '"c5.large": {"ami_id": "unused", "price_per_hour": 0.05, "later": 1}}\n'
    )
    loaded = load_sim_settings(env)
    assert [(t.name, t.overhead.cpus, t.overhead.ram) for t in loaded.policy.allowed_types] == [
        ("m5.large", 0.5, GIB),
        ("c5.large", 0.0, 0),
    ]
    assert loaded.catalogue["c5.large"].price_per_hour == 0.05
    env.write_text(
        'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {"reserve": 3}}\nAUTOSCALER_EC2_MAX_INSTANCES=2\n'
    )
    with pytest.raises(InvalidSettingsError) as info:
        load_sim_settings(env)
    assert info.value.problems == (
        "AUTOSCALER_EC2_MAX_INSTANCES: must be at least the sum of the reserves in "
        "AUTOSCALER_EC2_ALLOWED_TYPES (3), got '2'",
    )
    env.write_text('AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {"overhead": {"cpus": 2}}}\n')
    with pytest.raises(InvalidSettingsError, match=r"overhead of m5\.large .* leaves no room for work"):
        load_sim_settings(env)


def test_table_markdown_and_target_checks() -> None:
    def row(p95: float, cost: float, busy: int = 0) -> dict[str, Any]:
        return {"jobs": 1, "completed_jobs": 1, "wait_p50_s": 0.0, "wait_p95_s": p95, "cost_usd": cost,
                "cost_ratio": 1.1, "makespan_ratio": 1.0, "launches": 1, "peak_instances": 1,
                "busy_terminations": busy, "max_exceeded": 0}  # fmt: skip

    results = {"burst500": {"ours": row(10, 1.0), "queue-rule": row(20, 2.0), "adaptive": row(5, 0.99),
                            "static": row(5, 3.0)}}  # fmt: skip
    text = markdown(results)
    assert text.splitlines()[2].startswith("| burst500 | ours | 1 |") and len(text.splitlines()) == 6
    assert misses(results) == []  # adaptive is quicker but only 1% cheaper: not dominating
    results["burst500"]["ours"] = row(30, 4.0, busy=1)  # now dearer and slower than every baseline
    assert len(misses(results)) == 4
    assert any(m.startswith("burst500: adaptive costs 0.99 against 4.00") for m in misses(results))
    results["burst500"]["ours"] = row(5, 1.0) | {"cost_ratio": 1.2, "makespan_ratio": 1.6}
    assert misses(results) == [
        "burst500: cost 1.2 x its lower bound > 1.15",
        "burst500: makespan 1.6 x its lower bound > 1.5",
    ]
    heavy = {"ours": row(30, 1.0) | {"cost_ratio": 1.7}, "queue-rule": row(20, 2.0)}
    assert misses({"heavy_tailed": heavy}) == [
        "heavy_tailed: cost 1.7 x its lower bound > 1.6",
        "heavy_tailed: p95 wait 30 s > queue rule's 20 s",
    ]


def test_over_seeds_costs_are_averaged_and_safety_counts_are_the_worst() -> None:
    def row(cost: float, busy: int, done: int) -> dict[str, Any]:
        return {"policy": "ours", "jobs": 2, "completed_jobs": done, "cost_usd": cost, "wait_p95_s": 10.0,
                "busy_terminations": busy, "max_exceeded": 0, "cost_ratio": None}  # fmt: skip

    runs = [{"s": {"ours": row(1.0, 0, 2)}}, {"s": {"ours": row(3.0, 1, 1)}}]
    mean = mean_of(runs)["s"]["ours"]
    assert mean["cost_usd"] == 2.0 and mean["busy_terminations"] == 1 and mean["completed_jobs"] == 1
    assert mean["policy"] == "ours" and mean["cost_ratio"] is None
    assert spread(runs).splitlines()[2] == "| s | ours | 2.00 (1.00 to 3.00) | 10 (10 to 10) |"
