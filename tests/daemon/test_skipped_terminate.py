"""A termination act skips leaves no trace that could end the machine later.

Plan and act over the in-memory fakes (the swarm, EC2 and the scheduler as ports, with a stepped clock):
a machine planned as broken (joined, no worker past its start time) gets its worker, with a task,
between the plan and act; act skips the Terminate on its fresh re-check. Before the fix the plan's
"terminating" mark (`termination_started`) was written in act's gentle phase anyway, so the node
stayed in the terminating bucket, and once `termination_delay` had passed the follow-up "termination
requested earlier did not take" ended the machine, now healthy and idle, with only its idle and
ownership checks (seen in a chaos run). Now the mark rides in the Terminate and is written only when
the termination goes ahead (right before TerminateInstances), and a stale mark on a node that serves
work is cleared instead of asked again.
"""

from __future__ import annotations

import dataclasses

from tests.daemon.test_act import CLUSTER, World, terminated
from tests.fakes import small_policy

from swarm_autoscaler.core.actions import NodeUpdate, Plan, Terminate
from swarm_autoscaler.core.model import NodeMarks
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.daemon.act import ActConfig, act

POLICY = small_policy(4)


async def tick(w: World) -> Plan:
    """One plan on what the world is now, carried out."""
    planned = plan(w.snapshot(), POLICY)
    await act(planned, w.snapshot(), w.ports, config=ActConfig(CLUSTER))
    return planned


async def test_a_skipped_termination_writes_no_mark_and_the_machine_is_not_ended_later() -> None:
    w = World()
    node_id, _ = w.machine(9, worker=False)  # joined 600 s ago, no worker: broken (max_start_time 300 s)
    snapshot = w.snapshot()
    planned = plan(snapshot, POLICY)
    (broken,) = planned.of_kind(Terminate)
    assert broken.reason.startswith("broken")
    w.workload.connect(World.worker(9, tasks=1))  # its worker connects, with a task, before act runs
    outcomes = await act(planned, snapshot, w.ports, config=ActConfig(CLUSTER))
    (skipped,) = [o for o in outcomes if isinstance(o.action, Terminate)]
    assert skipped.kind == "skipped" and terminated(w) == []
    assert w.swarm.nodes[node_id].marks.termination_started is None  # the fix: no mark left behind
    # It works, then idles; the termination delay passes: a healthy idle machine is not ended (it is
    # only found empty now; scale-down drains it, if ever, after drain_delay, by its own rules).
    w.workload.workers = [World.worker(9)]
    w.clock.step(POLICY.termination_delay)
    later = await tick(w)
    assert not later.of_kind(Terminate) and terminated(w) == [] and node_id in w.swarm.nodes


async def test_a_stale_terminating_mark_on_a_node_that_serves_work_is_cleared_not_asked_again() -> None:
    """A node marked terminating long ago (by a skipped termination of an older version, or one whose
    TerminateInstances was cut short) that is ready, active and has a connected worker is a healthy
    machine: its mark is cleared and the plan decides from what it is."""
    w = World()
    node_id, _ = w.machine(9)
    stale = NodeMarks(ready=True, termination_started=w.clock.now - 10 * POLICY.termination_delay)
    w.swarm.nodes[node_id] = dataclasses.replace(w.swarm.nodes[node_id], marks=stale)
    planned = await tick(w)
    assert not planned.of_kind(Terminate) and terminated(w) == []
    (update,) = planned.of_kind(NodeUpdate)
    assert isinstance(update, NodeUpdate) and update.marks is not None
    assert update.marks.termination_started is None
    assert w.swarm.nodes[node_id].marks.termination_started is None


async def test_a_termination_that_goes_ahead_marks_its_node_first() -> None:
    """The mark's purpose is kept: it is written before TerminateInstances (a restart during a slow
    call sees the machine as terminating), and its node is then removed."""
    w = World()
    node_id, _ = w.machine(9, worker=False)
    seen: list[float | None] = []
    real = w.cloud.terminate

    async def terminate(ids: object) -> None:
        seen.append(w.swarm.nodes[node_id].marks.termination_started)
        await real(ids)  # type: ignore[arg-type]

    w.cloud.terminate = terminate  # type: ignore[method-assign]
    planned = await tick(w)
    assert planned.of_kind(Terminate) and terminated(w) == ["i-0009"]
    assert seen == [w.clock.now] and node_id not in w.swarm.nodes


async def test_a_failed_termination_takes_its_mark_back() -> None:
    """EC2 refused the call: the mark it was written for is taken back, so the machine is planned
    again from what it is (not asked again with fewer checks)."""
    w = World()
    node_id, _ = w.machine(9, worker=False)
    w.cloud.fail_terminate = RuntimeError("EC2 is down")
    await tick(w)
    assert terminated(w) == ["i-0009"]  # asked, and refused
    assert w.swarm.nodes[node_id].marks.termination_started is None
