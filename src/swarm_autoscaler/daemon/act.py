"""Carrying a plan out: a generic executor of the table of kinds (`core.kinds`: phase, lane, re-check,
batching), concurrently within a bound, by a deadline, re-checking every disruptive action against a
fresh read right before it runs. act decides nothing about a node: each node update (marks, labels,
availability) is written as the plan states it (`core.updates`).

1. **Gentle actions first** (activations, uncordons, launches, and the marks and labels of nodes that
   have another action in the plan): nothing they do can hurt a busy machine, and they make the world
   more like the plan assumes.
2. **Fresh read, then retirements.** One node listing and one scheduler read of the workers, taken
   after phase 1 (`Orchestrator.list_nodes`, `Workload.list_workers`). Every RetireWorkers whose `expect`
   fails on it (`core.recheck`) is skipped; the others run. A worker the scheduler kept (it holds the
   only copy of a result) cancels its node's drain and termination in this same act.
3. **Read again if a retirement ran, then drains, cordons, terminations and removals**, each re-checked
   on the latest read; so is the activation of a node that joined paused (`Policy.join_paused`),
   whose labels phase 1 wrote. A drain carries its node's marks (written with its availability in ONE
   node update, skipped with it);
   a termination its node's `termination_started` (written once it passed its fence, right before the
   EC2 call; taken back if the call fails): a skipped termination leaves no mark.
   Terminations are batched into ONE `Cloud.terminate` call; node updates run concurrently (one node's
   actions always run one after another, in plan order).
4. **Terminations are fenced first** (`fencing`): their hosts are fenced in one scheduler call (no
   worker there, connected now or later, gets a task any more), each Terminate is re-checked on the
   workers the fence saw, and only then does the batch go to EC2. A skipped or failed termination lifts
   its host's fence.

**Bookkeeping lane.** The NodeUpdate of a node with nothing else in the plan runs beside the three
phases, in their own lane (`jobs`): they never hold a slot a
retirement or a drain is waiting for.

An action is skipped (outcome kind "skipped", with every reason) when its precondition no longer holds
or when the fresh read failed (fail closed). Outcomes come back in plan order.

Bounds and progress (`jobs`): at most `ActConfig.concurrency` safety jobs (and half as many bookkeeping
jobs) are in flight at once. The deadline stops starting new work (kind "deadline", left to the next
tick); a job already running is cut only one deadline later, the hard stop (also "deadline", saying it
may have taken effect), except launches and the termination batch, which always run to their end. Each
phase starts its first wave even past the deadline, oldest waiting actions first.
Cancelling `act` itself (SIGTERM) cancels everything in flight at once; whoever acts next plans again.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Action, NodeUpdate, Plan, Stop, Terminate
from swarm_autoscaler.core.kinds import Lane, Phase, kind_of
from swarm_autoscaler.core.model import Snapshot
from swarm_autoscaler.core.recheck import Fresh, violations
from swarm_autoscaler.daemon.fencing import Ending, fence_terminations, lifted, unfence
from swarm_autoscaler.daemon.jobs import ActionRefused, Age, Outcome, Runner, StillLeader, left
from swarm_autoscaler.daemon.perform import READ_CUT, Doer, Ports

__all__ = ["DEFAULT_ACT", "ActConfig", "ActionRefused", "Outcome", "Ports", "StillLeader", "act"]


@dataclass(frozen=True, slots=True)
class ActConfig:
    """How `act` carries a plan out. `cluster_name` goes on every launch as `OWNERSHIP_LABEL` (empty: no
    ownership label, for tools that never launch). `concurrency`: safety jobs in flight at most.
    `deadline`: seconds after `act`'s start at which no new work starts (None: no deadline)."""

    cluster_name: str = ""
    concurrency: int = 16
    deadline: float | None = None


DEFAULT_ACT = ActConfig()


async def act(
    plan: Plan,
    snapshot: Snapshot,
    ports: Ports,
    still_leader: StillLeader = lambda: True,
    config: ActConfig = DEFAULT_ACT,
    age: Age = lambda _: 0,
) -> tuple[Outcome, ...]:
    """Carry out the plan in the phases above; return one Outcome per action, in plan order. Never
    raises except on cancellation. When `still_leader` turns False, actions not yet started are
    cancelled (kind "cancelled"). `age(action)`: the ticks it has waited (oldest start first)."""
    runner = Runner(config.concurrency, config.deadline, still_leader, age)
    doer = Doer(ports, snapshot, config.cluster_name)
    bookkeeping, phases = _phases(plan.actions)
    async with asyncio.TaskGroup() as group:
        book = group.create_task(runner.run([doer.job(a, Lane.BOOKKEEPING) for a in bookkeeping]))
        outcomes = await runner.run([doer.job(a) for a in phases[Phase.GENTLE]])
        if phases[Phase.RETIRE] or phases[Phase.DISRUPT]:
            outcomes += await _disrupt(phases[Phase.RETIRE], phases[Phase.DISRUPT], doer, runner)
    outcomes += book.result()
    by_action: defaultdict[int, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:  # the same action object may stand twice in a plan: one outcome each
        by_action[id(outcome.action)].append(outcome)
    return tuple(by_action[id(a)].pop(0) for a in plan.actions)


def _phases(actions: Sequence[Action]) -> tuple[list[Action], dict[Phase, list[Action]]]:
    """The plan by phase (`core.kinds`), in plan order; and apart, in the bookkeeping lane, the
    NodeUpdates of nodes with nothing else in the plan."""
    busy = {getattr(a, "node_id", None) for a in actions if not isinstance(a, NodeUpdate)} - {None}
    bookkeeping: list[Action] = []
    phases: dict[Phase, list[Action]] = {phase: [] for phase in Phase}
    for a in actions:
        if isinstance(a, NodeUpdate) and a.node_id not in busy:
            bookkeeping.append(a)
        else:
            phases[kind_of(a).phase].append(a)
    return bookkeeping, phases


async def _disrupt(
    retires: list[Action], disruptive: list[Action], doer: Doer, runner: Runner
) -> list[Outcome]:
    """Phases 2 and 3: each step re-checked on a read taken right before it."""
    fresh = await doer.fresh_read(runner.grace())
    if fresh == READ_CUT:
        return left([*retires, *disruptive], "deadline")
    outcomes, runnable = _recheck(retires, fresh, {})
    outcomes += await runner.run([doer.job(a) for a in runnable])
    kept = doer.unretired_hosts(outcomes, fresh)
    if runnable:  # a retirement ran: what is true now is what the drains must be checked against
        fresh = await doer.fresh_read(runner.grace())
    if fresh == READ_CUT:
        return outcomes + left(disruptive, "deadline")
    checked, runnable = _recheck(disruptive, fresh, kept, doer.hosts_of)
    outcomes += checked
    ending: list[Ending] = [a for a in runnable if isinstance(a, Terminate | Stop)]  # the batched kinds
    jobs = [doer.job(a) for a in runnable if not kind_of(a).batched]
    if ending and not isinstance(fresh, str):  # (runnable at all only on a fresh read)
        skipped, ending, note = await fence_terminations(
            doer.ports.workload, ending, fresh, doer.hosts_of, runner.grace()
        )
        outcomes += [Outcome(a, False, "skipped: " + why, kind="skipped") for a, why in skipped]
        terminations = [a for a in ending if isinstance(a, Terminate)]
        stops = [a for a in ending if isinstance(a, Stop)]
        if terminations:
            jobs.append(doer.terminate_batch(terminations, note))
        if stops:
            jobs.append(doer.stop_batch(stops, "" if terminations else note))
    done = await runner.run(jobs)
    failed = [o.action for o in done if kind_of(o.action).batched and not o.ok]
    await unfence(doer.ports.workload, lifted(failed, (), doer.hosts_of))  # it did not happen: lift its fence
    return outcomes + done


def _recheck(
    actions: Sequence[Action],
    fresh: Fresh | str,
    kept: dict[str, str],
    hosts_of: Callable[[Action], set[str]] = lambda _: set(),
) -> tuple[list[Outcome], list[Action]]:
    """Split `actions` into skipped Outcomes (with every reason) and those still safe on `fresh`.
    `fresh` is the error text when the read failed: then every action is skipped. `kept` maps a host
    whose worker the scheduler just refused to retire to that reason; its node is left alone."""
    skipped: list[Outcome] = []
    runnable: list[Action] = []
    for action in actions:
        if isinstance(fresh, str):
            reasons: tuple[str, ...] = (f"no fresh read to re-check against ({fresh})",)
        else:
            reasons = violations(action, fresh)
            reasons += tuple(kept[h] for h in sorted(hosts_of(action)) if h in kept)
        if reasons:
            skipped.append(Outcome(action, False, "skipped: " + "; ".join(reasons), kind="skipped"))
        else:
            runnable.append(action)
    return skipped, runnable
