"""The README's comparison table: every policy on every bundled scenario, as Markdown.

    .venv/bin/python -m swarm_autoscaler.sim.table [SCENARIOS_DIR]

Each scenario is `NAME.csv` with its settings in `NAME.env`. After the table, the targets for "ours"
are checked and every miss is listed (exit status 1 when any is missed).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .config import load_sim_settings
from .runner import POLICIES, run_trace
from .trace import read_trace

COLUMNS = (
    ("completed", "completed_jobs"),
    ("p50 wait s", "wait_p50_s"),
    ("p95 wait s", "wait_p95_s"),
    ("cost $", "cost_usd"),
    ("cost / LB", "cost_ratio"),
    ("makespan / LB", "makespan_ratio"),
    ("launches", "launches"),
    ("peak", "peak_instances"),
    ("busy terminations", "busy_terminations"),
    ("above max", "max_exceeded"),
)


def run_all(directory: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """scenario -> policy -> summary."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for trace in sorted(directory.glob("*.csv")):
        jobs = read_trace(trace)
        settings = load_sim_settings(trace.with_suffix(".env"))
        out[trace.stem] = {p: run_trace(jobs, settings, p)[1] for p in POLICIES}
    return out


def markdown(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    head = ["scenario", "policy", *(name for name, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for scenario, by_policy in results.items():
        for policy, s in by_policy.items():
            cells = [scenario, policy, *(_cell(s[key], key) for _, key in COLUMNS)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: object, key: str = "") -> str:
    if isinstance(value, float):
        if key == "cost_usd":  # cents matter when two policies are close
            return f"{value:.2f}"
        return f"{value:.3f}" if value < 10 else f"{value:.0f}"
    return "-" if value is None else str(value)


def misses(results: Mapping[str, Mapping[str, Mapping[str, Any]]], burst: str = "burst500") -> list[str]:
    """The targets for "ours" that a run missed, one line each."""
    out = []
    for scenario, by in results.items():
        ours, rule, static = by["ours"], by["queue-rule"], by["static"]
        if ours["busy_terminations"] or ours["max_exceeded"]:
            out.append(
                f"{scenario}: busy terminations {ours['busy_terminations']}, above max {ours['max_exceeded']}"
            )
        if ours["completed_jobs"] != ours["jobs"]:
            out.append(f"{scenario}: only {ours['completed_jobs']}/{ours['jobs']} jobs completed")
        if ours["wait_p95_s"] > rule["wait_p95_s"]:
            out.append(f"{scenario}: p95 wait {ours['wait_p95_s']} > queue rule's {rule['wait_p95_s']}")
        if ours["cost_usd"] > rule["cost_usd"]:
            out.append(f"{scenario}: cost {ours['cost_usd']} > queue rule's {rule['cost_usd']}")
        if ours["cost_usd"] >= static["cost_usd"]:
            out.append(f"{scenario}: cost {ours['cost_usd']} not below static's {static['cost_usd']}")
    if burst in results and (results[burst]["ours"]["cost_ratio"] or 0) > 1.3:
        out.append(f"{burst}: cost {results[burst]['ours']['cost_ratio']} x its lower bound > 1.3")
    return out


def main(argv: Sequence[str]) -> int:
    directory = Path(argv[0]) if argv else Path("scenarios")
    results = run_all(directory)
    print(markdown(results))
    missed = misses(results)
    for line in missed:
        print(f"target missed: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
