"""The keeper at scale: 1,000 clusters in one keeper over in-memory ports.

Measures, per repetition, the time from discovery (one listing) until every cluster's own task has
checked it once (claimed its lease, probed its scheduler, decided), and the process's resident memory
with the 1,000 tasks alive. Targets: all checked within 5 s, under 300 MB. Each cluster's
scheduler answers (half of them with work), so every check takes the full path.

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

import structlog

from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.model import ClusterKey
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
    from bench import keeper_replicas

    keeper_replicas.report(keeper_replicas.measure(3 if "--quick" in flags else 5))
