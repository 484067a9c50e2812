"""The simulator says so when its machines would start later than the maximum start time (the planner
would take them for broken, terminate and relaunch them) instead of letting it happen silently."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from swarm_autoscaler_lab.sim import cli
from swarm_autoscaler_lab.sim.config import load_sim_settings
from swarm_autoscaler_lab.sim.engine import Options, start_time_warnings
from swarm_autoscaler_lab.sim.runner import run_trace
from swarm_autoscaler_lab.sim.trace import Job, write_trace
from swarm_autoscaler_lab.sim.world import Knobs

ENV = (
    "AUTOSCALER_POLL_INTERVAL=10s\n"
    'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {}}\n'
    "AUTOSCALER_EC2_MAX_INSTANCES=2\n"
    "AUTOSCALER_MAX_START_TIME=120s\n"
)


def test_a_late_start_is_warned_about_and_an_in_time_one_is_not(tmp_path: Path) -> None:
    env = tmp_path / "s.env"
    env.write_text(ENV)
    policy = load_sim_settings(str(env)).policy
    assert start_time_warnings(Knobs(join_s=80, join_jitter_s=20, worker_start_s=20), policy) == []
    (warning,) = start_time_warnings(Knobs(join_s=80, join_jitter_s=30, worker_start_s=20), policy)
    assert "130 s exceeds the maximum start time of 120 s" in warning


def test_the_run_and_the_command_carry_the_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = tmp_path / "t.env"
    env.write_text(ENV)
    trace = tmp_path / "t.csv"
    write_trace(trace, [Job(0, 0.0, 30.0, 1, 2, 0)])
    settings = load_sim_settings(str(env))
    run, _ = run_trace([Job(0, 0.0, 30.0, 1, 2, 0)], settings, "ours", Options(10.0, Knobs(100, 30, 20)))
    assert len(run.warnings) == 1
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", "--trace", str(trace), "--json", "--join-s", "100"])
    assert args.handler(args) == 0
    err = capsys.readouterr().err
    assert "simulate: warning: join 100 s + jitter 30 s + worker start 20 s = 150 s exceeds" in err
    quiet = parser.parse_args(["simulate", "--trace", str(trace), "--json", "--join-s", "60"])
    assert quiet.handler(quiet) == 0 and "warning" not in capsys.readouterr().err


def test_the_first_tick_can_fall_later_as_a_live_autoscaler_reacts(tmp_path: Path) -> None:
    """`first_tick_s` models how long an autoscaler takes to act on work submitted at t=0 (the fidelity
    bench measured about 0.5 s for the daemon and 1 s for dask's Adaptive)."""
    from swarm_autoscaler_lab.sim.world import EPOCH

    env = tmp_path / "s.env"
    env.write_text(ENV)
    settings = load_sim_settings(str(env))
    jobs = [Job(0, 0.0, 30.0, 1, 2, 0)]
    for first in (0.0, 0.5):
        run, _ = run_trace(jobs, settings, "ours", Options(10.0, Knobs(60, 0, 5), first_tick_s=first))
        assert [i.launched_at - EPOCH for i in run.world.instances.values()] == [first]
