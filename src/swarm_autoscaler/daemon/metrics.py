"""Prometheus metrics and the /healthz, /metrics HTTP endpoints (aiohttp).

Each daemon owns its own registry (no global state), so several daemons or tests can live in one
process. `Metrics.observe_tick` is the loop's tick hook; `Metrics.follow(daemon)` makes the gauges that
must tell the truth even while ticks fail or hang (leadership, staleness) read the daemon at scrape time.

After a failed tick the gauges describing the world (buckets, pending...) keep the values of the last
successful tick; `autoscaler_last_tick_ok` 0 and `autoscaler_snapshot_age_seconds` say they are stale,
and `autoscaler_is_leader` says 0 unless the lock was confirmed within its TTL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from swarm_autoscaler.daemon.ec2_metrics import Ec2Metrics
from swarm_autoscaler.daemon.pool_metrics import PoolMetrics
from swarm_autoscaler.daemon.tick import TickResult

# /healthz turns 503 when the last successful tick is older than this many poll intervals.
STALE_TICKS = 3


class DaemonState(Protocol):
    """What the daemon knows at any moment, read at scrape time (see `loop.Daemon`)."""

    def is_leader(self) -> bool: ...

    def snapshot_age(self) -> float | None: ...


class Metrics:
    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.registry = CollectorRegistry()
        r = self.registry
        self.buckets = Gauge(
            "autoscaler_bucket_size",
            "Machines per lifecycle bucket and instance type",
            ["cluster", "bucket", "instance_type"],
            registry=r,
        )
        self.pending = Gauge(
            "autoscaler_pending_tasks", "Tasks waiting for capacity", ["cluster"], registry=r
        )
        self.cordoned = Gauge(
            "autoscaler_cordoned_nodes",
            "Active nodes whose worker the daemon cordoned (consolidation: no new tasks, so it empties)",
            ["cluster"],
            registry=r,
        )
        self.unplaceable = Gauge(
            "autoscaler_unplaceable_tasks", "Tasks no allowed instance type can run", ["cluster"], registry=r
        )
        self.held = Gauge(
            "autoscaler_disruptions_held",
            "Machines whose disruption the last plan held back, by reason (empty, consolidation, drift, "
            "expiry) and by what held it (budget, do-not-disrupt)",
            ["cluster", "reason", "by"],
            registry=r,
        )
        self.halted = Gauge(
            "autoscaler_scale_down_halted",
            "1 while the safety stop halts scale-down (too many of our nodes down or unreachable), else 0",
            ["cluster"],
            registry=r,
        )
        self.actions = Counter(
            "autoscaler_actions",
            "Actions carried out, by kind and outcome",
            ["cluster", "kind", "outcome"],
            registry=r,
        )
        self.deferred = Counter(
            "autoscaler_actions_deferred",
            "Actions left to the next tick by the tick's deadline (not started, or cut at the hard stop), by kind",
            ["cluster", "kind"],
            registry=r,
        )
        self.oldest_waiting = Gauge(
            "autoscaler_oldest_waiting_action_seconds",
            "Seconds the oldest action planned again tick after tick and not yet carried out has waited",
            ["cluster"],
            registry=r,
        )
        self.launch_failures = Counter(
            "autoscaler_launch_failures", "Failed launches by reason", ["cluster", "reason"], registry=r
        )
        self.tick_seconds = Histogram(
            "autoscaler_tick_duration_seconds",
            "Duration of one tick (observe, plan, act)",
            ["cluster"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.tick_errors = Counter("autoscaler_tick_errors", "Ticks that failed", ["cluster"], registry=r)
        self.tick_errors.labels(cluster)  # exported as 0 from the start, not absent until the first error
        self.leader = Gauge(
            "autoscaler_is_leader",
            "1 while this replica holds the leader lock as last confirmed within its TTL; 0 on standby or "
            "when the lock could not be confirmed",
            ["cluster"],
            registry=r,
        )
        self.last_tick_ok = Gauge(
            "autoscaler_last_tick_ok",
            "1 when the last tick observed, planned and acted without error; 0 when it failed (the other "
            "gauges then still describe the last successful tick)",
            ["cluster"],
            registry=r,
        )
        self.snapshot_age = Gauge(
            "autoscaler_snapshot_age_seconds",
            "Seconds since the snapshot the other gauges describe was taken (grows while ticks fail or hang)",
            ["cluster"],
            registry=r,
        )
        self.last_success = Gauge(
            "autoscaler_last_successful_tick_timestamp_seconds",
            "Epoch of the last successful tick",
            ["cluster"],
            registry=r,
        )
        self.instances = Gauge(
            "autoscaler_instances",
            "Machines counted against AUTOSCALER_EC2_MAX_INSTANCES: owned instances pending or running "
            "(stopped warm-pool machines do not count)",
            ["cluster"],
            registry=r,
        )
        self.max_instances = Gauge(
            "autoscaler_max_instances",
            "AUTOSCALER_EC2_MAX_INSTANCES: most machines at once",
            ["cluster"],
            registry=r,
        )
        self.interruption_notices = Counter(
            "autoscaler_interruption_notices",
            "Messages read from the interruption queue, by kind: spot-interruption, rebalance, "
            "scheduled-change (for machines of ours), not-ours, ignored (another event), malformed (deleted)",
            ["cluster", "kind"],
            registry=r,
        )
        self.pool = PoolMetrics(cluster, r)
        self.ec2 = Ec2Metrics(cluster, r)  # follows the EC2 adapter's counts (`app.open_daemon`)

    def count_notice(self, kind: str) -> None:
        """One message of the interruption queue, of `kind` (see `adapters.ec2_interruptions.KINDS`)."""
        self.interruption_notices.labels(self.cluster, kind).inc()

    def follow(self, daemon: DaemonState) -> None:
        """Read leadership and staleness from `daemon` at every scrape: they stay true while a tick hangs."""
        self.leader.labels(self.cluster).set_function(lambda: 1.0 if daemon.is_leader() else 0.0)

        def age() -> float:
            seconds = daemon.snapshot_age()
            return math.nan if seconds is None else seconds

        self.snapshot_age.labels(self.cluster).set_function(age)

    def observe_tick(self, result: TickResult | None, seconds: float, error: BaseException | None) -> None:
        self.tick_seconds.labels(self.cluster).observe(seconds)
        ok = result is not None and error is None
        self.last_tick_ok.labels(self.cluster).set(1 if ok else 0)
        if result is None:
            self.tick_errors.labels(self.cluster).inc()
            return
        self.last_success.labels(self.cluster).set(result.snapshot.now)
        self.pending.labels(self.cluster).set(result.plan.pending)
        self.unplaceable.labels(self.cluster).set(len(result.plan.unplaceable))
        self.halted.labels(self.cluster).set(1 if result.plan.halted else 0)
        self.held.clear()
        for reason in ("empty", "consolidation", "drift", "expiry"):
            for by in ("budget", "do-not-disrupt"):
                count = sum(1 for h in result.plan.held if (h.reason, h.by) == (reason, by))
                self.held.labels(self.cluster, reason, by).set(count)
        self.instances.labels(self.cluster).set(sum(1 for i in result.snapshot.instances if i.alive))
        self.max_instances.labels(self.cluster).set(result.policy.max_instances)
        self.buckets.clear()
        for (bucket, type_name), count in result.cluster.counts_by_type().items():
            self.buckets.labels(self.cluster, bucket, type_name).set(count)
        self.cordoned.labels(self.cluster).set(sum(1 for m in result.cluster.active if m.cordoned))
        self.pool.observe(result)
        self.oldest_waiting.labels(self.cluster).set(result.waiting)
        for outcome in result.outcomes:
            if outcome.kind == "deadline":
                self.deferred.labels(self.cluster, outcome.action_kind).inc()
            label = "ok" if outcome.ok else outcome.kind or "error"
            self.actions.labels(self.cluster, outcome.action_kind, label).inc()
            if outcome.action_kind == "Launch" and not outcome.ok:
                self.launch_failures.labels(self.cluster, outcome.kind or "error").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def build_app(
    metrics: Metrics,
    last_success: Callable[[], float | None],
    poll_interval: float,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """/healthz: 200 while ticks succeed, 503 with the reason when the last success is too old.
    /metrics: the Prometheus text format."""

    async def healthz(_: web.Request) -> web.Response:
        last = last_success()
        limit = STALE_TICKS * poll_interval + 5.0
        if last is None:
            return web.json_response({"status": "starting", "reason": "no successful tick yet"}, status=503)
        age = clock() - last
        if age > limit:
            reason = f"last successful tick {age:.0f}s ago (limit {limit:.0f}s); see the daemon's logs"
            return web.json_response({"status": "stale", "reason": reason}, status=503)
        return web.json_response({"status": "ok", "last_tick_age_s": round(age, 3)})

    async def metrics_handler(_: web.Request) -> web.Response:
        body = metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_handler)
    return app
