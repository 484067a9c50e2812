"""Replicas in one process (the keeper's own ports faked, as redis would share them): a replica alone
holds every cluster; when a second joins, the first gives up its surplus between two checks and the
second takes it, so each holds its share, and no cluster is ever checked by both at once; when one
stops, the other takes its clusters back."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable

from tests.keeper.fakes import FakeHosts, SharedLocks

from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper

CLUSTERS = 7
TIMING = KeeperTiming(idle_timeout=10_000.0, max_start_time=10_000.0)


class Members:
    """The live replicas, as the redis set would count them."""

    def __init__(self) -> None:
        self.alive: set[str] = set()

    def of(self, name: str) -> Replica:
        return Replica(self, name)


class Replica:
    def __init__(self, members: Members, name: str) -> None:
        self.members, self.name = members, name

    async def beat(self, ttl: float) -> int:
        self.members.alive.add(self.name)
        return len(self.members.alive)

    async def leave(self) -> None:
        self.members.alive.discard(self.name)


class WatchedProbe:
    """A scheduler that answers after a moment, noting which replicas are checking each cluster."""

    def __init__(self, name: str, checking: dict[str, set[str]], overlaps: list[str]) -> None:
        self.name, self.checking, self.overlaps = name, checking, overlaps

    async def probe(self, url: str) -> Probe:
        now = self.checking[url]
        now.add(self.name)
        if len(now) > 1:
            self.overlaps.append(url)
        try:
            await asyncio.sleep(0.005)
        finally:
            now.discard(self.name)
        return Probe(answered=True, busy=True)


async def _until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.01)


async def test_a_joining_replica_gets_its_share_from_the_first_and_a_stopping_one_hands_back() -> None:
    hosts, locks, members = FakeHosts(), SharedLocks(time.time), Members()
    for n in range(CLUSTERS):
        await hosts.create(ClusterKey(f"user{n}", "w"), time.time())
    checking: dict[str, set[str]] = defaultdict(set)
    overlaps: list[str] = []

    def replica(name: str) -> Keeper:
        return Keeper(
            hosts, WatchedProbe(name, checking, overlaps), locks.for_replica(name), TIMING,
            interval=0.02, clock=time.time, lock_ttl=0.5, replicas=members.of(name),
        )  # fmt: skip

    a, b = replica("a"), replica("b")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    run_a = asyncio.create_task(a.run(stop_a))
    try:
        await _until(lambda: a.held == CLUSTERS)
        run_b = asyncio.create_task(b.run(stop_b))
        await _until(lambda: (a.held, b.held) in ((4, 3), (3, 4)) and a.replica_count == 2)
        await asyncio.sleep(0.3)  # steady: nobody takes or gives up more
        assert sorted((a.held, b.held)) == [3, 4]
        owners = {name: owner for name, (owner, _) in locks.leases.items()}
        assert sorted(owners.values()).count("a") == a.held and len(owners) == CLUSTERS

        stop_b.set()
        await run_b
        await _until(lambda: a.held == CLUSTERS and a.replica_count == 1)
    finally:
        stop_a.set()
        stop_b.set()
        await run_a
    assert overlaps == []  # no cluster was ever checked by both replicas at once
