"""The demo's live terminal view (rich), degrading to plain progress lines when stdout is not a terminal."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from swarm_autoscaler.core.actions import Launch, Start
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.demo.live import LiveDashboard


@dataclass
class View:
    """What the dashboard shows; updated by the demo after each tick."""

    elapsed: float = 0.0
    buckets: Mapping[str, int] = field(default_factory=dict)
    types: Mapping[str, int] = field(default_factory=dict)
    workers: int = 0
    pending: int = 0
    running: int = 0
    done: int = 0
    total: int = 0
    unplaceable: int = 0
    pool: list[str] = field(default_factory=list)  # warm pool lines (`commands.pool_lines`)
    actions: deque[str] = field(default_factory=lambda: deque(maxlen=8))

    def record_actions(self, result: TickResult, elapsed: float) -> None:
        for outcome in result.outcomes:
            action = outcome.action
            what = outcome.action_kind
            if isinstance(action, Launch):
                what = f"Launch {action.count}x{action.type_name}" + (" into the pool" if action.pool else "")
            elif isinstance(action, Start):
                what = f"Start {len(action.instance_ids)}x{action.type_name} from the pool"
            status = "ok" if outcome.ok else f"FAILED ({outcome.detail})"
            self.actions.append(f"{elapsed:6.1f}s {what}: {action.reason} -> {status}")


class Dashboard(LiveDashboard[View]):
    """The single-cluster demo's dashboard: fleet, types, tasks, warm pool and the last actions."""

    def render(self, view: View) -> Group:
        return render(view)

    def plain(self, view: View) -> None:
        if not self.due():
            return
        buckets = " ".join(f"{k}={v}" for k, v in sorted(view.buckets.items()) if v)
        pool = "".join(f" | {line}" for line in view.pool)
        print(
            f"[{view.elapsed:6.1f}s] tasks done {view.done}/{view.total} running {view.running} "
            f"pending {view.pending} unplaceable {view.unplaceable} | workers {view.workers} | {buckets}"
            f"{pool}",
            flush=True,
        )


def render(view: View) -> Group:
    fleet = Table(title="fleet", expand=True)
    fleet.add_column("bucket")
    fleet.add_column("machines", justify="right")
    for name, count in sorted(view.buckets.items()):
        fleet.add_row(name, str(count))
    types = Table(title="instances by type", expand=True)
    types.add_column("type")
    types.add_column("live", justify="right")
    for name, count in sorted(view.types.items()):
        types.add_row(name, str(count))
    tasks = Table(title="tasks", expand=True)
    for col in ("done", "running", "pending", "unplaceable", "workers"):
        tasks.add_column(col, justify="right")
    tasks.add_row(
        f"{view.done}/{view.total}",
        str(view.running),
        str(view.pending),
        str(view.unplaceable),
        str(view.workers),
    )
    actions = Panel("\n".join(view.actions) or "(none yet)", title="last actions and their reasons")
    header = Panel(f"swarm-autoscaler demo - {view.elapsed:.1f}s", style="bold")
    grid = Table.grid(expand=True)
    grid.add_row(fleet, types, tasks)
    if view.pool:
        return Group(header, grid, Panel("\n".join(view.pool), title="warm pool and base"), actions)
    return Group(header, grid, actions)
