"""Counters of how EC2 treated the daemon's calls, read from the EC2 adapter's `stats` at scrape time.

The adapter counts (it sees every answer); this collector only exposes what it counted, so the counts
are the adapter's whether or not a tick finished. The families are exposed from the start, empty until
a daemon follows an adapter (`follow`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class Ec2Counts(Protocol):
    """What the collector reads of `adapters.ec2_transport.Ec2Stats`."""

    @property
    def partial_launches(self) -> int: ...

    @property
    def quota_refusals(self) -> Mapping[tuple[str, str, str], int]: ...

    @property
    def throttled(self) -> Mapping[str, int]: ...


class Ec2Metrics(Collector):
    def __init__(self, cluster: str, registry: CollectorRegistry) -> None:
        self._cluster = cluster
        self._stats: Ec2Counts | None = None
        registry.register(self)

    def follow(self, stats: Ec2Counts) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        quota = CounterMetricFamily(
            "autoscaler_ec2_quota_refusals",
            "Launches EC2 refused for an account quota (VcpuLimitExceeded, MaxSpotInstanceCountExceeded, ...), "
            "by instance type, capacity and code: raise the quota the daemon's log names",
            labels=["cluster", "instance_type", "capacity", "code"],
        )
        throttled = CounterMetricFamily(
            "autoscaler_ec2_throttled",
            "EC2 answers asking the daemon to slow down (RequestLimitExceeded and kin), by operation; each "
            "was retried with back-off",
            labels=["cluster", "operation"],
        )
        partial = CounterMetricFamily(
            "autoscaler_ec2_partial_launches",
            "RunInstances that gave fewer machines than asked (the zone had no more); the rest went to "
            "other subnets or the next tick",
            labels=["cluster"],
        )
        stats = self._stats
        if stats is not None:
            for (type_name, capacity, code), count in sorted(stats.quota_refusals.items()):
                quota.add_metric([self._cluster, type_name, capacity, code], count)
            for operation, count in sorted(stats.throttled.items()):
                throttled.add_metric([self._cluster, operation], count)
            partial.add_metric([self._cluster], stats.partial_launches)
        yield quota
        yield throttled
        yield partial
