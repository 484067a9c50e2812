"""The daemon's loop: one asyncio task per managed cluster, a tick every poll interval or sooner.

A tick starts at once when the scheduler reports new unrunnable or queued work or a lost worker
(`Workload.wait_for_change`), so a burst is answered in about a second whatever the poll interval.
The loop never dies: a failing tick is logged with its context and the next one runs.

A tick has a deadline of `TICK_DEADLINE_POLLS` poll intervals (act always gets at least half of it):
what act has not done by then is left to the next tick, so one slow step never blinds the daemon
(and /healthz, which turns stale after `STALE_TICKS` poll intervals, stays green). SIGTERM/SIGINT set
`stop`; the tick in progress is cancelled at once, even mid-act (whoever acts next plans again from
what is then true), the lock is released within `STOP_GRACE_S`, and `run` returns.

Why one file of this size: the loop, its leadership, its in-flight view of EC2 and its planner's memory
of the work seen (core/arrivals.py) live and die with one daemon process, read together.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from swarm_autoscaler.core.actions import fields_of
from swarm_autoscaler.core.arrivals import Learner
from swarm_autoscaler.core.model import Instance, InstanceState, InstanceType, Policy, Unavailable
from swarm_autoscaler.core.plan import plan as make_plan
from swarm_autoscaler.core.ports import Cloud, LaunchResult, Lock
from swarm_autoscaler.daemon.tick import ActConfig, ObserveError, Outcome, Ports, TickResult, run_tick
from swarm_autoscaler.daemon.waiting import Waiting
from swarm_autoscaler.errors import AutoscalerError

log = structlog.get_logger("swarm_autoscaler.daemon.loop")

# The shortest gap between two ticks, so a stream of scheduler events cannot spin the loop.
MIN_TICK_GAP_S = 0.2
# A tick's deadline in poll intervals (see the module docstring).
TICK_DEADLINE_POLLS = 2.0
# How long a stopping daemon waits for the cancelled tick to unwind and for the lock's release.
STOP_GRACE_S = 3.0


class InFlightCloud:
    """Wraps a Cloud so that instances it just launched count in every listing until EC2 lists them.

    EC2 is eventually consistent: a freshly launched instance can be missing from DescribeInstances
    for a few seconds, and a plan that does not see it would launch again. Entries expire after
    `horizon` seconds whatever happens (measured with `clock`, by default the cloud's).
    """

    def __init__(
        self, inner: Cloud, clock: Callable[[], float] | None = None, horizon: float = 120.0
    ) -> None:
        self.inner = inner
        self._clock = clock if clock is not None else inner.now
        self._horizon = horizon
        self._recent: dict[str, tuple[float, Instance]] = {}
        self._started: dict[
            str, tuple[float, Instance]
        ] = {}  # started from the pool, maybe still listed stopped

    async def list_instances(self) -> tuple[Instance, ...]:
        listed = await self.inner.list_instances()
        now = self._clock()
        seen = {i.id for i in listed}
        self._recent = {
            iid: (t, inst)
            for iid, (t, inst) in self._recent.items()
            if iid not in seen and now - t < self._horizon
        }
        # A start, like a launch, may not show yet: a machine listed still stopped right after its start
        # is the started one, or the next plan would count it in the pool and start it again.
        stale = {i.id for i in listed if i.state == InstanceState.STOPPED and i.id in self._started}
        self._started = {
            iid: (t, inst)
            for iid, (t, inst) in self._started.items()
            if iid in stale and now - t < self._horizon
        }
        listed = tuple(self._started[i.id][1] if i.id in self._started else i for i in listed)
        return listed + tuple(inst for _, inst in self._recent.values())

    def now(self) -> float:
        return self.inner.now()

    async def instance_types(self, names: Sequence[str]) -> tuple[InstanceType, ...]:
        return await self.inner.instance_types(names)

    async def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
    ) -> LaunchResult:
        inner = self.inner
        result = await (
            inner.launch(type_name, count, labels, pool=True)
            if pool
            else inner.launch(type_name, count, labels)
        )
        now = self._clock()
        for inst in result.instances:
            self._recent[inst.id] = (now, inst)
        return result

    async def terminate(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            self._recent.pop(iid, None)
            self._started.pop(iid, None)
        await self.inner.terminate(instance_ids)

    async def start_instances(self, instance_ids: Sequence[str]) -> LaunchResult:
        result = await self.inner.start_instances(instance_ids)
        now = self._clock()
        for inst in result.instances:
            self._started[inst.id] = (now, inst)
        return result

    async def stop_instances(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            self._started.pop(iid, None)
        await self.inner.stop_instances(instance_ids)

    def unavailable(self, now: float) -> tuple[Unavailable, ...]:
        return self.inner.unavailable(now)


# How long a tick waits for its lock extension to end once cancelled (`Leadership.__aexit__`).
KEEPER_STOP_S = 2.0


class Leadership:
    """Holds the leader lock for the length of one tick, extending it in the background.

    `held` turns False as soon as an extension fails; `act` checks it before every action. It stays
    False when `acquire` raises (the lock could not be confirmed). `confirmed_at` is the monotonic time
    of the last successful acquire or extend: the lock is surely ours for `ttl` after it, no longer.
    """

    def __init__(self, lock: Lock, ttl: float) -> None:
        self._lock = lock
        self._ttl = ttl
        self.held = False
        self.confirmed_at: float | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._ended = False  # the tick is over: an extension left running stops after its current call

    def known_held(self) -> bool:
        """True while the lock is held as last confirmed and that confirmation is within the TTL."""
        at = self.confirmed_at
        return self.held and at is not None and time.monotonic() - at < self._ttl

    async def __aenter__(self) -> Leadership:
        self.held = await self._lock.acquire()
        if self.held:
            self.confirmed_at = time.monotonic()
            self._keeper = asyncio.create_task(self._keep())
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop the extension, waiting for it at most `KEEPER_STOP_S`. `asyncio.wait`, not `await`: a
        cancellation of the tick itself (the daemon stopping) must reach the tick, and an extension that
        does not end when cancelled must not hold the tick. (A tick in a fresh-clone run finished its
        phases in 1.1 s and then waited 70 s here, with `await` under `suppress(CancelledError)`, until
        the stop's cancellation, which that suppress swallowed.)"""
        self._ended = True
        keeper, self._keeper = self._keeper, None
        if keeper is None:
            return
        keeper.cancel()
        _, pending = await asyncio.wait({keeper}, timeout=KEEPER_STOP_S)
        if pending:
            log.warning(
                "the lock's extension did not stop with its tick; left to end on its own",
                waited_s=KEEPER_STOP_S,
            )

    async def _keep(self) -> None:
        while self.held and not self._ended:
            await asyncio.sleep(max(self._ttl / 3, 0.05))
            try:
                self.held = await self._lock.extend()
                if self.held:
                    self.confirmed_at = time.monotonic()
            except AutoscalerError as exc:
                log.warning("lock extension failed", error=str(exc))
                self.held = False
        if not self._ended:
            log.warning("leadership lost during a tick; cancelling the remaining actions")


TickHook = Callable[[TickResult | None, float, BaseException | None], None]


@dataclass
class Daemon:
    """Runs ticks for one managed cluster.

    Time: the cloud's clock (`ports.cloud.now()`, EC2's own clock in production) is the only one: it
    stamps `Snapshot.now`, hence every age and lifecycle mark, and `last_success`. The host's wall
    clock is never read, so a host whose clock is off or steps changes no decision (see ec2_clock).
    Deadlines are measured on the monotonic clock. `act_concurrency` bounds the actions in flight;
    `tick_deadline` defaults to `TICK_DEADLINE_POLLS` poll intervals.
    """

    cluster_name: str
    ports: Ports
    lock: Lock
    policy: Policy
    catalogue: Mapping[str, InstanceType]
    poll_interval: float
    lock_ttl: float = 30.0
    act_concurrency: int = 16
    tick_deadline: float | None = None
    on_tick: TickHook | None = None
    last_success: float | None = None
    last_snapshot_at: float | None = None  # `Snapshot.now` of the last successful tick
    last_tick_ok: bool | None = None
    leader: bool = False
    ticks: int = 0
    waiting: Waiting = field(default_factory=Waiting, repr=False)
    planner: Learner = field(default_factory=lambda: Learner(make_plan), repr=False)  # core/arrivals.py
    _standby_logged: bool = field(default=False, repr=False)
    _unplaceable_logged: frozenset[tuple[str, str]] = field(default=frozenset(), repr=False)
    _halted: str = field(default="", repr=False)  # the safety stop's reason as last logged
    _leadership: Leadership | None = field(default=None, repr=False)

    @property
    def clock(self) -> Callable[[], float]:
        """The daemon's only clock: the cloud's."""
        return self.ports.cloud.now

    def is_leader(self) -> bool:
        """What is known now: True only while the lock is held as last confirmed with the lock's store,
        within its TTL. False on standby, after a tick that could not confirm the lock (e.g. redis is
        unreachable), and once the TTL passed without a confirmation."""
        return self._leadership is not None and self._leadership.known_held()

    def snapshot_age(self) -> float | None:
        """Seconds since the snapshot of the last successful tick was taken (None before the first):
        how stale everything reported from it is. Grows while ticks fail or hang."""
        return None if self.last_snapshot_at is None else self.clock() - self.last_snapshot_at

    def __post_init__(self) -> None:
        if self.tick_deadline is None:
            self.tick_deadline = TICK_DEADLINE_POLLS * self.poll_interval

    async def tick_once(self) -> TickResult | None:
        """One tick; never raises (except cancellation). Returns None when observe failed."""
        started = time.perf_counter()
        result: TickResult | None = None
        error: BaseException | None = None
        leadership = Leadership(self.lock, self.lock_ttl)
        try:
            async with leadership:
                self._leadership = leadership  # not before: until acquire answers, the last one holds
                self._note_leadership(leadership.held)
                result = await run_tick(
                    self.ports,
                    self.policy,
                    self.catalogue,
                    self.clock(),
                    leader=leadership.held,
                    still_leader=lambda: leadership.held,
                    config=ActConfig(self.cluster_name, self.act_concurrency),
                    deadline=self.tick_deadline,
                    age=self.waiting.age,
                    planner=self.planner,
                )
            result = self._note_waiting(result)
            self.last_success = self.clock()
            self.last_snapshot_at = result.snapshot.now
            self._log_tick(result, time.perf_counter() - started)
        except ObserveError as exc:
            error = exc
            log.error("tick observed nothing", cluster=self.cluster_name, error=str(exc))
        except AutoscalerError as exc:  # expected trouble (redis or docker away a while): one line, no trace
            error = exc
            log.error("tick failed", cluster=self.cluster_name, error=str(exc))
        except Exception as exc:  # the loop never dies; the next tick runs
            error = exc
            log.exception("tick failed", cluster=self.cluster_name, error=str(exc))
        # What is known after the tick, failed or not: a lock that could not be confirmed is not held.
        self._leadership, self.leader = leadership, leadership.held
        self.last_tick_ok = error is None
        self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(result, time.perf_counter() - started, error)
        return result

    def _note_waiting(self, result: TickResult) -> TickResult:
        """Count the actions planned again without being carried out; ONE warning line in a tick where
        some have just waited more than `waiting.warn_after` ticks (the daemon is not keeping up)."""
        if not result.acted:
            return result
        now = result.snapshot.now
        overdue = self.waiting.update(now, result.plan, result.outcomes)
        if overdue is not None:
            log.warning(
                "actions keep waiting: planned again tick after tick and not carried out",
                cluster=self.cluster_name,
                ticks=self.waiting.warn_after,
                just_overdue=overdue.kinds,
                oldest_ticks=overdue.oldest_ticks,
                oldest_seconds=round(overdue.oldest_seconds, 1),
            )
        return dataclasses.replace(result, waiting=self.waiting.oldest(now))

    def _note_leadership(self, held: bool) -> None:
        if held != self.leader or not self._standby_logged:
            if held:
                log.info("this replica is the leader", cluster=self.cluster_name)
            else:
                log.info("standby: another replica holds the lock; observing only", cluster=self.cluster_name)
            self._standby_logged = True
        self.leader = held

    def _log_tick(self, result: TickResult, seconds: float) -> None:
        buckets = result.cluster.counts()
        log.info(
            "tick",
            cluster=self.cluster_name,
            leader=result.acted,
            seconds=round(seconds, 3),
            phases={name: round(t, 3) for name, t in result.phases},
            buckets=buckets,
            pending=result.plan.pending,
            unplaceable=len(result.plan.unplaceable),
            plan=result.plan.summary(),
        )
        self._log_unplaceable(result)
        self._log_halt(result.plan.halted)
        for outcome in result.outcomes:
            _log_outcome(self.cluster_name, outcome)
        if not result.acted and result.plan.actions:
            log.info("standby: would act", cluster=self.cluster_name, plan=result.plan.summary())

    def _log_halt(self, halted: str) -> None:
        """One warning when the safety stop halts scale-down (core.safety), one line when it lifts."""
        if halted and not self._halted:
            log.warning("scale-down halted", cluster=self.cluster_name, reason=halted)
        elif self._halted and not halted:
            log.info("scale-down resumed: enough nodes are back", cluster=self.cluster_name)
        self._halted = halted

    def _log_unplaceable(self, result: TickResult) -> None:
        """One warning per reason when tasks become unplaceable for it (the tick line has the count):
        the reason, how many tasks, and a few of their keys. Not repeated while nothing new appears."""
        now = frozenset((u.task_key, u.reason) for u in result.plan.unplaceable)
        fresh = now - self._unplaceable_logged
        self._unplaceable_logged = now
        by_reason: dict[str, list[str]] = {}
        for key, reason in sorted(now):
            by_reason.setdefault(reason, []).append(key)
        for reason in sorted({reason for _, reason in fresh}):
            keys = by_reason[reason]
            log.warning(
                "unplaceable", cluster=self.cluster_name, reason=reason, tasks=len(keys), keys=keys[:5]
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop` is set. Setting `stop` cancels the tick in progress at once (even mid-act);
        the lock is then released, within `STOP_GRACE_S` whatever the lock's endpoint does."""
        while not stop.is_set():
            if not await self._tick_unless_stopped(stop):
                break
            await asyncio.sleep(MIN_TICK_GAP_S)
            await self._wait(stop)
        with contextlib.suppress(AutoscalerError, TimeoutError):
            await asyncio.wait_for(self.lock.release(), STOP_GRACE_S)
        self._leadership, self.leader = None, False

    async def _tick_unless_stopped(self, stop: asyncio.Event) -> bool:
        """One tick, cancelled as soon as `stop` is set; False when stopping."""
        tick = asyncio.create_task(self.tick_once(), name=f"tick:{self.cluster_name}")
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({tick, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not tick.done():
                log.warning("stopping mid-tick: the unfinished actions are left to whoever acts next")
                tick.cancel()
            # The cancelled tick unwinds (adapters abort their requests); bounded so exit stays prompt.
            await asyncio.wait({tick}, timeout=STOP_GRACE_S)
        return not stop.is_set()

    async def _wait(self, stop: asyncio.Event) -> None:
        remaining = max(0.0, self.poll_interval - MIN_TICK_GAP_S)
        change = asyncio.create_task(self._wait_change(remaining))
        stopped = asyncio.create_task(stop.wait())
        _, pending = await asyncio.wait({change, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _wait_change(self, seconds: float) -> None:
        try:
            woke = await self.ports.workload.wait_for_change(seconds)
            if woke:
                log.debug("woken by a scheduler change", cluster=self.cluster_name)
        except Exception as exc:  # a broken event source must not stop the loop: fall back to the interval
            log.warning("waiting for scheduler events failed", error=str(exc))
            await asyncio.sleep(seconds)


def _log_outcome(cluster: str, outcome: Outcome) -> None:
    action = outcome.action
    fields = {k: v for k, v in fields_of(action).items() if k != "expect"}
    if outcome.kind in ("skipped", "deadline"):  # not failures: the world moved, or time ran out
        log.info(
            "action skipped" if outcome.kind == "skipped" else "action left to the next tick",
            cluster=cluster,
            kind=outcome.action_kind,
            reason=action.reason,
            why=outcome.detail,
            **fields,
        )
    elif outcome.ok:
        log.info(
            "action",
            cluster=cluster,
            kind=outcome.action_kind,
            reason=action.reason,
            result=outcome.detail,
            **fields,
        )
    else:
        log.warning(
            "action failed",
            cluster=cluster,
            kind=outcome.action_kind,
            reason=action.reason,
            failure=outcome.kind,
            error=outcome.detail,
            **fields,
        )


async def run_clusters(daemons: Sequence[Daemon], stop: asyncio.Event) -> None:
    """One asyncio task per managed cluster, all stopped by the same event."""
    async with asyncio.TaskGroup() as tg:
        for daemon in daemons:
            tg.create_task(daemon.run(stop), name=f"cluster:{daemon.cluster_name}")
