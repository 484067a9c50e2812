"""A recorded timeline of a run (demo or daemon): one sample per tick, drawn to a PNG with matplotlib."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    pending: int
    running: int
    instances: Mapping[str, int]


@dataclass
class Timeline:
    samples: list[Sample] = field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def draw(self, path: Path, title: str) -> Path:
        """Write a two-panel PNG: tasks (pending, running) and instances by lifecycle bucket."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ts = [s.t for s in self.samples]
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        top.plot(ts, [s.pending for s in self.samples], label="pending tasks", color="tab:red")
        top.plot(ts, [s.running for s in self.samples], label="running tasks", color="tab:green")
        top.set_ylabel("tasks")
        top.legend(loc="upper right")
        top.set_title(title)
        states = sorted({k for s in self.samples for k, v in s.instances.items() if v})
        if states:
            bottom.stackplot(
                ts, [[s.instances.get(k, 0) for s in self.samples] for k in states], labels=states, alpha=0.8
            )
            bottom.legend(loc="upper right", fontsize="small")
        bottom.set_ylabel("machines")
        bottom.set_xlabel("seconds since start")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
