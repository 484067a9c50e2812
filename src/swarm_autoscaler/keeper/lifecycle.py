"""decide(cluster, probe, now, timing) -> Decision: what one check of one cluster changes. Pure.

The rules, in order:

1. An `ending` or `failed` cluster: terminate whatever of it is still alive.
2. A `starting` cluster whose scheduler answers becomes `running`. One not answering after
   `max_start_time` since it was created fails, with the reason, and its machines are terminated.
3. Work in the scheduler (tasks processing, waiting or unrunnable) is a heartbeat: a keeper restarted
   with stale heartbeats must never end a cluster that is busy (osparc lost busy clusters that way).
4. A `running` cluster unused for `idle_timeout` (no heartbeat and no work in its scheduler) ends, once
   `heartbeat_lag` more has passed: the last heartbeat a replica knows may be older than the last use by
   up to that much (heartbeats are written to tags at most that often), so it never ends one early.
5. A `running` cluster whose scheduler stopped answering ends once it has not answered for
   `idle_timeout`, counted from no earlier than when the deciding replica began to hold it.
6. No client, no cluster: a `running` cluster whose scheduler answers with no work and no client
   (`Probe.clients == 0`; the cluster's own autoscaler is not one) ends once that has lasted
   `no_client_timeout` (0: never), counted from the last time the deciding replica saw a client or work
   (`present_since`), and from no earlier than when it began to hold the cluster and first saw it
   answer: a replica that has not watched it that long never ends it. A count it cannot read (None)
   counts as a client present. Heartbeats do not keep such a cluster: the scheduler says who uses it.
7. A live cluster whose wallet has spent its budget ends once `budget_grace` has passed since the
   wallet was first found over it (`budget_ends_at`); until then it only stops growing (the service
   holds its launches): nothing running is ended without that grace.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm_autoscaler.keeper.model import Cluster, ClusterState


@dataclass(frozen=True, slots=True)
class Probe:
    """One look at a cluster's scheduler: whether it answered, and whether it has work."""

    answered: bool
    busy: bool = False
    clients: int | None = None  # clients present (`ports.SchedulerClients`); None: not read


@dataclass(frozen=True, slots=True)
class KeeperTiming:
    """Seconds. `idle_timeout`: unused this long, a cluster ends. `max_start_time`: a primary whose
    scheduler does not answer within this long fails. `heartbeat_lag`: how much older than the last use
    a known heartbeat may be (the keeper's tag write interval); added to the idle timeout.
    `no_client_timeout`: with no client and no work this long, a cluster ends (0: never).
    `budget_grace`: how long a cluster of a wallet over its budget lives on, not growing."""

    idle_timeout: float = 300.0
    max_start_time: float = 600.0
    heartbeat_lag: float = 0.0
    no_client_timeout: float = 0.0
    budget_grace: float = 600.0


@dataclass(frozen=True, slots=True)
class Decision:
    """What to write and do. None fields change nothing."""

    state: ClusterState | None = None
    heartbeat: float | None = None
    answered: float | None = None
    terminate: bool = False
    reason: str = ""

    @property
    def changes_anything(self) -> bool:
        return self.state is not None or self.heartbeat is not None or self.answered is not None


def decide(
    cluster: Cluster,
    probe: Probe | None,
    now: float,
    timing: KeeperTiming,
    held_since: float = 0.0,
    present_since: float | None = None,
    budget_ends_at: float | None = None,
) -> Decision:
    """What this check changes (see the module docstring). `probe` is None when the scheduler was not
    probed (no address yet). `held_since`: when the deciding replica began to hold the cluster; its
    scheduler's silence counts from no earlier (answers before may not be in the tags it read).
    `present_since`: when that replica last saw a client or work there (None: `now`).
    `budget_ends_at`: when its wallet's budget grace ends (None: within its budget)."""
    if cluster.state in (ClusterState.ENDING, ClusterState.FAILED):
        return Decision(terminate=True, reason=cluster.reason)
    if budget_ends_at is not None and now >= budget_ends_at:
        reason = (
            f"its wallet {cluster.key.wallet_id} spent its budget; ended after the "
            f"{timing.budget_grace:g}s grace"
        )
        return Decision(ClusterState.ENDING, terminate=True, reason=reason)
    answered = probe is not None and probe.answered
    seen = now if answered else None
    if cluster.state == ClusterState.STARTING:
        if answered:
            return Decision(ClusterState.RUNNING, heartbeat=now, answered=seen)
        age = now - cluster.created_at
        if age >= timing.max_start_time:
            reason = f"its scheduler did not answer within {timing.max_start_time:g}s of creation"
            return Decision(ClusterState.FAILED, terminate=True, reason=reason)
        return Decision()
    return _running(cluster, probe, now, timing, held_since, now if present_since is None else present_since)


def _running(
    cluster: Cluster, probe: Probe | None, now: float, timing: KeeperTiming, held_since: float, present: float
) -> Decision:
    if probe is not None and probe.answered:
        if probe.busy:
            return Decision(heartbeat=now, answered=now)
        idle = now - cluster.last_heartbeat
        if idle >= timing.idle_timeout + timing.heartbeat_lag:
            reason = f"unused for {idle:.0f}s (idle timeout {timing.idle_timeout:g}s)"
            return Decision(ClusterState.ENDING, answered=now, terminate=True, reason=reason)
        absent = now - max(present, held_since)
        if timing.no_client_timeout > 0 and probe.clients == 0 and absent >= timing.no_client_timeout:
            reason = (
                f"no client and no work for {absent:.0f}s (no-client timeout {timing.no_client_timeout:g}s)"
            )
            return Decision(ClusterState.ENDING, answered=now, terminate=True, reason=reason)
        return Decision(answered=now)
    last = cluster.last_answered if cluster.last_answered is not None else cluster.created_at
    silent = now - max(last, held_since)
    if silent >= timing.idle_timeout:
        reason = f"its scheduler has not answered for {silent:.0f}s (idle timeout {timing.idle_timeout:g}s)"
        return Decision(ClusterState.ENDING, terminate=True, reason=reason)
    return Decision()
