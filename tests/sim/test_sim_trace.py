"""Trace files: parsing, line-numbered errors, round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.sim.report import cost_lb, percentile
from swarm_autoscaler_lab.sim.trace import Job, TraceError, format_trace, parse_trace, read_trace

HEADER = "submit_s,duration_s,cpus,ram_gib,gpus,instance_type\n"


def test_parses_rows_sorted_by_submit_time_with_pinning() -> None:
    jobs = parse_trace(HEADER + "30,60,1,2,0,\n0,10.5,4,1.5,1,g4dn.xlarge\n")
    assert [(j.submit_s, j.duration_s, j.instance_type) for j in jobs] == [
        (0.0, 10.5, "g4dn.xlarge"),
        (30.0, 60.0, None),
    ]
    assert jobs[0].task().needs.ram == round(1.5 * GIB) and jobs[0].task().pinned_type == "g4dn.xlarge"
    assert len({j.key for j in jobs}) == 2


def test_columns_may_come_in_any_order() -> None:
    jobs = parse_trace("instance_type,gpus,ram_gib,cpus,duration_s,submit_s\nm5.large,0,2,1,60,5\n")
    assert jobs == (Job(0, 5.0, 60.0, 1.0, 2.0, 0, "m5.large"),)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("0,60,1,2,0,\n5,abc,1,2,0,\n", "t.csv:3: duration_s='abc' is not a number"),
        ("0,60,1,2,0,\n0,60,-1,2,0,\n", "t.csv:3: cpus='-1' must be a non-negative number"),
        ("0,0,1,2,0,\n", "t.csv:2: duration_s='0' must be a positive number"),
        ("0,60,1,2,0.5,\n", "t.csv:2: gpus='0.5' must be a whole number"),
        ("0,60,1,2\n", "t.csv:2: expected 6 fields, got 4"),
        ("0,60,0,0,0,\n", "t.csv:2: a job must need some cpus, ram_gib or gpus"),
        ("0,nan,1,2,0,\n", "t.csv:2: duration_s='nan' must be a positive number"),
    ],
)
def test_bad_rows_name_the_line(body: str, message: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace(HEADER + body, "t.csv")
    assert str(info.value) == message


def test_bad_header_and_missing_file() -> None:
    with pytest.raises(TraceError, match=r"t\.csv:1: header is 'submit,duration'"):
        parse_trace("submit,duration\n1,2\n", "t.csv")
    with pytest.raises(TraceError, match=r"t\.csv:1: empty file"):
        parse_trace("", "t.csv")
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace("/nonexistent/trace.csv")


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    jobs = parse_trace(HEADER + "0,60,1,2,0,\n1.5,30,2,8,1,g4dn.xlarge\n")
    path = tmp_path / "t.csv"
    path.write_text(format_trace(jobs))
    assert read_trace(path) == jobs


def _check_heavy_tailed(jobs: tuple[Job, ...], settings: Any) -> None:
    """The heavy-tailed mix as specified: 2,000 jobs over 4 hours, durations with a median of about
    one minute and a long tail, shapes 1 CPU / 2 GiB to 8 CPU / 30 GiB, about 5% on a GPU, seven types
    from t3.medium to g4dn.xlarge, max 40."""
    assert len(jobs) == 2000 and max(j.submit_s for j in jobs) <= 4 * 3600
    durations = [j.duration_s for j in jobs]
    assert 50 <= percentile(durations, 50) <= 75 and percentile(durations, 99) > 20 * 60
    assert {(j.cpus, j.ram_gib) for j in jobs if not j.gpus} >= {(1.0, 2.0), (8.0, 30.0)}
    assert 0.03 <= sum(1 for j in jobs if j.gpus) / len(jobs) <= 0.07
    names = [t.name for t in settings.policy.allowed_types]
    assert len(names) == 7 and names[0] == "t3.medium" and names[-1] == "g4dn.xlarge"
    assert settings.policy.max_instances == 40
    # every job fits some allowed type, so the lower bound counts every job
    assert all(cost_lb((j,), settings.policy, settings.catalogue) > 0 for j in jobs)


def test_bundled_scenarios_parse_and_have_settings() -> None:
    from swarm_autoscaler_lab.sim.config import load_sim_settings

    root = Path(__file__).parents[2] / "scenarios"
    names = sorted(p.stem for p in root.glob("*.csv"))
    assert names == [
        "burst500",
        "day_cycle",
        "gpu_surge",
        "gpu_whole_surge",
        "heavy_tailed",
        "pinned_mix",
        "short_stream",
        "trickle",
    ]
    for name in names:
        assert read_trace(root / f"{name}.csv")
        assert load_sim_settings(root / f"{name}.env").policy.allowed_types
    assert len(read_trace(root / "burst500.csv")) == 500
    assert load_sim_settings(root / "burst500.env").policy.max_instances == 40
    _check_heavy_tailed(read_trace(root / "heavy_tailed.csv"), load_sim_settings(root / "heavy_tailed.env"))
    from swarm_autoscaler_lab.sim.workloads import SCENARIOS

    for name, (generate, env) in SCENARIOS.items():  # the files are what the generators write
        assert read_trace(root / f"{name}.csv") == generate()
        assert (root / f"{name}.env").read_text() == env
