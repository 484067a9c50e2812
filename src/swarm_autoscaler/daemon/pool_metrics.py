"""Warm-pool metrics: pool machines per type and state, capacity added from the pool against new
launches, and how long a started pool machine takes to serve (start to a connected worker).

Kept apart from `metrics.py`; `Metrics.observe_tick` feeds every tick's result to `PoolMetrics.observe`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from swarm_autoscaler.core.actions import Launch, Start
from swarm_autoscaler.core.cluster import Fleet
from swarm_autoscaler.core.model import InstanceState, PoolPhase
from swarm_autoscaler.daemon.tick import TickResult

# Start latencies (seconds): a pool start takes tens of seconds, a launch minutes.
LATENCY_BUCKETS = (10, 20, 30, 45, 60, 90, 120, 180, 300, 600)
_REMEMBERED = 10_000  # started machines whose latency was observed, kept to observe each once


class PoolMetrics:
    def __init__(self, cluster: str, registry: CollectorRegistry) -> None:
        self.cluster = cluster
        self.machines = Gauge(
            "autoscaler_warm_pool_machines",
            "Warm-pool machines per instance type and state: preparing (first boot, stops itself), stopping, "
            "stopped (ready to start), starting (started, not joined yet)",
            ["cluster", "instance_type", "state"],
            registry=registry,
        )
        self.capacity = Counter(
            "autoscaler_machines_added",
            "Machines added for work or a base, by source: started from the warm pool, or launched",
            ["cluster", "instance_type", "source"],
            registry=registry,
        )
        self.start_seconds = Histogram(
            "autoscaler_pool_start_seconds",
            "From a warm-pool machine's start to its worker connected",
            ["cluster", "instance_type"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._seen: dict[str, None] = {}  # instance ids whose start latency was observed (ordered)

    def observe(self, result: TickResult) -> None:
        self._gauges(result.cluster)
        for outcome in result.outcomes:
            action = outcome.action
            if not outcome.ok:
                continue
            if isinstance(action, Start):
                self.capacity.labels(self.cluster, action.type_name, "pool").inc(len(action.instance_ids))
            elif isinstance(action, Launch) and not action.pool:
                self.capacity.labels(self.cluster, action.type_name, "launch").inc(action.count)
        now = result.snapshot.now
        for member in result.cluster.active:
            inst = member.instance
            if (
                inst is None
                or inst.pool is not PoolPhase.START
                or not member.workers
                or inst.id in self._seen
            ):
                continue
            self._seen[inst.id] = None
            self.start_seconds.labels(self.cluster, inst.type_name).observe(max(0.0, now - inst.launched_at))
        while len(self._seen) > _REMEMBERED:
            del self._seen[next(iter(self._seen))]

    def _gauges(self, cluster: Fleet) -> None:
        self.machines.clear()
        counts: dict[tuple[str, str], int] = {}
        for state, members in (
            ("preparing", cluster.preparing),
            ("stopped", cluster.stopped),
            ("starting", cluster.starting),
        ):
            for member in members:
                inst = member.instance
                name = "stopping" if inst is not None and inst.state is InstanceState.STOPPING else state
                key = (member.type_name or "unknown", name)
                counts[key] = counts.get(key, 0) + 1
        for (type_name, state), count in counts.items():
            self.machines.labels(self.cluster, type_name, state).set(count)
