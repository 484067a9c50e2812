"""The keeper's usage accounting at scale: one reading pass over 1,000 clusters (a primary and two
workers each: 3,000 machines) recorded in the real redis ledger (`RedisUsage`, a real redis-server), then
the same pass again (a restart or a second replica reading the same machines: nothing added), then a
query of every wallet. Prints each pass's time and the process's peak memory; the target is a full pass
within 5 s and 300 MB. See docs/keeper-usage.md."""

from __future__ import annotations

import asyncio
import resource
import time

from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.usage import Machine, readings
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

CLUSTERS = 1000
T0 = 1_800_000_000.0


def _machines() -> list[Machine]:
    out = []
    for n in range(CLUSTERS):
        user, wallet, cid = f"user{n % 300}", f"w{n}", f"kc-{n:016x}"
        out.append(Machine(f"i-p{n:08x}", user, wallet, cid, "m5.large", T0))
        out += [Machine(f"i-w{n:08x}{k}", user, wallet, cid, "t3.micro", T0 + 30) for k in range(2)]
    return out


async def _run() -> dict[str, float]:
    figures: dict[str, float] = {}
    with RedisServer() as server:
        ledger = RedisUsage(server.url, "bench")
        machines = _machines()
        try:
            for name, now in (
                ("first pass", T0 + 300),
                ("same pass again", T0 + 300),
                ("next pass", T0 + 330),
            ):
                started = time.perf_counter()
                added = await ledger.record(readings(machines, now), now)
                figures[f"{name} s"] = round(time.perf_counter() - started, 3)
                figures[f"{name} machines counted"] = len(added)
            started = time.perf_counter()
            rows = await ledger.query(None, None, None, None)
            figures["query every wallet s"] = round(time.perf_counter() - started, 3)
            figures["instance-seconds"] = round(sum(r.seconds for r in rows), 1)
        finally:
            await ledger.close()
    figures["peak RSS MB"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return figures


def main(flags: list[str]) -> None:
    figures = asyncio.run(_run())
    print(f"usage accounting, {CLUSTERS} clusters, {3 * CLUSTERS} machines, real redis:")
    for name, value in figures.items():
        print(f"  {name:32} {value}")
    expected = CLUSTERS * (330 + 2 * 300)
    assert figures["same pass again machines counted"] == 0, "a repeated pass counted again"
    assert abs(figures["instance-seconds"] - expected) < 1.0, figures["instance-seconds"]
