"""PNGs (matplotlib, Agg backend): the timeline of a run (tasks on top, machines below), and a sweep's
cost against p95 wait."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from swarm_autoscaler_lab.sim.engine import Run
from swarm_autoscaler_lab.sim.sweep import Point


def plot_run(run: Run, path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t / 60.0 for s in run.samples]
    fig, (tasks, machines) = plt.subplots(2, 1, sharex=True, figsize=(11, 6.5), constrained_layout=True)
    tasks.plot(t, [s.pending for s in run.samples], label="pending tasks (unrunnable + waiting)")
    tasks.plot(t, [s.running for s in run.samples], label="running tasks")
    tasks.set_ylabel("tasks")
    tasks.legend(loc="upper right")
    tasks.set_title(title or f"policy: {run.strategy}")
    series = {
        "booting": [s.booting for s in run.samples],
        "active": [s.active for s in run.samples],
        "drained": [s.drained for s in run.samples],
        "shutting down": [s.stopping for s in run.samples],
    }
    machines.stackplot(t, *series.values(), labels=list(series), step="post")
    machines.axhline(
        run.policy.max_instances, color="red", linestyle="--", linewidth=1, label="max instances"
    )
    machines.set_ylabel("instances")
    machines.set_xlabel("minutes")
    machines.legend(loc="upper right")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sweep(points: Sequence[Point], path: str | Path, knob: str, title: str = "") -> None:
    """Cost against p95 wait: "ours" as a line through its knob's values (each labelled), each baseline
    as one marker, and the trace's cost lower bound as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), constrained_layout=True)
    ours = [p for p in points if p.policy == "ours"]
    ax.plot(
        [p.summary["wait_p95_s"] for p in ours], [p.summary["cost_usd"] for p in ours],
        marker="o", label=f"ours over {knob}",
    )  # fmt: skip
    labels: dict[tuple[float, float], list[str]] = {}  # values that gave the same point share a label
    for p in ours:
        labels.setdefault((p.summary["wait_p95_s"], p.summary["cost_usd"]), []).append(str(p.value))
    for xy, values in labels.items():
        ax.annotate(" / ".join(values), xy, textcoords="offset points", xytext=(5, 5), fontsize=8)
    for p, marker in zip([p for p in points if p.policy != "ours"], "s^Dv", strict=False):
        ax.scatter([p.summary["wait_p95_s"]], [p.summary["cost_usd"]], marker=marker, s=60, label=p.policy)
    if points:
        ax.axhline(
            points[0].summary["cost_lb_usd"],
            color="grey",
            linestyle="--",
            linewidth=1,
            label="cost lower bound",
        )
    ax.set_xlabel("p95 wait (s)")
    ax.set_ylabel("cost ($)")
    ax.set_title(title or f"cost against p95 wait over {knob}")
    ax.legend(loc="best")
    fig.savefig(path, dpi=100)
    plt.close(fig)
