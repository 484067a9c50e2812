"""The keeper at scale: 1,000 clusters in one keeper over in-memory ports.

Measures, per repetition, the time from discovery (one listing) until every cluster's own task has
checked it once (claimed its lease, probed its scheduler, decided), and the process's resident memory
with the 1,000 tasks alive. Targets: all checked within 5 s, under 300 MB. Each cluster's
scheduler answers (half of them with work), so every check takes the full path.

Then the account's EC2 request rate at 1,000 clusters: the keeper over the same in-memory ports for a
few check intervals (each port call counted as the EC2 requests `Ec2Primaries` makes for it: one
DescribeInstances page per 1,000 instances listed, one CreateTags per write), plus each cluster's own
autoscaler listing its instances every tick, which now reads the keeper's listing (no EC2 request, as
the moto test of `KeeperListedCloud` counts; before, one DescribeInstances each per tick). Target: at most 2 requests per second in all, however many
clusters (the account's refill rate for DescribeInstances is 20 per second).

Then the same 1,000 clusters as deployed (`bench/keeper_replicas.py`): usage accounting on, real redis
for the leases, the ledger and the budgets, in 1 and in 3 replica processes, side by side.

Run: `python -m bench keeper` (or `make bench`). `--quick` runs fewer repetitions.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import statistics
import time
from typing import Any

import structlog

from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.model import Cluster, ClusterKey
from swarm_autoscaler.keeper.service import Keeper

CLUSTERS = 1000


async def one_run() -> tuple[float, float]:
    from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

    now = time.time()
    hosts, probe = FakeHosts(), FakeProbe()
    locks = SharedLocks(time.time)
    for i in range(CLUSTERS):
        cluster = await hosts.create(ClusterKey.parse(f"user{i}", "none"), now)
        probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=i % 2 == 0)
    keeper = Keeper(hosts, probe, locks.for_replica("bench"), KeeperTiming(), interval=30.0)
    started = time.perf_counter()
    await keeper.discover()
    for _ in range(12_000):  # at most a minute
        if keeper.checks >= CLUSTERS:
            break
        await asyncio.sleep(0.005)
    seconds = time.perf_counter() - started
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    await keeper.stop()
    if keeper.checks < CLUSTERS:
        raise SystemExit(f"only {keeper.checks} of {CLUSTERS} clusters were checked within a minute")
    return seconds, rss_mb


WORKERS_EACH = 3  # workers per cluster in the listing (1,000 clusters: 4,000 instances, 4 pages)
PAGE = 1000  # instances per DescribeInstances page (the adapters' page size)
TICK_S = 5.0  # the daemon's and the keeper's default interval


async def request_rate(interval: float = 0.25, intervals: int = 8) -> dict[str, float]:
    """EC2 requests per second for 1,000 clusters at the default interval: the keeper's, measured over
    `intervals` check intervals of `interval` seconds and scaled to `TICK_S`, and the clusters'
    autoscalers' (each lists its instances once per tick)."""
    from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

    class Counted(FakeHosts):
        """FakeHosts counting the EC2 requests `Ec2Primaries` would make for each call."""

        def __init__(self) -> None:
            super().__init__()
            self.requests: dict[str, int] = {"DescribeInstances": 0, "CreateTags": 0}

        async def list_clusters(self) -> tuple[Cluster, ...]:
            listed = await super().list_clusters()
            instances = len(listed) * (1 + WORKERS_EACH)
            self.requests["DescribeInstances"] += max(1, -(-instances // PAGE))
            return listed

        async def find(self, key: ClusterKey) -> tuple[Cluster, ...]:
            self.requests["DescribeInstances"] += 1
            return await super().find(key)

        async def update(self, cluster_id: str, **fields: Any) -> None:
            await super().update(cluster_id, **fields)
            if any(v is not None for v in fields.values()):
                self.requests["CreateTags"] += 1

    now = time.time()
    hosts, probe = Counted(), FakeProbe()
    for i in range(CLUSTERS):
        cluster = await hosts.create(ClusterKey.parse(f"user{i}", "none"), now)
        probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=i % 2 == 0)
    keeper = Keeper(
        hosts, probe, SharedLocks(time.time).for_replica("bench"), KeeperTiming(), interval=interval
    )
    stop = asyncio.Event()
    running = asyncio.create_task(keeper.run(stop))
    await asyncio.sleep(2 * interval)  # past the first checks (every cluster turns running: one write)
    before = dict(hosts.requests)
    await asyncio.sleep(intervals * interval)
    stop.set()
    await running
    scale = interval / TICK_S / (intervals * interval)  # per second at the default interval
    keeper_reads = (hosts.requests["DescribeInstances"] - before["DescribeInstances"]) * scale
    # Writes follow time, not checks: a busy cluster's heartbeat is written once per `write_every` (75 s
    # at the default idle timeout), which a window of a few short intervals cannot see: from the rule.
    busy = sum(1 for i in range(CLUSTERS) if i % 2 == 0)
    default_every = Keeper(hosts, probe, SharedLocks(time.time).for_replica("x"), KeeperTiming()).write_every
    return {
        "keeper_reads": keeper_reads,
        "keeper_writes": busy / default_every,
        "write_every": default_every,
        "autoscalers_before": CLUSTERS / TICK_S,  # one DescribeInstances per cluster per tick
    }


def main(flags: list[str]) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    repeats = 3 if "--quick" in flags else 7
    runs = [asyncio.run(one_run()) for _ in range(repeats)]
    times = [t for t, _ in runs]
    peak = max(m for _, m in runs)
    print(f"{CLUSTERS} clusters, {repeats} runs: every cluster checked once in")
    print(
        f"  median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}); target < 5 s"
    )
    print(f"  peak resident memory {peak:.0f} MB (whole process); target < 300 MB")
    rate = asyncio.run(request_rate())
    reads = rate["keeper_reads"]
    print(f"  EC2 read requests per second at {CLUSTERS} clusters (checks and ticks every {TICK_S:g} s):")
    print(
        f"    keeper: DescribeInstances {rate['keeper_reads']:.2f}/s (one paged listing for every cluster's "
        f"primary and {WORKERS_EACH} workers, measured)"
    )
    print(
        "    clusters' autoscalers: none (they read the keeper's listing, adapters.keeper_listing; before, "
        f"one DescribeInstances each per tick: {rate['autoscalers_before']:.0f}/s)"
    )
    print(f"    reads in all {reads:.2f}/s; target <= 2/s")
    print(
        f"  writes (CreateTags, EC2's own bucket): {rate['keeper_writes']:.2f}/s, the heartbeats of "
        f"{CLUSTERS // 2} busy clusters, one each per {rate['write_every']:g} s (the keeper's rule)"
    )
    from bench import keeper_replicas

    keeper_replicas.report(keeper_replicas.measure(3 if "--quick" in flags else 5))
