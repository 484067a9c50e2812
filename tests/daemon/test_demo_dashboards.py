"""The two demos' dashboards off a terminal (a CI log, a pipe): plain lines, the periodic one at most every
`plain_every` seconds, and the clusters demo's events each printed once. (The live view is rendered in
test_pool_views.py.)

The dashboards read a stepped clock that starts near 0, as the monotonic clock of a freshly booted
machine does: the first periodic line must not wait for `plain_every` seconds of uptime."""

from __future__ import annotations

import pytest
from rich.console import Console

from swarm_autoscaler_lab.demo.clusters_view import ClustersDashboard, ClustersView, UserRun
from swarm_autoscaler_lab.demo.dashboard import Dashboard, View


class SteppedClock:
    def __init__(self, start: float = 5.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_the_demo_dashboard_prints_a_progress_line_at_most_every_plain_every(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = SteppedClock()
    view = View(elapsed=3.0, buckets={"active": 2, "drained": 0}, workers=2, done=5, total=9, pool=["warm"])
    with Dashboard(Console(), plain_every=3600.0, clock=clock) as dash:
        assert not dash.live_mode  # pytest captures stdout: not a terminal
        dash.update(view)
        clock.now += 3599.0
        dash.update(view)  # within plain_every: nothing
        clock.now += 1.0
        view.done = 6
        dash.update(view)  # plain_every later: the next line
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[   3.0s] tasks done 5/9 running 0 pending 0 unplaceable 0 | workers 2 | active=2 | warm",
        "[   3.0s] tasks done 6/9 running 0 pending 0 unplaceable 0 | workers 2 | active=2 | warm",
    ]


def test_the_clusters_dashboard_prints_each_event_once_and_a_line_per_period(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = SteppedClock()
    view = ClustersView(elapsed=1.0, users=[UserRun("user1", "w1", phase="working", tasks=4, done=1)])
    with ClustersDashboard(plain_every=3600.0, clock=clock) as dash:
        view.event("user1 requested a cluster")
        dash.update(view)
        clock.now += 1.0
        view.elapsed = 2.0
        view.event("user1's cluster is running")
        dash.update(view)
        dash.update(view)  # no new event, within plain_every: nothing
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "     1.0s user1 requested a cluster",
        "[   1.0s] instances 0 | user1: working - workers 0 tasks 1/4 cost -",  # no usage read yet
        "     2.0s user1's cluster is running",
    ]
