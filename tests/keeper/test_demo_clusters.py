"""`swarm-autoscaler demo --clusters N`: its argument checks and its users' workloads (the run itself is
the e2e test `tests/e2e/test_keeper_demo.py`)."""

from __future__ import annotations

import pytest

from swarm_autoscaler.cli import EXIT_CONFIGURATION, main
from swarm_autoscaler_lab.demo.clusters import ClustersOptions, summary_lines, user_work


@pytest.mark.parametrize("argv", [["--clusters", "2", "--swarm"], ["--clusters", "-1"]])
def test_clusters_with_a_real_swarm_or_a_negative_count_is_refused_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *argv]) == EXIT_CONFIGURATION
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--clusters" in err


def test_each_user_brings_more_work_than_the_one_before_and_fast_work_is_shorter() -> None:
    sizes = [len(user_work(i, fast=False, seed=7)) for i in range(3)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert max(user_work(2, fast=True, seed=7)) < max(user_work(2, fast=False, seed=7))
    assert ClustersOptions(fast=True).idle_timeout_s < ClustersOptions().idle_timeout_s


def test_the_summary_names_every_figure_and_every_error() -> None:
    result = {
        "clusters": 3,
        "clusters_created": 3,
        "clusters_ended": 2,
        "tasks_done": 20,
        "tasks": 24,
        "peak_workers": {"user1": 2},
        "wallet_cost_usd": {"user1/w1": 0.0123},
        "launches": 9,
        "terminations": 8,
        "final_instances": 1,
        "wall_s": 31.5,
        "errors": {"user3": "RuntimeError: cluster failed"},
    }
    text = "\n".join(summary_lines(result))
    assert "clusters ended        2" in text and "final instances       1" in text
    assert "user3: RuntimeError: cluster failed" in text
    assert "cost per wallet (USD) {'user1/w1': 0.0123}" in text
