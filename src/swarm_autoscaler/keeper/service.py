"""The keeper: get-or-create, heartbeats and ending, and one asyncio task per cluster.

Each cluster is checked by its own task, on its own interval and at once on its own events (a request,
a heartbeat), never by a sweep over all clusters. A task starts when its cluster is created or first
discovered, and ends with its cluster. Across replicas, a cluster is handled by exactly one replica at
a time: its task acts only while it holds the cluster's lease (`cluster:<id>`, a redis key with a TTL
refreshed at every check), and each replica holds at most its share of the clusters (`shares`: the
clusters over the live replicas, counted through `Replicas` every interval), giving up a surplus only
between two checks. A replica that dies hands its clusters over within the lease's TTL and a check or
two, and a terminate is preceded by a fresh claim, so a lease run out during a slow check stops it.
Get-or-create is exclusive per (user, wallet) through the lock `create:<user>:<wallet>`, so concurrent
requests through any replicas create one cluster.

Discovery (a listing every interval) starts the tasks of new clusters, wakes only the clusters whose
state it finds changed, and ends the tasks of clusters no longer listed: a listing with no change wakes
no task, so each cluster is checked on its own interval.

Tags are written only when needed (EC2 throttles mutating calls; an idle cluster costs no write): the
state when it changes; the heartbeat (a use: a request, or work in the scheduler) when it is `write_every`
newer than the stored one, so the idle decision waits that much longer (`KeeperTiming.heartbeat_lag`) and
no replica reading a lagging tag ends a cluster early; the last answer time when the scheduler goes
silent, whose silence a replica counts from no earlier than when it began to hold the cluster.

Why one file of this size: one class, whose per-cluster tasks, leases and caches share the invariants
above; its pure rules are in `lifecycle`, its limits in `limits`, its shares in `shares`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import structlog

from swarm_autoscaler.config.profiles import DEFAULT_PROFILE
from swarm_autoscaler.errors import AutoscalerError
from swarm_autoscaler.keeper.inputs import BadInput
from swarm_autoscaler.keeper.lifecycle import Decision, KeeperTiming, Probe, decide
from swarm_autoscaler.keeper.limits import Limits
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState, known_profile
from swarm_autoscaler.keeper.ports import ClusterHosts, Locks, Replicas, SchedulerClients, SchedulerProbe
from swarm_autoscaler.keeper.shares import LeaseStep, lease_step, share
from swarm_autoscaler.keeper.usage import UsageAccountant

log = structlog.get_logger("swarm_autoscaler.keeper")

LISTING_GRACE = 60.0  # seconds after its creation during which a cluster missing from a listing is kept

LifecycleHook = Callable[[str], None]
HOLD_REASON = "spent its budget: no new workers"  # in the reason of a cluster whose launches are held


class KeeperBusyError(AutoscalerError):
    """Another request for the same (user, wallet) held the creation lock for too long; retry."""


class ProfileConflictError(BadInput):
    """A create naming a profile while the (user, wallet) pair's live cluster runs another (409)."""

    def __init__(self, message: str) -> None:
        super().__init__(409, message)


@dataclass
class Keeper:
    """On-demand clusters over the keeper's ports. `clock` is the only time source."""

    hosts: ClusterHosts
    probe: SchedulerProbe
    locks: Locks
    timing: KeeperTiming
    interval: float = 5.0
    clock: Callable[[], float] = time.time
    create_wait: float = 30.0
    on_action: LifecycleHook | None = None
    lock_ttl: float = 0.0  # the lease's TTL; 0: three check intervals
    accountant: UsageAccountant | None = None  # usage per wallet, read on its own interval in `run`
    limits: Limits | None = None  # clusters per user and budgets, checked before each creation
    clients: SchedulerClients | None = None  # who is connected, for "no client, no cluster"
    replicas: Replicas | None = None  # the live replicas, for this one's share (None: it is alone)
    replica_count: int = 1  # live replicas at the last count
    max_workers: int | None = None  # each cluster's maximum, which the keeper enforces (`trim`)
    # the worker types the keeper offers a cluster (`trim` ends workers of any other); None: not checked
    types_of: Callable[[Cluster], Collection[str]] | None = None
    profiles: tuple[str, ...] = (DEFAULT_PROFILE,)  # the profiles a create may name (`config.profiles`)
    bind_primaries: bool = False  # a one-time token works only from its primary's private IP (`credentials`)
    checks: int = 0
    last_discovery: float | None = None  # when the last listing of every cluster succeeded (for /healthz)
    _known: dict[str, Cluster] = field(default_factory=dict)
    _written: dict[str, float] = field(default_factory=dict)  # the heartbeat in the tags, as far as known
    _answer_written: dict[str, float] = field(default_factory=dict)  # the answer time in the tags
    _held_since: dict[str, float] = field(default_factory=dict)  # when this replica began to hold each
    _present: dict[str, float] = field(default_factory=dict)  # when it last saw a client or work there
    over_budget: dict[str, float] = field(default_factory=dict)  # wallet -> when found over its budget
    budget_interval: float = 30.0  # how often `over_budget` is read again (the usage interval)
    _holding: set[str] = field(default_factory=set)  # clusters whose launches this replica held
    _held: set[str] = field(default_factory=set)  # the clusters whose lease this replica holds
    _claiming: set[str] = field(default_factory=set)  # those whose claim is on its way to redis
    _claimed: asyncio.Condition = field(default_factory=asyncio.Condition)  # notified as each claim ends
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _wake: dict[str, asyncio.Event] = field(default_factory=dict)
    _stopping: bool = False

    @property
    def lease_ttl(self) -> float:
        """A lease outlives a few missed checks, so a slow check does not hand the cluster over."""
        return self.lock_ttl if self.lock_ttl > 0 else max(3.0 * self.interval, 1.0)

    @property
    def write_every(self) -> float:
        """How much newer a heartbeat must be than the stored one to be written: a quarter of the idle
        timeout, at least 30 s (so 1,000 busy clusters cost at most 2,000 CreateTags a minute) but at most
        half the timeout (so a short one, in tests and demos, does not end clusters much later)."""
        idle = self.timing.idle_timeout
        return max(idle / 4.0, min(30.0, idle / 2.0))

    # ------------------------------------------------------------------ requests

    async def get_or_create(self, key: ClusterKey, profile: str | None = None) -> tuple[Cluster, bool]:
        """The live cluster of `key`, or a new one (True) of `profile` (None: `default`). Counts as a
        heartbeat. An unknown profile is `UnknownProfileError`, a live cluster of another profile than
        the one named `ProfileConflictError`; neither touches anything."""
        wanted = known_profile(profile, self.profiles) if profile is not None else None
        # A live cluster is read without the creation lock (most calls are a client's repeated get): only
        # a creation needs it, and N concurrent gets would otherwise queue one DescribeInstances each
        # behind it, past `create_wait` under load. Found live, it is what the locked path would return.
        live = _live(await self.hosts.find(key))
        if live is None:
            async with self.locks.exclusive(key.lock_name, self.create_wait) as held:
                # again, held or not: another request may have created it (waiters queued behind a
                # slow creation each read under the lock, one after another, and the last ones time out)
                live = _live(await self.hosts.find(key))
                if live is None:
                    if not held:
                        raise KeeperBusyError(
                            f"cluster of {key.user_id}/{key.wallet_id} is being created; retry"
                        )
                    cluster = await self._create(key, wanted or DEFAULT_PROFILE)
        if live is not None:
            if wanted is not None and live.profile != wanted:
                raise ProfileConflictError(
                    f"the live cluster of {key.user_id}/{key.wallet_id} has profile {live.profile!r}, not "
                    f"{wanted!r}: end it (DELETE) before asking for another profile"
                )
            return await self._touch(live), False
        self._emit("create")
        log.info(
            "cluster created",
            cluster=cluster.cluster_id,
            user=key.user_id,
            wallet=key.wallet_id,
            profile=cluster.profile,
        )
        self._adopt(cluster)
        self._written[cluster.cluster_id] = cluster.last_heartbeat
        return cluster, True

    async def _create(self, key: ClusterKey, profile: str) -> Cluster:
        """Launch `key`'s cluster once the limits admit it (`limits.Limits.admit`, which raises when
        not). The count and the launch hold the user's lock, so concurrent creates of one user's
        clusters through any replicas never pass the count together."""
        if self.limits is None:
            return await self.hosts.create(key, self.clock(), profile)
        async with self.locks.exclusive(f"create-user:{key.user_id}", self.create_wait) as held:
            if not held:
                raise KeeperBusyError(f"clusters of {key.user_id} are being created; retry")
            await self.limits.admit(key, await self._live_of(key.user_id))
            return await self.hosts.create(key, self.clock(), profile)

    async def _live_of(self, user_id: str) -> int:
        """Live clusters of `user_id`: those listed, and those this replica created that a listing
        may not show yet (EC2 is eventually consistent)."""
        listed = [c for c in await self.hosts.list_clusters() if c.key.user_id == user_id]
        seen = {c.cluster_id for c in listed}
        now = self.clock()
        unlisted = [
            c
            for c in self._known.values()
            if c.key.user_id == user_id
            and c.live
            and c.cluster_id not in seen
            and now - c.created_at < LISTING_GRACE
        ]
        return sum(1 for c in listed if c.live) + len(unlisted)

    async def get(self, key: ClusterKey) -> Cluster | None:
        """The live cluster of `key`, else its newest ended or failed one, else None."""
        found = await self.hosts.find(key)
        live = _live(found)
        if live is not None:
            return self._known.get(live.cluster_id, live)
        return max(found, key=lambda c: c.created_at, default=None)

    async def heartbeat(self, key: ClusterKey) -> Cluster | None:
        """Note a use of `key`'s live cluster; None when it has none."""
        live = _live(await self.hosts.find(key))
        return None if live is None else await self._touch(live)

    async def end(self, key: ClusterKey) -> Cluster | None:
        """End `key`'s live cluster now (its task terminates the machines). None when it has none."""
        live = _live(await self.hosts.find(key))
        if live is None:
            return None
        reason = "ended on request"
        async with self.locks.exclusive(_state_lock(live.cluster_id), self.create_wait) as held:
            if not held:
                raise KeeperBusyError(f"cluster {live.cluster_id} is changing state; retry")
            await self.hosts.update(live.cluster_id, state=ClusterState.ENDING, reason=reason)
        ending = dataclasses.replace(self._known.get(live.cluster_id, live), state=ClusterState.ENDING)
        ending = dataclasses.replace(ending, reason=reason)
        self._adopt(ending, replace=True)
        self._emit("end-requested")
        return ending

    async def list(self) -> tuple[Cluster, ...]:
        """Every cluster whose primary is not terminated, with the heartbeats this replica knows."""
        listed = await self.hosts.list_clusters()
        return tuple(self._merge(c) for c in listed)

    async def _touch(self, cluster: Cluster) -> Cluster:
        now = self.clock()
        known = self._merge(cluster)
        touched = dataclasses.replace(known, last_heartbeat=max(known.last_heartbeat, now))
        self._adopt(touched, replace=True)
        if now - self._written.get(cluster.cluster_id, cluster.last_heartbeat) >= self.write_every:
            await self.hosts.update(cluster.cluster_id, heartbeat=now)
            self._written[cluster.cluster_id] = now
        return touched

    # ------------------------------------------------------------------ tasks

    async def run(self, stop: asyncio.Event) -> None:
        """Discover clusters every interval (so clusters created by other replicas, or before a restart,
        get a task here too) until `stop` is set; then stop every cluster task. Usage is read meanwhile
        (by every replica: the ledger counts each second once)."""
        side = [asyncio.create_task(self._watch_budgets(stop))]
        if self.accountant is not None:
            side.append(asyncio.create_task(self.accountant.run(stop)))
        side.append(asyncio.create_task(self._count_replicas_until(stop)))
        try:
            while not stop.is_set():
                with contextlib.suppress(AutoscalerError):
                    await self.discover()
                await _wait(stop, self.interval)
        finally:
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            await self.stop()

    async def _watch_budgets(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.limits is not None and self.limits.usage is not None:
            try:
                await self.read_budgets()
            except AutoscalerError as exc:
                log.warning("reading budgets failed", error=str(exc))
            await _wait(stop, self.budget_interval)

    async def read_budgets(self) -> None:
        """Which wallets of the live clusters known here are over their budget (every replica reads it:
        any may answer for a cluster; the time each ran out is shared in redis)."""
        if self.limits is None:
            return
        wallets = {c.key.wallet_id for c in self._known.values() if c.live}
        over = await self.limits.over_budget(wallets, self.clock())
        for wallet in set(over) - set(self.over_budget):
            log.warning("wallet over its budget: its clusters stop growing", wallet=wallet)
        self.over_budget = over

    def budget_ends_at(self, cluster: Cluster) -> float | None:
        """When the cluster's budget grace ends (None: its wallet is within its budget)."""
        since = self.over_budget.get(cluster.key.wallet_id)
        return None if since is None else since + self.timing.budget_grace

    async def _count_replicas_until(self, stop: asyncio.Event) -> None:
        """Every interval, on its own (a slow listing does not delay it): see `count_replicas`."""
        while not stop.is_set() and self.replicas is not None:
            await self.count_replicas()
            await _wait(stop, self.interval)

    async def count_replicas(self) -> None:
        """Renew this replica's presence and count the live ones (kept as it was when that fails). When
        fewer are left, the clusters this one does not hold are checked at once: a dead replica's
        clusters are taken as soon as their leases run out, not an interval later."""
        if self.replicas is None:
            return
        try:
            count = max(1, await self.replicas.beat(self.lease_ttl))
        except AutoscalerError as exc:
            log.warning("counting the replicas failed", error=str(exc))
            return
        fewer = count < self.replica_count
        if count != self.replica_count:
            log.info("replicas", replicas=count, share=share(len(self._tasks), count))
        self.replica_count = count
        if fewer:
            for cid in [c for c in self._tasks if c not in self._held]:
                self.wake(cid)

    @property
    def held(self) -> int:
        """How many clusters' leases this replica holds now."""
        return len(self._held)

    @property
    def budget_held(self) -> int:
        """How many live clusters this replica holds the launches of: their wallet spent its budget."""
        return sum(1 for cid in self._holding if cid in self._known)

    async def discover(self) -> None:
        try:
            listed = await self.hosts.list_clusters()
        except AutoscalerError as exc:
            log.warning("listing clusters failed", error=str(exc))
            raise
        for cluster in listed:
            self._discovered(cluster)
        self._forget_unlisted({c.cluster_id for c in listed})
        self.last_discovery = self.clock()
        await self.trim()

    async def trim(self) -> None:
        """End, in the clusters this replica holds, the workers past the cluster's maximum, those naming
        another cluster's primary and those of a type the keeper does not offer the cluster (`types_of`),
        from the listing just made and a fresh read of the cluster (`ClusterHosts.trim`): a cluster's
        autoscaler never makes them, a user's code on its primary did. One line and one `worker-trimmed`
        action each; a failure is logged and the next listing tries again."""
        if self.max_workers is None or not self._held:
            return
        held = sorted(self._held)
        types = None
        if self.types_of is not None:
            types = {cid: self.types_of(self._known[cid]) for cid in held if cid in self._known}
        try:
            ended = await self.hosts.trim(self.max_workers, held, types)
        except AutoscalerError as exc:
            log.warning("ending workers past their cluster's maximum failed", error=str(exc))
            return
        for cid, instance_id, why in ended:
            log.warning("worker ended by the keeper", cluster_id=cid, instance_id=instance_id, reason=why)
            self._emit("worker-trimmed")

    def _discovered(self, listed: Cluster) -> None:
        """Merge one listed cluster in; start its task if it is new, wake it if its state changed."""
        cid = listed.cluster_id
        self._written[cid] = max(self._written.get(cid, 0.0), listed.last_heartbeat)
        if listed.last_answered is not None:
            self._answer_written[cid] = max(self._answer_written.get(cid, 0.0), listed.last_answered)
        known = self._known.get(cid)
        merged = self._merge(listed)
        if known is None or cid not in self._tasks:
            self._adopt(merged, replace=True)
            return
        self._known[cid] = merged
        if merged.state != known.state:
            self.wake(cid)

    def _forget_unlisted(self, listed: set[str]) -> None:
        """Live clusters with a task here that the listing no longer shows are gone (their primary is
        terminated, by another replica or by hand): their tasks end. Not those created within
        `LISTING_GRACE` (a listing may miss an instance launched seconds ago: EC2 is eventually
        consistent), nor ending or failed ones (their task ends once `terminate` finds nothing alive; an
        orphan's workers are listed only every few listings)."""
        now = self.clock()
        for cid in [c for c in self._tasks if c not in listed]:
            cluster = self._known.get(cid)
            if cluster is not None and cluster.live and now - cluster.created_at >= LISTING_GRACE:
                self._known.pop(cid, None)
                self.wake(cid)

    async def stop(self) -> None:
        """Stop every cluster task, then release their leases (another replica takes the clusters over
        at once). The ids are taken first: each task leaves `_tasks` as it ends."""
        self._stopping = True
        if self.replicas is not None:
            with contextlib.suppress(AutoscalerError):
                await self.replicas.leave()
        held = list(self._tasks)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for cid in held:
            with contextlib.suppress(AutoscalerError):
                await self.locks.release(_lease(cid))
        self._tasks.clear()
        self._held.clear()

    def wake(self, cluster_id: str) -> None:
        """Check this cluster now (an event for it), not at its next interval."""
        event = self._wake.get(cluster_id)
        if event is not None:
            event.set()

    def _adopt(self, cluster: Cluster, *, replace: bool = False) -> None:
        cid = cluster.cluster_id
        if replace or cid not in self._known:
            self._known[cid] = cluster
        if cid not in self._tasks and not self._stopping:
            self._wake[cid] = asyncio.Event()
            self._tasks[cid] = asyncio.create_task(self._watch(cid), name=f"keeper:{cid}")
        self.wake(cid)

    def _merge(self, listed: Cluster) -> Cluster:
        """A listed cluster with the newer heartbeat and answer times this replica holds in memory."""
        known = self._known.get(listed.cluster_id)
        if known is None:
            return listed
        answered = max(filter(None, (known.last_answered, listed.last_answered)), default=None)
        state = listed.state if listed.state != ClusterState.STARTING else known.state
        return dataclasses.replace(
            listed,
            state=state,
            last_heartbeat=max(known.last_heartbeat, listed.last_heartbeat),
            last_answered=answered,
        )

    async def _watch(self, cid: str) -> None:
        """The cluster's own task: check it on its interval or when woken, while this replica holds
        its lease; end when the cluster is gone."""
        wake = self._wake[cid]
        try:
            # Not `while True`: a client library that swallows the cancellation from `stop` (seen in the
            # end-to-end tests) would keep a stopped keeper checking, and ending, its clusters.
            while not self._stopping:
                await _wait(wake, self.interval)
                wake.clear()
                if cid not in self._known:
                    break  # gone from the listing
                try:
                    if not await self._take(cid):
                        self._held_since.pop(cid, None)  # another replica holds it (and its hold)
                        self._present.pop(cid, None)
                        self._holding.discard(cid)
                    elif await self.check(cid):
                        break
                except AutoscalerError as exc:
                    log.warning("cluster check failed", cluster=cid, error=str(exc))
        finally:
            self._tasks.pop(cid, None)
            self._wake.pop(cid, None)
            self._held_since.pop(cid, None)
            self._present.pop(cid, None)
            self._holding.discard(cid)
            self._held.discard(cid)
            if not self._stopping:
                with contextlib.suppress(AutoscalerError):
                    await self.locks.release(_lease(cid))

    async def _take(self, cid: str) -> bool:
        """Whether this replica holds the cluster's lease for its next check: claimed or refreshed while
        within its share, left to the others beyond it, given up when it holds more (`shares`). Claims
        on their way count against the share (concurrent tasks never claim past it); a task kept out
        only by those waits for them to end, since a failed one frees its place."""
        holding = cid in self._held
        while True:
            held = len(self._held) + (0 if holding else len(self._claiming))
            clusters, replicas = len(self._tasks), self.replica_count
            step = lease_step(holding=holding, held=held, clusters=clusters, replicas=replicas)
            if (
                step is not LeaseStep.SKIP
                or not self._claiming
                or len(self._held) >= share(clusters, replicas)
            ):
                break
            async with self._claimed:
                await self._claimed.wait()
        if step is LeaseStep.SKIP:
            return False
        if step is LeaseStep.RELEASE:
            self._held.discard(cid)
            await self.locks.release(_lease(cid))
            log.info("lease given up: more than this replica's share", cluster=cid, held=len(self._held))
            return False
        self._claiming.add(cid)
        took = False
        try:
            took = await self.locks.claim(_lease(cid), self.lease_ttl)
        finally:
            self._claiming.discard(cid)
            (self._held.add if took else self._held.discard)(cid)
            async with self._claimed:
                self._claimed.notify_all()
        if took and not holding:
            log.info("lease taken", cluster=cid, held=len(self._held))
        return took

    async def check(self, cid: str) -> bool:
        """One check of one cluster (`lifecycle.decide`); True when the cluster is gone for good."""
        cluster = self._known.get(cid)
        if cluster is None:
            return True
        self.checks += 1
        since = self._held_since.setdefault(cid, self.clock())
        probe = await self._probe(cluster)
        now = self.clock()
        timing = dataclasses.replace(self.timing, heartbeat_lag=self.write_every)
        present = self._presence(cid, probe, now)
        ends_at = self.budget_ends_at(cluster)
        if ends_at is not None and ends_at <= now and self.limits is not None:
            # The budget view is read on its own interval: an end that may rest on it re-reads the
            # wallet first (a budget raised a moment ago must not end the cluster).
            try:
                fresh = await self.limits.over_budget({cluster.key.wallet_id}, now)
            except AutoscalerError as exc:  # unreadable: no decision on a stale view; the next check retries
                log.warning("reading the budget before its end failed", cluster=cid, error=str(exc))
                return False
            ran_out = fresh.get(cluster.key.wallet_id)
            ends_at = None if ran_out is None else ran_out + self.timing.budget_grace
        decision = decide(
            cluster, probe, now, timing, held_since=since, present_since=present, budget_ends_at=ends_at
        )
        cluster = await self._apply(cluster, decision, now)
        if not decision.terminate:
            await self._hold(cluster, ends_at)
            return False
        if not await self.locks.claim(_lease(cid), self.lease_ttl):
            self._held.discard(cid)  # it ran out during this check: another replica may hold it now
            return False
        alive = await self.hosts.terminate(cid)
        if alive:
            return False
        self._emit("ended" if cluster.state == ClusterState.ENDING else "failed")
        log.info("cluster gone", cluster=cid, state=str(cluster.state), reason=cluster.reason)
        for memo in (self._known, self._written, self._answer_written, self._held_since, self._present):
            memo.pop(cid, None)
        return True

    async def _probe(self, cluster: Cluster) -> Probe | None:
        """The scheduler's health and work; its clients too when that can end it (running, no work)."""
        if not cluster.dashboard_url or not cluster.live:
            return None
        probe = await self.probe.probe(cluster.dashboard_url)
        if (
            self.clients is None
            or self.timing.no_client_timeout <= 0
            or cluster.state != ClusterState.RUNNING
            or not probe.answered
            or probe.busy
        ):
            return probe
        return dataclasses.replace(probe, clients=await self.clients.clients(cluster))

    async def _hold(self, cluster: Cluster, ends_at: float | None) -> None:
        """Hold a running cluster's launches while its wallet is over budget (told again at every check:
        its scheduler may have restarted), saying so in its reason; lift the hold once it is not."""
        cid = cluster.cluster_id
        if self.clients is None or cluster.state != ClusterState.RUNNING:
            return
        if ends_at is None:
            # Held by this replica, or (the reason in its tags says) by one it took the cluster over from.
            held = cid in self._holding or HOLD_REASON in cluster.reason
            if held and await self.clients.hold_launches(cluster, ""):
                self._holding.discard(cid)
                await self.hosts.update(cid, reason="")
                self._known[cid] = dataclasses.replace(cluster, reason="")
                log.info("launches resumed: the wallet is within its budget again", cluster=cid)
            return
        ends = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ends_at))
        reason = f"its wallet {cluster.key.wallet_id} {HOLD_REASON}; ends at {ends}"
        if not await self.clients.hold_launches(cluster, reason):
            return
        if cid not in self._holding or cluster.reason != reason:
            self._holding.add(cid)
            await self.hosts.update(cid, reason=reason)
            self._known[cid] = dataclasses.replace(cluster, reason=reason)
            log.warning("launches held: the wallet spent its budget", cluster=cid, ends_at=ends)

    def _presence(self, cid: str, probe: Probe | None, now: float) -> float:
        """When this replica last saw a client or work in the cluster (or first saw it answer)."""
        if (
            probe is not None
            and probe.answered
            and (probe.busy or probe.clients != 0 or cid not in self._present)
        ):
            self._present[cid] = now
        return self._present.get(cid, now)

    async def _apply(self, cluster: Cluster, decision: Decision, now: float) -> Cluster:
        updated = dataclasses.replace(
            cluster,
            state=decision.state or cluster.state,
            last_heartbeat=max(cluster.last_heartbeat, decision.heartbeat or 0.0),
            last_answered=decision.answered if decision.answered is not None else cluster.last_answered,
            reason=decision.reason or cluster.reason,
        )
        new_state = decision.state is not None and decision.state != cluster.state
        if new_state and updated.state == ClusterState.RUNNING:
            return await self._mark_running(cluster, updated, decision)
        self._known[cluster.cluster_id] = updated
        await self._write(updated, decision, new_state)
        if new_state:
            self._announce(updated, decision.reason)
        return updated

    async def _mark_running(self, cluster: Cluster, running: Cluster, decision: Decision) -> Cluster:
        """Write `running`, unless another replica ended the cluster meanwhile (a DELETE through it):
        writing `running` over that `ending` would lose the end, and the cluster would live on until
        its idle timeout. EC2 tags have no compare-and-set, so the fresh read and the write happen
        under the cluster's state lock, which `end` holds for its own write. Not had: next check."""
        async with self.locks.exclusive(_state_lock(cluster.cluster_id), self.interval) as held:
            if not held:
                return cluster
            ended = await self._ended_meanwhile(cluster)
            if ended is not None:
                self._known[cluster.cluster_id] = ended
                return ended
            self._known[cluster.cluster_id] = running
            await self._write(running, decision, True)
        self._announce(running, decision.reason)
        return running

    def _announce(self, cluster: Cluster, reason: str) -> None:
        self._emit(str(cluster.state))
        log.info("cluster state", cluster=cluster.cluster_id, state=str(cluster.state), reason=reason)

    async def _write(self, cluster: Cluster, decision: Decision, new_state: bool) -> None:
        """Write what a restarted or other replica needs (see the module docstring), in one call."""
        cid = cluster.cluster_id
        beat = cluster.last_heartbeat - self._written.get(cid, 0.0) >= self.write_every
        answered = cluster.last_answered
        silenced = (  # it answered since the stored answer time, and did not answer now
            cluster.state == ClusterState.RUNNING
            and answered is not None
            and answered > self._answer_written.get(cid, 0.0)
            and decision.answered is None
        )
        if not (new_state or beat or silenced):
            return
        await self.hosts.update(
            cid,
            state=cluster.state if new_state else None,
            heartbeat=cluster.last_heartbeat if new_state or beat else None,
            answered=answered,
            reason=decision.reason or None,
        )
        if new_state or beat:
            self._written[cid] = cluster.last_heartbeat
        if answered is not None:
            self._answer_written[cid] = answered

    async def _ended_meanwhile(self, cluster: Cluster) -> Cluster | None:
        """The cluster as its tags say now, if it is no longer live there (ended or failed)."""
        for found in await self.hosts.find(cluster.key):
            if found.cluster_id == cluster.cluster_id and not found.live:
                return found
        return None

    def _emit(self, action: str) -> None:
        if self.on_action is not None:
            self.on_action(action)

    def listing(self, cluster_id: str) -> tuple[float, tuple[dict[str, Any], ...]] | None:
        """The workers of a cluster this replica knows, as its last listing saw them (`ClusterHosts.
        listing`): its own autoscaler reads them here instead of from EC2. None for a cluster this
        replica does not know or before its first listing."""
        if cluster_id not in self._known:
            return None
        return self.hosts.listing(cluster_id)

    def primary_arn(self, cluster_id: str) -> str | None:
        """The instance ARN of a known cluster's primary, as the last listing saw it."""
        return self.hosts.primary_arn(cluster_id) if cluster_id in self._known else None

    @property
    def clusters(self) -> tuple[Cluster, ...]:
        """The clusters this replica knows now (for metrics)."""
        return tuple(self._known.values())


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Until `event` is set or `seconds` pass. (Not `asyncio.wait_for`: on Python 3.11 it can swallow a
    cancellation that arrives as the event is set, and the task would never stop.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


def _live(found: tuple[Cluster, ...]) -> Cluster | None:
    live = [c for c in found if c.live]
    return max(live, key=lambda c: c.created_at) if live else None


def _lease(cluster_id: str) -> str:
    return f"cluster:{cluster_id}"


def _state_lock(cluster_id: str) -> str:
    """Held for one write of a cluster's state by `end` or by `_mark_running` (a round trip or two)."""
    return f"state:{cluster_id}"
