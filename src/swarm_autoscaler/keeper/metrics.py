"""The keeper's Prometheus metrics: clusters by state, requests by route and status, lifecycle actions.
Each keeper owns its registry (no global state)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from swarm_autoscaler.keeper.model import Cluster, ClusterState


class KeeperMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.clusters = Gauge(
            "keeper_clusters", "Clusters this replica knows, by state.", ["state"], registry=self.registry
        )
        self.requests = Counter(
            "keeper_requests_total",
            "API requests by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.actions = Counter(
            "keeper_lifecycle_actions_total",
            "Lifecycle actions: create, running, ending, failed, ended, end-requested.",
            ["action"],
            registry=self.registry,
        )

    def request(self, method: str, route: str, response: web.StreamResponse) -> None:
        self.requests.labels(method, route, str(response.status)).inc()

    def action(self, name: str) -> None:
        self.actions.labels(name).inc()

    def exposition(self, clusters: Iterable[Cluster]) -> tuple[bytes, str]:
        counts = Tally(str(c.state) for c in clusters)
        for state in ClusterState:
            self.clusters.labels(str(state)).set(counts.get(str(state), 0))
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
