"""Each precondition a disruptive action carries, checked against a fresh read: holds, or says why not."""

from __future__ import annotations

import pytest
from tests.builders import hostname, make_node, make_task, make_worker

from swarm_autoscaler.core.actions import (
    Check,
    DrainNode,
    HostIdle,
    NodeDown,
    NodeOurs,
    NoTasks,
    NothingWaits,
    NotJoined,
    NoWorker,
    Retired,
    Terminate,
)
from swarm_autoscaler.core.model import NodeStatus, Task
from swarm_autoscaler.core.recheck import Fresh, violated, violations

H1 = hostname(1)
RUNNING = Task("r", make_task().needs, executing=True)
WAITING = make_task("w")


def fresh(*, nodes: tuple = (), workers: tuple = ()) -> Fresh:  # type: ignore[type-arg]
    return Fresh(tuple(nodes), tuple(workers))


CASES: list[tuple[str, Check, Fresh, bool]] = [
    ("idle host", HostIdle(H1), fresh(workers=(make_worker(1),)), True),
    ("no worker at all is idle", HostIdle(H1), fresh(), True),
    ("running task", HostIdle(H1), fresh(workers=(make_worker(1, processing=[RUNNING]),)), False),
    ("unique result", HostIdle(H1), fresh(workers=(make_worker(1, unique=True),)), False),
    ("other host busy", HostIdle(H1), fresh(workers=(make_worker(2, processing=[RUNNING]),)), True),
    ("results may move", NoTasks(H1), fresh(workers=(make_worker(1, unique=True),)), True),
    (
        "task since the plan",
        NoTasks(H1),
        fresh(workers=(make_worker(1, unique=True, processing=[WAITING]),)),
        False,
    ),
    ("no worker", NoWorker(H1), fresh(nodes=(make_node(1),)), True),
    ("worker connected since", NoWorker(H1), fresh(workers=(make_worker(1),)), False),
    ("not joined", NotJoined(H1), fresh(nodes=(make_node(2),)), True),
    ("joined since", NotJoined(H1), fresh(nodes=(make_node(1),)), False),
    ("ours", NodeOurs("node-1"), fresh(nodes=(make_node(1),)), True),
    ("not ours", NodeOurs("node-1"), fresh(nodes=(make_node(1, ours=False),)), False),
    ("manager", NodeOurs("node-1"), fresh(nodes=(make_node(1, manager=True),)), False),
    ("gone is not confirmed ours", NodeOurs("node-1"), fresh(), False),
    ("down", NodeDown("node-1"), fresh(nodes=(make_node(1, status=NodeStatus.DOWN),)), True),
    ("gone counts as down", NodeDown("node-1"), fresh(), True),
    ("ready again", NodeDown("node-1"), fresh(nodes=(make_node(1),)), False),
    ("only running", NothingWaits(H1), fresh(workers=(make_worker(1, processing=[RUNNING]),)), True),
    ("a task waits", NothingWaits(H1), fresh(workers=(make_worker(1, processing=[WAITING]),)), False),
    ("retiring", Retired(H1), fresh(workers=(make_worker(1, retiring=True),)), True),
    ("worker left", Retired(H1), fresh(), True),
    ("kept by the scheduler", Retired(H1), fresh(workers=(make_worker(1),)), False),
]


@pytest.mark.parametrize(("name", "check", "read", "holds"), CASES, ids=[c[0] for c in CASES])
def test_each_check(name: str, check: Check, read: Fresh, holds: bool) -> None:
    reason = violated(check, read)
    assert (reason is None) == holds, reason
    if not holds:
        assert reason  # says why, for the log line of the skipped action


def test_an_action_collects_every_failed_check() -> None:
    action = Terminate(("i-0001",), "surplus", ("node-1",), expect=(HostIdle(H1), NodeOurs("node-1")))
    read = fresh(nodes=(make_node(1, ours=False),), workers=(make_worker(1, unique=True),))
    assert len(violations(action, read)) == 2
    assert violations(action, fresh(nodes=(make_node(1),), workers=(make_worker(1),))) == ()


def test_an_action_without_expectations_always_holds() -> None:
    assert violations(DrainNode("node-1", H1, "why"), fresh()) == ()
