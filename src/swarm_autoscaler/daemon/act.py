"""Carrying a plan out: in three phases, concurrently within a bound, by a deadline, re-checking every
disruptive action against a fresh read right before it runs.

1. **Gentle actions first** (activations, uncordons, launches, and the marks and labels of nodes that
   have another action in the plan): nothing they do can hurt a busy machine, and they make the world
   more like the plan assumes.
2. **Fresh read, then retirements.** One node listing and one scheduler read of the workers, taken
   after phase 1 (`Orchestrator.list_nodes`, `Workload.list_workers`). Every RetireWorkers whose `expect`
   fails on it (`core.recheck`) is skipped; the others run. A worker the scheduler kept (it holds the
   only copy of a result) cancels its node's drain and termination in this same act.
3. **Read again if a retirement ran, then drains, cordons, terminations and removals**, each re-checked
   on the latest read; so is the activation of a node that joined paused (`Policy.join_paused`),
   whose labels phase 1 wrote. A drain and its node's marks are one job. Terminations are batched into ONE
   `Cloud.terminate` call; node updates run concurrently (one node's actions always run one after
   another, in plan order).
4. **Terminations are fenced first** (`fencing`): their hosts are fenced in one scheduler call (no
   worker there, connected now or later, gets a task any more), each Terminate is re-checked on the
   workers the fence saw, and only then does the batch go to EC2. A skipped or failed termination lifts
   its host's fence.

**Bookkeeping lane.** The marks and labels of nodes with nothing else in the plan (each node's in ONE
node update) run beside the three phases, in their own lane (`jobs`): they never hold a slot a
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

from swarm_autoscaler.core.actions import (
    Action,
    ActivateNode,
    Cordon,
    DrainNode,
    LabelNode,
    MarkNode,
    Plan,
    RemoveNode,
    RetireWorkers,
    Stop,
    Terminate,
)
from swarm_autoscaler.core.model import Snapshot
from swarm_autoscaler.core.recheck import Fresh, violations
from swarm_autoscaler.daemon.fencing import fence_terminations, lifted, unfence
from swarm_autoscaler.daemon.jobs import ActionRefused, Age, Job, Outcome, Runner, StillLeader, left
from swarm_autoscaler.daemon.perform import READ_CUT, Doer, Ports

__all__ = ["DEFAULT_ACT", "ActConfig", "ActionRefused", "Outcome", "Ports", "StillLeader", "act"]

DISRUPTIVE = (DrainNode, Cordon, Terminate, Stop, RemoveNode)
BOOK = (MarkNode, LabelNode)


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
    bookkeeping, gentle, retires, disruptive = _lanes(plan.actions)
    async with asyncio.TaskGroup() as group:
        book = group.create_task(runner.run([doer.bookkeeping_job(a) for a in bookkeeping]))
        outcomes = await runner.run(_node_jobs(doer, gentle))
        if retires or disruptive:
            outcomes += await _disrupt(retires, disruptive, doer, runner)
    outcomes += book.result()
    by_action: defaultdict[int, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:  # the same action object may stand twice in a plan: one outcome each
        by_action[id(outcome.action)].append(outcome)
    return tuple(by_action[id(a)].pop(0) for a in plan.actions)


def _lanes(
    actions: Sequence[Action],
) -> tuple[list[list[Action]], list[Action], list[RetireWorkers], list[Action]]:
    """Split a plan: per node, the marks and labels of nodes with nothing else to do (bookkeeping);
    the gentle actions; the retirements; the disruptive actions with the marks of the nodes they drain
    (those go with the drain). A drained node's labels are gentle, written first: the ownership label
    among them is what the drain's own re-check wants to see (`NodeOurs`). Held back with the drain, a
    node that joined unlabelled (EC2 gave notice before it joined) was never labelled, so never drained
    nor terminated: found by a fresh-clone run."""
    drained = {a.node_id for a in actions if isinstance(a, DrainNode)}
    busy = {getattr(a, "node_id", None) for a in actions if not isinstance(a, BOOK)} - {None}
    bookkeeping: dict[str, list[Action]] = {}
    gentle: list[Action] = []
    retires: list[RetireWorkers] = []
    disruptive: list[Action] = []
    for a in actions:
        if isinstance(a, RetireWorkers):
            retires.append(a)
        elif isinstance(a, DISRUPTIVE) or _rechecked(a) or (isinstance(a, MarkNode) and a.node_id in drained):
            disruptive.append(a)
        elif isinstance(a, BOOK) and a.node_id not in busy:
            bookkeeping.setdefault(a.node_id, []).append(a)
        else:
            gentle.append(a)
    return list(bookkeeping.values()), gentle, retires, disruptive


def _rechecked(action: Action) -> bool:
    """An activation that takes in a node joined paused: re-checked on the fresh read of phase 2, after
    phase 1 wrote its labels (its ownership label is what the re-check wants to see)."""
    return isinstance(action, ActivateNode) and bool(action.expect)


def _node_jobs(doer: Doer, actions: Sequence[Action]) -> list[Job]:
    """One job per action, except that a node's marks and labels become one job (one node update)."""
    book: dict[str, list[Action]] = {}
    order: list[Action | str] = []
    for a in actions:
        if isinstance(a, BOOK):
            if a.node_id not in book:
                book[a.node_id] = []
                order.append(a.node_id)
            book[a.node_id].append(a)
        else:
            order.append(a)
    return [doer.node_job(book[x]) if isinstance(x, str) else doer.job(x) for x in order]


async def _disrupt(
    retires: list[RetireWorkers], disruptive: list[Action], doer: Doer, runner: Runner
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
    runnable, unmarked = _with_their_drains(runnable)
    outcomes += unmarked
    ending: list[Terminate | Stop] = [a for a in runnable if isinstance(a, Terminate | Stop)]
    jobs = _drain_jobs(doer, [a for a in runnable if not isinstance(a, Terminate | Stop)])
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
    failed = [o.action for o in done if isinstance(o.action, Terminate | Stop) and not o.ok]
    await unfence(doer.ports.workload, lifted(failed, (), doer.hosts_of))  # it did not happen: lift its fence
    return outcomes + done


def _drain_jobs(doer: Doer, actions: Sequence[Action]) -> list[Job]:
    """A drain and its node's marks and labels (before it in the plan) as ONE job; the rest one each."""
    marks: dict[str, list[Action]] = {}
    jobs: list[Job] = []
    for a in actions:
        if isinstance(a, BOOK):
            marks.setdefault(a.node_id, []).append(a)
        elif isinstance(a, DrainNode):
            jobs.append(doer.node_job([*marks.pop(a.node_id, []), a]))
        else:
            jobs.append(doer.job(a))
    jobs += [doer.node_job(m) for m in marks.values()]  # (none: `_with_their_drains` kept only those)
    return jobs


def _with_their_drains(actions: Sequence[Action]) -> tuple[list[Action], list[Outcome]]:
    """The marks of a node to drain (among `actions`, in plan order, before its DrainNode) run only when
    its drain does, in its drain's job; the others are skipped. Written in the first phase, a drain's
    mark (it clears the cordon mark: the worker is being retired) would outlive a retirement or drain
    that then did not happen, and a cordoned worker without its mark looks retiring to the planner,
    which then waits on it forever (found by the chaos test: a retirement cut short by the deadline left
    two machines that way)."""
    draining = {a.node_id for a in actions if isinstance(a, DrainNode)}
    keep: list[Action] = []
    skipped: list[Outcome] = []
    for action in actions:
        if isinstance(action, BOOK) and action.node_id not in draining:
            why = "skipped: its node's drain does not go ahead (the next plan marks it again)"
            skipped.append(Outcome(action, False, why, kind="skipped"))
        else:
            keep.append(action)
    return keep, skipped


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
