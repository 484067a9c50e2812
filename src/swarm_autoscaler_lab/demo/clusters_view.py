"""The live view of `swarm-autoscaler demo --clusters N`: one row per user's cluster (rich), degrading to
plain progress lines when stdout is not a terminal."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from swarm_autoscaler_lab.demo.live import LiveDashboard


@dataclass
class UserRun:
    """One user's session as the dashboard shows it. `phase`: waiting, requesting, starting, working,
    idle (its work done, heartbeats stopped), ended, failed."""

    user: str
    wallet: str
    phase: str = "waiting"
    state: str = "-"
    cluster_id: str = ""
    created: bool = False
    ended: bool = False
    tasks: int = 0
    done: int = 0
    workers: int = 0
    peak_workers: int = 0
    running_after_s: float | None = None
    ended_after_s: float | None = None
    error: str = ""
    cost_usd: float | None = None  # the wallet's spend so far (the keeper's GET /v1/usage)


@dataclass
class ClustersView:
    elapsed: float = 0.0
    users: list[UserRun] = field(default_factory=list)
    instances: int = 0
    launched: int = 0
    events: deque[str] = field(default_factory=lambda: deque(maxlen=10))

    printed: int = 0  # events printed so far (plain mode)
    total_events: int = 0

    def event(self, text: str) -> None:
        self.events.append(f"{self.elapsed:6.1f}s {text}")
        self.total_events += 1


class ClustersDashboard(LiveDashboard[ClustersView]):
    """The clusters demo's dashboard: a row per user's cluster and the keeper's latest events; in plain
    mode every event once, as it comes, and a line per user every `plain_every` seconds."""

    def render(self, view: ClustersView) -> Group:
        return render(view)

    def plain(self, view: ClustersView) -> None:
        fresh = min(view.total_events - view.printed, len(view.events))
        for line in list(view.events)[len(view.events) - fresh :]:
            print(f"  {line}", flush=True)
        view.printed = view.total_events
        if self.due():
            users = " | ".join(
                f"{u.user}: {u.phase} {u.state} workers {u.workers} tasks {u.done}/{u.tasks} cost {_usd(u.cost_usd)}"
                for u in view.users
            )
            print(f"[{view.elapsed:6.1f}s] instances {view.instances} | {users}", flush=True)


def render(view: ClustersView) -> Group:
    table = Table(title="on-demand clusters", expand=True)
    for column in (
        "user",
        "wallet",
        "phase",
        "state",
        "cluster",
        "workers (peak)",
        "tasks",
        "running at",
        "ended at",
        "wallet cost",
    ):
        table.add_column(column)
    for u in view.users:
        table.add_row(
            u.user,
            u.wallet,
            u.phase,
            u.state,
            u.cluster_id or "-",
            f"{u.workers} ({u.peak_workers})",
            f"{u.done}/{u.tasks}",
            _seconds(u.running_after_s),
            _seconds(u.ended_after_s),
            _usd(u.cost_usd),
        )
    header = Panel(
        f"swarm-autoscaler demo --clusters {len(view.users)} - {view.elapsed:.1f}s - "
        f"live instances {view.instances} (launched {view.launched})",
        style="bold",
    )
    events = Panel("\n".join(view.events) or "(none yet)", title="keeper API and lifecycle")
    return Group(header, table, events)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"
