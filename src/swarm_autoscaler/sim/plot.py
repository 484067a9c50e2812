"""The timeline of a run as a PNG (matplotlib, Agg backend): tasks on top, machines below."""

from __future__ import annotations

from pathlib import Path

from swarm_autoscaler.sim.engine import Run


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
