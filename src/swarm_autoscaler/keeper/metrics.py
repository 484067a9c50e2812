"""The keeper's Prometheus metrics: clusters by state, requests by route and status, lifecycle actions,
usage per wallet (instance-seconds and USD counted by this replica's readings; add them up across
replicas), and the clusters held for a spent budget (label-free gauges: a count, whichever wallets;
`GET /v1/clusters` names them). Each keeper owns its registry (no global state).

Usage's label cardinality is bounded: the first `wallet_limit` (user, wallet) pairs this replica counts
get their own `user` and `wallet` label values; every later one is added to `user="_other",
wallet="_other"`. The exact figures per wallet are in `GET /v1/usage`."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from swarm_autoscaler.keeper.model import Cluster, ClusterState
from swarm_autoscaler.keeper.usage import Reading

OTHER = "_other"


class KeeperMetrics:
    def __init__(self, wallet_limit: int = 200) -> None:
        self.registry = CollectorRegistry()
        self.wallet_limit = wallet_limit
        self._wallets: set[tuple[str, str]] = set()
        self.usage_seconds = Counter(
            "keeper_usage_instance_seconds_total",
            f"Instance-seconds counted per wallet (at most {wallet_limit} wallets; the rest under _other).",
            ["user", "wallet"],
            registry=self.registry,
        )
        self.usage_cost = Counter(
            "keeper_usage_cost_usd_total",
            f"USD counted per wallet (at most {wallet_limit} wallets; the rest under _other).",
            ["user", "wallet"],
            registry=self.registry,
        )
        self.clusters = Gauge(
            "keeper_clusters", "Clusters this replica knows, by state.", ["state"], registry=self.registry
        )
        self.leases = Gauge(
            "keeper_leases_held",
            "Clusters whose lease this replica holds (it acts on these).",
            registry=self.registry,
        )
        self.replicas = Gauge(
            "keeper_replicas",
            "Live replicas of this keeper, at this replica's last count.",
            registry=self.registry,
        )
        self.budget_held = Gauge(
            "keeper_clusters_budget_held",
            "Running clusters this replica holds whose launches it holds: their wallet spent its budget "
            "(they end after the budget grace unless it is raised).",
            registry=self.registry,
        )
        self.wallets_over_budget = Gauge(
            "keeper_wallets_over_budget",
            "Wallets of the live clusters this replica knows that were over their budget at its last read.",
            registry=self.registry,
        )
        self.requests = Counter(
            "keeper_requests_total",
            "API requests by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.actions = Counter(
            "keeper_lifecycle_actions_total",
            "Lifecycle actions: create, running, ending, failed, ended, end-requested, worker-trimmed (a worker "
            "past its cluster's maximum or naming another cluster's primary, ended by the keeper).",
            ["action"],
            registry=self.registry,
        )

    def request(self, method: str, route: str, response: web.StreamResponse) -> None:
        self.requests.labels(method, route, str(response.status)).inc()

    def counted(self, added: Sequence[Reading]) -> None:
        """Usage this replica's reading added (`UsageAccountant.on_counted`)."""
        for reading in added:
            pair = (reading.machine.user_id, reading.machine.wallet_id)
            if pair not in self._wallets and len(self._wallets) < self.wallet_limit:
                self._wallets.add(pair)
            labels = pair if pair in self._wallets else (OTHER, OTHER)
            self.usage_seconds.labels(*labels).inc(reading.seconds)
            self.usage_cost.labels(*labels).inc(reading.seconds * reading.price_per_second)

    def action(self, name: str) -> None:
        self.actions.labels(name).inc()

    def exposition(
        self,
        clusters: Iterable[Cluster],
        held: int = 0,
        replicas: int = 1,
        *,
        budget_held: int = 0,
        wallets_over_budget: int = 0,
    ) -> tuple[bytes, str]:
        self.leases.set(held)
        self.replicas.set(replicas)
        self.budget_held.set(budget_held)
        self.wallets_over_budget.set(wallets_over_budget)
        counts = Tally(str(c.state) for c in clusters)
        for state in ClusterState:
            self.clusters.labels(str(state)).set(counts.get(str(state), 0))
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
