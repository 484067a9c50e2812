"""Carrying a plan out: in three phases, concurrently within a bound, by a deadline, re-checking every
disruptive action against a fresh read right before it runs.

1. **Gentle actions first** (marks, labels, activations, uncordons, launches): nothing they do can
   hurt a busy machine, and they make the world more like the plan assumes.
2. **Fresh read, then retirements.** One node listing and one scheduler read of the workers, taken
   after phase 1 (`Orchestrator.list_nodes`, `Workload.list_workers`). Every RetireWorkers whose `expect`
   fails on it (`core.recheck`) is skipped; the others run. A worker the scheduler kept (it holds the
   only copy of a result) cancels its node's drain and termination in this same act.
3. **Read again if a retirement ran, then drains, cordons, terminations and removals**, each re-checked
   on the latest read. Terminations are batched into ONE `Cloud.terminate` call; node updates run
   concurrently (one node's actions always run one after another, in plan order).
4. **Terminations are fenced first** (`fencing`): their hosts are fenced in one scheduler call (no
   worker there, connected now or later, gets a task any more), each Terminate is re-checked on the
   workers the fence saw, and only then does the batch go to EC2. A skipped or failed termination lifts
   its host's fence.

An action is skipped (outcome kind "skipped", with every reason) when its precondition no longer holds
or when the fresh read failed (fail closed). Outcomes come back in plan order.

Bounds: at most `ActConfig.concurrency` actions are in flight at once. At the deadline, actions not yet
started are left to the next tick (kind "deadline") and those in flight are cancelled (also "deadline",
saying they may have taken effect), except launches and the termination batch, which are awaited: a
cancelled RunInstances may still start machines that no one would then count, and a cut-short
termination would leave its nodes behind and report as undone what EC2 did.
Cancelling `act` itself (SIGTERM) cancels everything in flight at once; whoever acts next plans again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.cluster import TYPE_LABEL
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Action,
    ActivateNode,
    Availability,
    Cordon,
    DrainNode,
    LabelNode,
    Launch,
    MarkNode,
    NodeMarks,
    Plan,
    RemoveNode,
    RetireWorkers,
    Snapshot,
    Start,
    Stop,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.ports import Cloud, Orchestrator, Workload
from swarm_autoscaler.core.recheck import Fresh, violations
from swarm_autoscaler.daemon.fencing import fence_terminations, lifted, unfence
from swarm_autoscaler.errors import AutoscalerError, LockLostError

DISRUPTIVE = (DrainNode, Cordon, Terminate, Stop, RemoveNode)


@dataclass(frozen=True, slots=True)
class Ports:
    """The three ports a tick talks through (the lock is the loop's business)."""

    cloud: Cloud
    orchestrator: Orchestrator
    workload: Workload


@dataclass(frozen=True, slots=True)
class ActConfig:
    """How `act` carries a plan out. `cluster_name` goes on every launch as `OWNERSHIP_LABEL` (empty: no
    ownership label, for tools that never launch). `concurrency`: actions in flight at most.
    `deadline`: seconds `act` may take from its start (None: no deadline)."""

    cluster_name: str = ""
    concurrency: int = 16
    deadline: float | None = None


DEFAULT_ACT = ActConfig()


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


@dataclass(frozen=True, slots=True)
class _Job:
    """One unit of work for the pool: the actions it stands for (a terminate batch stands for several),
    the node it serialises on, and whether the deadline may cancel it once started."""

    actions: tuple[Action, ...]
    perform: Perform
    node_id: str | None = None
    finish_past_deadline: bool = False


class _Pool:
    """Runs jobs concurrently within a bound and a deadline; turns every result into Outcomes."""

    def __init__(self, concurrency: int, deadline_at: float | None, still_leader: StillLeader) -> None:
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._deadline_at = deadline_at
        self._still_leader = still_leader
        self._node_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._started: set[int] = set()  # ids of the jobs whose call went out

    def past_deadline(self) -> bool:
        return self._deadline_at is not None and time.monotonic() >= self._deadline_at

    def time_left(self) -> float | None:
        return None if self._deadline_at is None else max(0.0, self._deadline_at - time.monotonic())

    async def run(self, jobs: Sequence[_Job]) -> list[Outcome]:
        if not jobs:
            return []
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._one(job)) for job in jobs]
            await self._enforce_deadline(tasks, jobs)
        out: list[Outcome] = []
        for job, task in zip(jobs, tasks, strict=True):
            if not task.cancelled():
                out.extend(task.result())
            else:
                out.extend(_left(job.actions, "interrupted" if id(job) in self._started else "deadline"))
        return out

    async def _enforce_deadline(self, tasks: list[asyncio.Task[list[Outcome]]], jobs: Sequence[_Job]) -> None:
        if self._deadline_at is None:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.time_left())
        for task, job in zip(tasks, jobs, strict=True):
            if task in pending and not job.finish_past_deadline:
                task.cancel()

    async def _one(self, job: _Job) -> list[Outcome]:
        lock = self._node_locks[job.node_id] if job.node_id else contextlib.nullcontext()
        async with lock, self._slots:
            if self.past_deadline():
                return _left(job.actions, "deadline")
            if not self._still_leader():
                return _left(job.actions, "cancelled")
            try:
                self._started.add(id(job))
                detail = await job.perform()
                return [Outcome(a, True, detail) for a in job.actions]
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
        "the tick's deadline passed while it ran; cancelled (it may have taken effect), left to the next tick",
    ),
    "cancelled": ("cancelled", "leadership lost; cancelled"),
}


def _left(actions: Iterable[Action], why: str) -> list[Outcome]:
    kind, detail = _LEFT[why]
    return [Outcome(a, False, detail, kind=kind) for a in actions]


async def act(
    plan: Plan,
    snapshot: Snapshot,
    ports: Ports,
    still_leader: StillLeader = lambda: True,
    config: ActConfig = DEFAULT_ACT,
) -> tuple[Outcome, ...]:
    """Carry out the plan in the three phases above; return one Outcome per action, in plan order.
    Never raises except on cancellation. When `still_leader` turns False, actions not yet started are
    cancelled (kind "cancelled")."""
    deadline_at = None if config.deadline is None else time.monotonic() + config.deadline
    pool = _Pool(config.concurrency, deadline_at, still_leader)
    doer = _Doer(ports, snapshot, config.cluster_name)
    drained = {a.node_id for a in plan.actions if isinstance(a, DrainNode)}

    def later(a: Action) -> bool:  # disruptive, or the marks of a node to drain (they go with its drain)
        return isinstance(a, DISRUPTIVE) or (isinstance(a, MarkNode) and a.node_id in drained)

    gentle = [a for a in plan.actions if not isinstance(a, RetireWorkers) and not later(a)]
    retires = [a for a in plan.actions if isinstance(a, RetireWorkers)]
    disruptive: list[Action] = [a for a in plan.actions if later(a)]
    outcomes = await pool.run([doer.job(a) for a in gentle])
    if retires or disruptive:
        outcomes += await _disrupt(retires, disruptive, doer, pool)
    by_action: defaultdict[int, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:  # the same action object may stand twice in a plan: one outcome each
        by_action[id(outcome.action)].append(outcome)
    return tuple(by_action[id(a)].pop(0) for a in plan.actions)


async def _disrupt(
    retires: list[RetireWorkers], disruptive: list[Action], doer: _Doer, pool: _Pool
) -> list[Outcome]:
    """Phases 2 and 3: each step re-checked on a read taken right before it."""
    fresh = await doer.fresh_read(pool.time_left())
    if pool.past_deadline():
        return _left([*retires, *disruptive], "deadline")
    outcomes, runnable = _recheck(retires, fresh, {})
    outcomes += await pool.run([doer.job(a) for a in runnable])
    kept = doer.unretired_hosts(outcomes, fresh)
    if runnable:  # a retirement ran: what is true now is what the drains must be checked against
        fresh = await doer.fresh_read(pool.time_left())
    if pool.past_deadline():
        return outcomes + _left(disruptive, "deadline")
    checked, runnable = _recheck(disruptive, fresh, kept, doer.hosts_of)
    outcomes += checked
    runnable, unmarked = _with_their_drains(runnable)
    outcomes += unmarked
    ending: list[Terminate | Stop] = [a for a in runnable if isinstance(a, Terminate | Stop)]
    jobs = [doer.job(a) for a in runnable if not isinstance(a, Terminate | Stop)]
    if ending and not isinstance(fresh, str):  # (runnable at all only on a fresh read)
        skipped, ending, note = await fence_terminations(
            doer.ports.workload, ending, fresh, doer.hosts_of, pool.time_left()
        )
        outcomes += [Outcome(a, False, "skipped: " + why, kind="skipped") for a, why in skipped]
        terminations = [a for a in ending if isinstance(a, Terminate)]
        stops = [a for a in ending if isinstance(a, Stop)]
        if terminations:
            jobs.append(doer.terminate_batch(terminations, note))
        if stops:
            jobs.append(doer.stop_batch(stops, "" if terminations else note))
    done = await pool.run(jobs)
    failed = [o.action for o in done if isinstance(o.action, Terminate | Stop) and not o.ok]
    await unfence(doer.ports.workload, lifted(failed, (), doer.hosts_of))  # it did not happen: lift its fence
    return outcomes + done


def _with_their_drains(actions: Sequence[Action]) -> tuple[list[Action], list[Outcome]]:
    """The marks of a node to drain (among `actions`, in plan order, before its DrainNode) run only when
    its drain does, right before it on that node's queue; the others are skipped. Written in the first
    phase, a drain's mark (it clears the cordon mark: the worker is being retired) would outlive a
    retirement or drain that then did not happen, and a cordoned worker without its mark looks retiring
    to the planner, which then waits on it forever (found by the chaos test: a retirement cut short by
    the deadline left two machines that way)."""
    draining = {a.node_id for a in actions if isinstance(a, DrainNode)}
    keep: list[Action] = []
    skipped: list[Outcome] = []
    for action in actions:
        if isinstance(action, MarkNode) and action.node_id not in draining:
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


class _Doer:
    """Performs single actions through the ports, and the fresh reads. Keeps the lifecycle marks it
    wrote, so that a node's second mark in one act builds on its first."""

    def __init__(self, ports: Ports, snapshot: Snapshot, cluster_name: str) -> None:
        self.ports = ports
        self.now = snapshot.now
        self.cluster_name = cluster_name
        self.marks = {n.id: n.marks for n in snapshot.nodes}
        self._node_host = {n.id: n.hostname for n in snapshot.nodes}
        self._instance_host = {i.id: i.hostname for i in snapshot.instances}
        self._worker_host = {w.address: w.hostname for w in snapshot.workers}
        self.kept: set[str] = set()  # addresses the scheduler refused to retire during this act

    async def fresh_read(self, within: float | None) -> Fresh | str:
        """One node listing and one read of the workers, concurrently, in at most `within` seconds; the
        error text if either fails or time runs out."""
        failed = ""
        try:
            async with asyncio.timeout(within), asyncio.TaskGroup() as tg:
                nodes = tg.create_task(self.ports.orchestrator.list_nodes())
                workers = tg.create_task(self.ports.workload.list_workers())
        except* TimeoutError:
            failed = "the tick's deadline passed during the read"
        except* Exception as group:
            failed = "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions)
        return failed or Fresh(nodes.result(), workers.result())

    def hosts_of(self, action: Action) -> set[str]:
        """The hostnames a disruptive action touches (from the snapshot it was planned on)."""
        match action:
            case Terminate(instance_ids=ids, node_ids=node_ids) | Stop(instance_ids=ids, node_ids=node_ids):
                hosts = {self._instance_host.get(i, "") for i in ids}
                return (hosts | {self._node_host.get(n, "") for n in node_ids}) - {""}
            case DrainNode(hostname=host) | Cordon(hostname=host) | RemoveNode(hostname=host):
                return {host}
        return set()

    def unretired_hosts(self, outcomes: Iterable[Outcome], fresh: Fresh | str) -> dict[str, str]:
        """Host -> reason, for every worker a RetireWorkers of this act meant to retire and that did not
        retire: the scheduler kept it (it holds the only copy of a result), or the retirement failed or
        was skipped. Its node's drain and termination are then cancelled in this same act."""
        hosts = dict(self._worker_host)
        if not isinstance(fresh, str):
            hosts.update({w.address: w.hostname for w in fresh.workers})
        out: dict[str, str] = {}
        for outcome in outcomes:
            if not isinstance(outcome.action, RetireWorkers):
                continue
            for address in outcome.action.addresses:
                if address not in hosts:
                    continue
                if not outcome.ok:
                    out[hosts[address]] = (
                        f"the retirement of worker {address} did not happen ({outcome.kind})"
                    )
                elif address in self.kept:
                    out[hosts[address]] = f"the scheduler kept worker {address} (it refused to retire it)"
        return out

    def job(self, action: Action) -> _Job:
        node_id: str | None = getattr(action, "node_id", None)
        # A cancelled RunInstances or StartInstances may still start machines: they run to their end.
        return _Job((action,), lambda: self.perform(action), node_id, isinstance(action, Launch | Start))

    def terminate_batch(self, actions: Sequence[Terminate], note: str) -> _Job:
        """Every Terminate of the act in ONE `Cloud.terminate` call, then their nodes removed. `note`
        (how their hosts were fenced) goes in the result. The only way a Terminate is carried out."""

        async def perform() -> str:
            ids = list(dict.fromkeys(i for a in actions for i in a.instance_ids))
            await self.ports.cloud.terminate(ids)
            nodes = dict.fromkeys(n for a in actions for n in a.node_ids)
            async with asyncio.TaskGroup() as tg:
                for node_id in nodes:
                    tg.create_task(self.ports.orchestrator.remove(node_id))
            done = f"terminated (one call for {len(ids)} instance(s)); removed {len(nodes)} node(s)"
            return f"{done}; {note}"

        # Once TerminateInstances went out the step runs to its end, even past the deadline: it was
        # re-checked, and cut short it would leave nodes behind and report as undone what was done.
        return _Job(tuple(actions), perform, finish_past_deadline=True)

    def stop_batch(self, actions: Sequence[Stop], note: str = "") -> _Job:
        """Every Stop of the act in ONE `Cloud.stop_instances` call, then their nodes removed (a stopped machine
        joins afresh when started), run to its end past the deadline as a termination batch is."""

        async def perform() -> str:
            ids = list(dict.fromkeys(i for a in actions for i in a.instance_ids))
            await self.ports.cloud.stop_instances(ids)
            nodes = dict.fromkeys(n for a in actions for n in a.node_ids)
            async with asyncio.TaskGroup() as tg:
                for node_id in nodes:
                    tg.create_task(self.ports.orchestrator.remove(node_id))
            done = f"stopped into the warm pool (one call for {len(ids)} instance(s)); removed {len(nodes)} node(s)"
            return f"{done}; {note}" if note else done

        return _Job(tuple(actions), perform, finish_past_deadline=True)

    async def perform(self, action: Action) -> str:
        match action:
            case Launch(type_name=type_name, count=count, pool=pool):
                return await self._launch(type_name, count, pool)
            case Start(instance_ids=ids, type_name=type_name):
                return await self._start(ids, type_name)
            case Stop():
                return await self.stop_batch([action]).perform()
            case RetireWorkers(addresses=addresses):
                retired = await self.ports.workload.retire(addresses)
                kept = sorted(set(addresses) - set(retired))
                self.kept.update(kept)
                if kept:
                    # dask may leave a worker it refused to retire closing_gracefully: it would take no
                    # task and never be retired again. Set it running; a later plan retires it once idle.
                    await self.ports.workload.uncordon(kept)
                    return f"retired {len(retired)}; scheduler kept {', '.join(kept)} (set running again)"
                return f"retired {len(retired)}"
            case Cordon(node_id=node_id, addresses=addresses):
                await self._mark(node_id, cordoned_since=self.now)  # first: a restart must see it
                return f"cordoned {len(await self.ports.workload.cordon(addresses))}"
            case Uncordon(node_id=node_id, addresses=addresses):
                done = await self.ports.workload.uncordon(addresses)
                await self._mark(node_id, cordoned_since=None)
                return f"uncordoned {len(done)}"
        return await self._perform_on_node(action)

    async def _perform_on_node(self, action: Action) -> str:
        orchestrator = self.ports.orchestrator
        match action:
            case ActivateNode(node_id=node_id):
                await orchestrator.set_availability(node_id, Availability.ACTIVE)
                return "activated"
            case DrainNode(node_id=node_id):
                await orchestrator.set_availability(node_id, Availability.DRAIN)
                return "drained"
            case MarkNode(node_id=node_id, marks=new):
                await self._mark(node_id, **dataclasses.asdict(new))
                return "marked"
            case LabelNode(node_id=node_id, labels=labels):
                await orchestrator.add_labels(node_id, dict(labels))
                return "labelled"
            case RemoveNode(node_id=node_id):
                await orchestrator.remove(node_id)
                return "removed"
        raise ActionRefused("error", f"unknown action {action!r}")  # pragma: no cover - exhaustive above

    async def _mark(self, node_id: str, **changes: float | bool | None) -> None:
        current = self.marks.get(node_id)
        if current is None:
            raise ActionRefused("error", f"node {node_id} not in the snapshot")
        updated: NodeMarks = dataclasses.replace(current, **changes)  # type: ignore[arg-type]
        await self.ports.orchestrator.mark(node_id, updated)
        self.marks[node_id] = updated

    async def _start(self, ids: tuple[str, ...], type_name: str) -> str:
        result = await self.ports.cloud.start_instances(ids)
        got = len(result.instances)
        if result.error:
            raise ActionRefused("error", f"started {got}/{len(ids)}: {result.error}")
        if got < len(ids) and result.refused:
            # backed off per (type, subnet): the next plan launches new machines instead
            raise ActionRefused("capacity", f"started {got}/{len(ids)}; EC2 refused {type_name} for capacity")
        return f"started {got} from the warm pool: {', '.join(i.id for i in result.instances)}"

    async def _launch(self, type_name: str, count: int, pool: bool = False) -> str:
        labels = {TYPE_LABEL: type_name}
        if self.cluster_name:
            labels[OWNERSHIP_LABEL] = self.cluster_name
        cloud = self.ports.cloud
        # (`pool` only when set: a launch to work calls the port exactly as before pools existed)
        result = await (
            cloud.launch(type_name, count, labels, pool=True)
            if pool
            else cloud.launch(type_name, count, labels)
        )
        got = len(result.instances)
        if result.error:
            raise ActionRefused("error", f"launched {got}/{count}: {result.error}")
        if got < count and result.refused:
            raise ActionRefused("capacity", f"launched {got}/{count}; no capacity for {type_name}")
        return f"launched {got}: {', '.join(i.id for i in result.instances)}"
