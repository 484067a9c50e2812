"""One keeper replica for `bench/keeper_replicas.py`, run as its own process:
`python -m bench.keeper_replica <redis url> <keeper name>`.

It builds the same 1,000 clusters every replica lists (in-memory hosts and scheduler probe, our own
ports: EC2 and dask are measured by other benchmarks), and a keeper over the real redis adapters of
production (`RedisLocks` for the leases and the replicas' presence, `RedisUsage` for the usage ledger,
`RedisBudgets` for the budgets) with the settings' default intervals, usage accounting on over the
clusters' 3,000 machines and a default budget (so budgets are read too). Then, on stdin and stdout (one
JSON object a line):

    -> {"ready": true}                    its presence is in redis (the others can count it)
    <- go                                 count the replicas, then run (`Keeper.run`)
    -> {"checked": n, "usage": bool}      as it goes: distinct clusters it checked, usage pass done
    <- stop
    -> {"final": {...}}                   first-check times, lease count, peak RSS, ...

Times are `time.monotonic()` (CLOCK_MONOTONIC: one clock for every process of the host).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
import time
from typing import Any

import structlog

from swarm_autoscaler.keeper.adapters.redis_budgets import RedisBudgets
from swarm_autoscaler.keeper.adapters.redis_leases import RedisLocks
from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.limits import Limits
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.keeper.usage import Machine, Reading, UsageAccountant

CLUSTERS = 1000
CHECK_INTERVAL = 5.0  # the settings' defaults
LOCK_TTL = 15.0
USAGE_INTERVAL = 30.0
BUDGET_USD = 1_000.0  # a default budget no wallet reaches: every wallet's budget is read, none is held


def emit(payload: dict[str, Any]) -> None:
    print(json.dumps(payload), flush=True)


class Machines:
    """`keeper.usage.MachineSource`: a primary and two workers per cluster."""

    def __init__(self, machines: list[Machine]) -> None:
        self._machines = machines

    async def machines(self) -> list[Machine]:
        return list(self._machines)


class TimedAccountant(UsageAccountant):
    first_pass_at: float | None = None

    async def account(self) -> list[Reading]:
        added = await super().account()
        if self.first_pass_at is None:
            self.first_pass_at = time.monotonic()
        return added


class TimedLimits(Limits):
    first_read_at: float | None = None

    async def over_budget(self, wallets: set[str], now: float) -> dict[str, float]:
        over = await super().over_budget(wallets, now)
        if self.first_read_at is None and wallets:
            self.first_read_at = time.monotonic()
        return over


async def _replica(url: str, name: str) -> None:
    from tests.keeper.fakes import FakeHosts, FakeProbe

    class RecordingProbe(FakeProbe):
        """When each cluster was first probed: its first check by this replica."""

        def __init__(self) -> None:
            super().__init__()
            self.first: dict[str, float] = {}

        async def probe(self, url: str) -> Probe:
            self.first.setdefault(url, time.monotonic())
            return await super().probe(url)

    hosts, probe = FakeHosts(), RecordingProbe()
    now = time.time()
    machines: list[Machine] = []
    for n in range(CLUSTERS):
        cluster = await hosts.create(ClusterKey.parse(f"user{n % 300}", f"w{n}"), now)
        probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=n % 2 == 0)
        user, wallet, cid = cluster.key.user_id, cluster.key.wallet_id, cluster.cluster_id
        machines.append(Machine(f"i-p{n:08x}", user, wallet, cid, "m5.large", now - 300))
        machines += [Machine(f"i-w{n:08x}{k}", user, wallet, cid, "t3.micro", now - 270) for k in range(2)]
    locks, usage, budgets = RedisLocks(url, name), RedisUsage(url, name), RedisBudgets(url, name)
    accountant = TimedAccountant(Machines(machines), usage, USAGE_INTERVAL)
    limits = TimedLimits(default_budget=BUDGET_USD, store=budgets, usage=usage)
    keeper = Keeper(
        hosts, probe, locks, KeeperTiming(), interval=CHECK_INTERVAL, lock_ttl=LOCK_TTL,
        accountant=accountant, limits=limits, replicas=locks, budget_interval=USAGE_INTERVAL,
    )  # fmt: skip
    try:
        await locks.check()
        await locks.beat(keeper.lease_ttl)
        emit({"ready": True})
        await _final(keeper, probe.first, accountant, limits, await _run(keeper, probe.first, accountant))
    finally:
        for client in (locks, usage, budgets):
            await client.close()


async def _run(keeper: Keeper, first: dict[str, float], accountant: TimedAccountant) -> dict[str, Any]:
    """From `go` to `stop`: count the replicas, run, report progress. Returns what is known at `stop`."""
    line = await asyncio.to_thread(sys.stdin.readline)
    assert line.strip() == "go", line
    went = time.monotonic()
    await keeper.count_replicas()
    stop = asyncio.Event()
    runner = asyncio.create_task(keeper.run(stop))
    stopping = asyncio.create_task(asyncio.to_thread(sys.stdin.readline))
    shown: tuple[int, bool] = (-1, False)
    while not stopping.done():
        now = (len(first), accountant.first_pass_at is not None)
        if now != shown:
            emit({"checked": now[0], "usage": now[1]})
            shown = now
        await asyncio.wait([stopping], timeout=0.01)
    at_stop = {"went": went, "held": keeper.held, "replicas": keeper.replica_count, "checks": keeper.checks}
    stop.set()
    await runner
    return at_stop


async def _final(
    keeper: Keeper,
    first: dict[str, float],
    accountant: TimedAccountant,
    limits: TimedLimits,
    at_stop: dict[str, Any],
) -> None:
    emit(
        {
            "final": {
                **at_stop,
                "checked": sorted(first),
                "last_first_check": max(first.values(), default=None),
                "usage_pass_at": accountant.first_pass_at,
                "budgets_read_at": limits.first_read_at,
                "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        }
    )


def main() -> None:
    structlog.configure(  # warnings to stderr: stdout carries the JSON lines
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    url, name = sys.argv[1], sys.argv[2]
    asyncio.run(_replica(url, name))


if __name__ == "__main__":
    main()
