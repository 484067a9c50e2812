"""`simulate --sweep KNOB=v1,v2,...`: parsing, the settings each value gives, and the output of a small run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from swarm_autoscaler.config.settings import InvalidSettingsError
from swarm_autoscaler_lab.sim import cli
from swarm_autoscaler_lab.sim.sweep import Point, Sweep, covered, parse_sweep, variant_env, variants
from swarm_autoscaler_lab.sim.trace import Job, write_trace

ENV = (
    "AUTOSCALER_POLL_INTERVAL=10s\n"
    'AUTOSCALER_EC2_ALLOWED_TYPES={"m5.large": {}, "m5.xlarge": {"reserve": 1}}\n'
    "AUTOSCALER_EC2_MAX_INSTANCES=4\n"
)
# Eight one-CPU jobs of about five minutes, one every 20 s: two m5.large hold them all at once.
JOBS = tuple(Job(i, 20.0 * i, 300.0 + 10 * i, 1.0, 2.0, 0) for i in range(8))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser


@pytest.mark.parametrize(
    ("text", "variable", "values"),
    [
        ("TOLERATED_WAIT=0s,2m,5m", "AUTOSCALER_TOLERATED_WAIT", ("0s", "2m", "5m")),
        ("AUTOSCALER_DRAIN_DELAY=30s, 60s", "AUTOSCALER_DRAIN_DELAY", ("30s", "60s")),
        ("ec2_max_instances=2", "AUTOSCALER_EC2_MAX_INSTANCES", ("2",)),
        ("consolidate_below=0,0.5", "AUTOSCALER_CONSOLIDATE_BELOW", ("0", "0.5")),
    ],
)
def test_a_setting_is_named_with_or_without_its_prefix_in_any_case(
    text: str, variable: str, values: tuple[str, ...]
) -> None:
    parsed = parse_sweep(text)
    assert (parsed.variable, parsed.values, parsed.field, parsed.type_name) == (variable, values, None, None)


def test_a_per_type_field_is_swept_on_every_type_or_on_one() -> None:
    every = parse_sweep("reserve=0,1")
    assert (every.variable, every.field, every.type_name) == ("AUTOSCALER_EC2_ALLOWED_TYPES", "reserve", None)
    one = parse_sweep("reserve@m5.xlarge=0,2")
    assert (one.field, one.type_name, one.values, one.knob) == (
        "reserve",
        "m5.xlarge",
        ("0", "2"),
        "reserve@m5.xlarge",
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("TOLERATED_WAIT", "expected KNOB=VALUE,VALUE,..."),
        ("TOLERATED_WAIT=", "no empty value"),
        ("TOLERATED_WAIT=1m,,2m", "no empty value"),
        ("=1,2", "expected KNOB"),
        ("DASK_SCHEDULER_URL=a,b", "not a setting the simulator reads"),
        ("EC2_ALLOWED_TYPES={},{}", "not a setting the simulator reads"),
        ("tolerated_wait@m5.large=1m", "FIELD@TYPE takes a per-type field"),
        ("ami_id=ami-1", "not a setting the simulator reads"),
    ],
)
def test_a_bad_sweep_is_a_usage_error_with_exit_2(
    text: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says.replace(".", r"\.")):
        parse_sweep(text)
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["simulate", "--trace", "t.csv", "--sweep", text])
    assert info.value.code == 2
    assert says in capsys.readouterr().err


def test_each_value_is_set_last_in_the_base_file_and_read_back(tmp_path: Path) -> None:
    base = tmp_path / "base.env"
    base.write_text(ENV + "AUTOSCALER_TOLERATED_WAIT=1m\n")
    runs = variants(str(base), parse_sweep("TOLERATED_WAIT=0s,5m"))
    assert [(v, s.policy.tolerated_wait) for v, s in runs] == [("0s", 0.0), ("5m", 300.0)]
    reserves = variants(str(base), parse_sweep("reserve@m5.large=0,2"))
    assert [[(t.name, t.reserve) for t in s.policy.allowed_types] for _, s in reserves] == [
        [("m5.large", 0), ("m5.xlarge", 1)],
        [("m5.large", 2), ("m5.xlarge", 1)],  # the other type keeps its reserve
    ]
    every = variants(str(base), parse_sweep("reserve=0"))
    assert [t.reserve for t in every[0][1].policy.allowed_types] == [0, 0]
    assert (
        variant_env("", Sweep("X", ("1",), "AUTOSCALER_POLL_INTERVAL"), "1s")
        == "AUTOSCALER_POLL_INTERVAL='1s'\n"
    )


def test_values_the_daemon_would_refuse_are_all_reported_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base.env"
    base.write_text(ENV)
    with pytest.raises(InvalidSettingsError) as info:
        variants(str(base), parse_sweep("TOLERATED_WAIT=soon,1m,never"))
    assert len(info.value.problems) == 2
    assert all(p.startswith("--sweep TOLERATED_WAIT=soon: ") for p in info.value.problems[:1])
    with pytest.raises(InvalidSettingsError, match=r"m5\.huge is not allowed \(m5\.large, m5\.xlarge\)"):
        variants(str(base), parse_sweep("reserve@m5.huge=1"))
    with pytest.raises(InvalidSettingsError, match="must be at least the sum of the reserves"):
        variants(str(base), parse_sweep("reserve=3"))  # 2 types x 3 > max 4
    monkeypatch.setenv("AUTOSCALER_TOLERATED_WAIT", "1m")
    with pytest.raises(InvalidSettingsError, match="set in the environment"):
        variants(str(base), parse_sweep("TOLERATED_WAIT=0s"))


def _trace(tmp_path: Path) -> Path:
    trace = tmp_path / "t.csv"
    write_trace(trace, JOBS)
    (tmp_path / "t.env").write_text(ENV)
    return trace


def test_sweep_json_and_plot_on_a_small_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "sweep.png"
    args = _parser().parse_args(
        [
            "simulate",
            "--trace",
            str(_trace(tmp_path)),
            "--sweep",
            "EC2_MAX_INSTANCES=1,4",
            "--json",
            "--plot",
            str(png),
        ]
    )
    assert args.handler(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["knob"], out["variable"]) == ("EC2_MAX_INSTANCES", "AUTOSCALER_EC2_MAX_INSTANCES")
    points = out["points"]
    assert [(p["policy"], p["value"]) for p in points] == [
        ("ours", "1"),
        ("ours", "4"),
        ("queue-rule", None),
        ("adaptive", None),
        ("static", None),
    ]
    assert all(p["completed_jobs"] == 8 and p["busy_terminations"] == 0 for p in points)
    one, four = points[0], points[1]
    # the knob reaches the run: one machine holds two jobs at a time, so the jobs queue behind it
    assert one["peak_instances"] == 1 and four["peak_instances"] > 1
    assert one["wait_p95_s"] > four["wait_p95_s"] and one["makespan_s"] > four["makespan_s"]
    assert (
        all(p["max_exceeded"] == 0 for p in points[2:]) and max(p["peak_instances"] for p in points[2:]) <= 4
    )
    assert out["covered"] == covered([Point(p["policy"], p["value"], p) for p in points])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_table_names_the_knob_values_and_what_covers_each_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args(
        ["simulate", "--trace", str(_trace(tmp_path)), "--sweep", "drain_delay=30s,2m"]
    )
    assert args.handler(args) == 0
    text = capsys.readouterr().out
    assert "ours over drain_delay" in text
    lines = [line for line in text.splitlines() if "│" in line]
    cells = [[c.strip() for c in line.split("│")[1:3]] for line in lines]
    assert cells == [
        ["ours", "30s"],
        ["ours", "2m"],
        ["queue-rule", "base"],
        ["adaptive", "base"],
        ["static", "base"],
    ]
    assert "values of ours at least as cheap as each baseline" in text.replace("\n", " ")


def test_sweep_runs_ours_only_and_reports_bad_values_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = str(_trace(tmp_path))
    args = _parser().parse_args(
        ["simulate", "--trace", trace, "--sweep", "TOLERATED_WAIT=1m", "--policy", "static"]
    )
    assert args.handler(args) == 2
    assert "--sweep runs ours" in capsys.readouterr().err
    args = _parser().parse_args(["simulate", "--trace", trace, "--sweep", "TOLERATED_WAIT=1m,later"])
    assert args.handler(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("configuration error: --sweep TOLERATED_WAIT=later: AUTOSCALER_TOLERATED_WAIT")


def test_covered_lists_the_values_at_least_as_cheap_and_as_quick_as_each_baseline() -> None:
    def point(policy: str, value: str | None, cost: float, p95: float) -> Point:
        summary: dict[str, Any] = {"cost_usd": cost, "wait_p95_s": p95}
        return Point(policy, value, summary)

    points = [
        point("ours", "a", 10.0, 100.0),
        point("ours", "b", 8.0, 300.0),
        point("queue-rule", None, 9.0, 300.0),
        point("adaptive", None, 8.0, 50.0),
        point("static", None, 10.0, 100.0),
    ]
    assert covered(points) == {"queue-rule": ["b"], "adaptive": [], "static": ["a"]}  # ties count
