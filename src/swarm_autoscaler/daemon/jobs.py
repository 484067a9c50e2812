"""Running a tick's actions as jobs: concurrently within a bound, by a deadline, with guaranteed progress.

A job stands for one or more actions (a termination batch stands for several; a drain carries its
node's marks) and is performed by one coroutine. `Runner.run` runs a list of jobs and turns each result
into `Outcome`s.

**The progress rule.** Whatever the fleet size and the API's latency, every action the planner keeps
asking for is eventually carried out:

- The tick's deadline stops *starting* work: a job that has not started by then is left to the next
  tick (kind "deadline").
- A job already running is not cancelled at the deadline: it is cut only one deadline later (the hard
  stop; kind "deadline", saying it may have taken effect). Launches and termination batches are never
  cut (a cut RunInstances may still start machines no one would count; a cut termination would leave
  its nodes behind).
- Every `run` starts its first wave (as many jobs as its lane has slots) even past the deadline: a
  phase that comes late in a slow tick still moves.
- Jobs start oldest first: the ones whose actions have waited the most ticks (`age`), then in plan order.
- Bookkeeping (marks and labels of nodes with nothing else to do) runs in its own lane with its own
  slots, so it can never hold the slots that safety and cost actions (retire, drain, terminate) need.

Why: cancelling a node update at the deadline leaves its effect unknown, so the next plan asks for it
again; with enough nodes the same updates filled every deadline for ever and the retirements behind them
never started. Letting a started update finish, starting the oldest first and keeping bookkeeping out of
the way makes every action's wait bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Action
from swarm_autoscaler.core.kinds import Lane
from swarm_autoscaler.errors import AutoscalerError, LockLostError

SAFETY = Lane.SAFETY
BOOKKEEPING = Lane.BOOKKEEPING


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one action. `detail` says what happened, what failed or why it was skipped.
    `kind` classifies a failure: "error", "capacity", "cancelled" (leadership lost), "skipped" (its
    precondition no longer held), "deadline" (left to the next tick)."""

    action: Action
    ok: bool
    detail: str = ""
    kind: str = ""

    @property
    def action_kind(self) -> str:
        return type(self.action).__name__


class ActionRefused(AutoscalerError):
    """An action the far side declined (e.g. a capacity refusal). `kind` classifies it for metrics."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


StillLeader = Callable[[], bool]
Perform = Callable[[], Awaitable[str]]
Age = Callable[[Action], int]


@dataclass(frozen=True, slots=True)
class Job:
    """One unit of work: the actions it stands for, the node it serialises on, whether it may run to its
    end past the hard stop, and its lane (`SAFETY` or `BOOKKEEPING`)."""

    actions: tuple[Action, ...]
    perform: Perform
    node_id: str | None = None
    finish_past_deadline: bool = False
    lane: Lane = SAFETY


class Runner:
    """Runs jobs by the progress rule above. `deadline`: seconds from now (None: none)."""

    def __init__(
        self,
        concurrency: int,
        deadline: float | None,
        still_leader: StillLeader,
        age: Age = lambda _: 0,
    ) -> None:
        self._deadline = deadline
        self._deadline_at = None if deadline is None else time.monotonic() + deadline
        self._still_leader = still_leader
        self._age = age
        size = max(1, concurrency)
        # Bookkeeping gets its own slots (half as many): it never takes one from a retire or a drain.
        self._slots = {SAFETY: size, BOOKKEEPING: max(1, size // 2)}
        self._lanes = {lane: asyncio.Semaphore(n) for lane, n in self._slots.items()}
        self._node_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def past_deadline(self) -> bool:
        return self._deadline_at is not None and time.monotonic() >= self._deadline_at

    def time_left(self) -> float | None:
        return None if self._deadline_at is None else max(0.0, self._deadline_at - time.monotonic())

    def grace(self) -> float | None:
        """Seconds a step started now may take before the hard stop (None: no limit): until one deadline
        after the later of the tick's deadline and now."""
        if self._deadline_at is None or self._deadline is None:
            return None
        now = time.monotonic()
        return max(self._deadline_at, now) + self._deadline - now

    def oldest_first(self, jobs: Sequence[Job]) -> list[Job]:
        """Jobs whose actions waited the most ticks first; plan order among equals (sort is stable).
        All the jobs of one node share its oldest age, so that one node's jobs keep their plan order
        (a Cordon comes after its node's NodeUpdate)."""
        ages = [max((self._age(a) for a in j.actions), default=0) for j in jobs]
        per_node: dict[str, int] = {}
        for job, a in zip(jobs, ages, strict=True):
            if job.node_id:
                per_node[job.node_id] = max(a, per_node.get(job.node_id, 0))
        keys = [per_node.get(j.node_id, a) if j.node_id else a for j, a in zip(jobs, ages, strict=True)]
        return [jobs[i] for i in sorted(range(len(jobs)), key=lambda i: -keys[i])]

    async def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        """Run `jobs`; one Outcome per action, jobs in the order given."""
        if not jobs:
            return []
        ordered = self.oldest_first(jobs)
        first_wave: set[int] = set()
        per_lane: defaultdict[Lane, int] = defaultdict(int)
        for job in ordered:
            if per_lane[job.lane] < self._slots[job.lane]:
                first_wave.add(id(job))
                per_lane[job.lane] += 1
        async with asyncio.TaskGroup() as group:  # created oldest first: the lanes' queues are FIFO
            tasks = {id(j): group.create_task(self._one(j, id(j) in first_wave)) for j in ordered}
        return [o for job in jobs for o in tasks[id(job)].result()]

    async def _one(self, job: Job, first_wave: bool) -> list[Outcome]:
        lock = self._node_locks[job.node_id] if job.node_id else contextlib.nullcontext()
        async with lock, self._lanes[job.lane]:
            if self.past_deadline() and not first_wave:
                return left(job.actions, "deadline")
            if not self._still_leader():
                return left(job.actions, "cancelled")
            limit = asyncio.timeout(None if job.finish_past_deadline else self.grace())
            try:
                async with limit:
                    detail = await job.perform()
                return [Outcome(a, True, detail) for a in job.actions]
            except TimeoutError as exc:
                if limit.expired():
                    return left(job.actions, "interrupted")
                return [Outcome(a, False, f"TimeoutError: {exc}", kind="error") for a in job.actions]
            except LockLostError as exc:
                return [Outcome(a, False, str(exc), kind="cancelled") for a in job.actions]
            except ActionRefused as exc:
                return [Outcome(a, False, str(exc), kind=exc.kind) for a in job.actions]
            except Exception as exc:  # any adapter failure is data; the loop never dies
                return [Outcome(a, False, f"{type(exc).__name__}: {exc}", kind="error") for a in job.actions]


_LEFT = {
    "deadline": ("deadline", "the tick's deadline passed before it ran; left to the next tick"),
    "interrupted": (
        "deadline",
        "still running one deadline past the tick's deadline (the hard stop); cut short (it may have "
        "taken effect), left to the next tick",
    ),
    "cancelled": ("cancelled", "leadership lost; cancelled"),
}


def left(actions: Iterable[Action], why: str) -> list[Outcome]:
    """Outcomes for actions not carried out: `why` is "deadline", "interrupted" or "cancelled"."""
    kind, detail = _LEFT[why]
    return [Outcome(a, False, detail, kind=kind) for a in actions]
