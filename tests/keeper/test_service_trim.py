"""The keeper's side of a cluster's maximum (`Keeper.trim`), over in-memory ports: only the replica that
holds a cluster ends its excess workers (two replicas never both act on one), and a failing EC2 leaves
discovery running. The end-to-end case (moto, the real adapter, the log line) is in
`tests/adapters/ec2/test_ec2_primaries.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from structlog.testing import capture_logs
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.service import Keeper

TIMING = KeeperTiming(idle_timeout=300.0, max_start_time=600.0)


def _worker(iid: str, launched: str) -> dict[str, object]:
    """A worker as the keeper's listing gives it (`listing_entry`)."""
    return {"InstanceId": iid, "State": {"Name": "running"}, "LaunchTime": launched, "Tags": []}


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_only_the_replica_holding_a_cluster_ends_its_workers_beyond_the_maximum() -> None:
    hosts, now = FakeHosts(), [1_000_000.0]
    locks = SharedLocks(lambda: now[0])
    actions: list[str] = []

    def replica(name: str) -> Keeper:
        return Keeper(hosts, FakeProbe(), locks.for_replica(name), TIMING, interval=0.05,
                      clock=lambda: now[0], max_workers=2, on_action=actions.append)  # fmt: skip

    a, b = replica("a"), replica("b")
    cluster, _ = await a.get_or_create(ClusterKey("alice", "w1"))
    hosts.workers[cluster.cluster_id] = [
        _worker(f"i-{n}", f"2026-12-05T10:00:0{n}+00:00") for n in (3, 1, 4, 2)
    ]
    try:
        await _until(lambda: a.held == 1)
        await a.discover()
        await b.discover()  # b knows the cluster but does not hold it
        assert b.held == 0
        assert hosts.trimmed == [
            (cluster.cluster_id, "i-3", "beyond the cluster's maximum of 2"),
            (cluster.cluster_id, "i-4", "beyond the cluster's maximum of 2"),
        ]
        assert actions.count("worker-trimmed") == 2
    finally:
        await a.stop()
        await b.stop()


async def test_a_failing_trim_is_logged_and_discovery_goes_on() -> None:
    hosts, now = FakeHosts(), [1_000_000.0]
    keeper = Keeper(hosts, FakeProbe(), SharedLocks(lambda: now[0]).for_replica("a"), TIMING,
                    interval=0.05, clock=lambda: now[0], max_workers=1)  # fmt: skip

    async def unreachable(
        maximum: int, cluster_ids: Iterable[str], types: object = None
    ) -> list[tuple[str, str, str]]:
        raise EndpointError("fake EC2", "unreachable")

    hosts.trim = unreachable  # type: ignore[method-assign]  # the fake EC2 failing, not our code
    await keeper.get_or_create(ClusterKey("alice", "w1"))
    try:
        await _until(lambda: keeper.held == 1)
        with capture_logs() as logs:
            await keeper.discover()
        assert keeper.last_discovery == now[0]
        assert [r["event"] for r in logs if r["log_level"] == "warning"] == [
            "ending workers past their cluster's maximum failed"
        ]
    finally:
        await keeper.stop()


async def test_the_keeper_ends_a_worker_of_a_type_it_does_not_offer_the_cluster() -> None:
    """Only the keeper launches workers (its launch route checks the type), but a cluster's primary may
    stop its own worker, change its type (`ModifyInstanceAttribute`) and start it: the listing then shows
    a type the keeper does not offer, and the replica holding the cluster ends it (`types_of`)."""
    hosts, now = FakeHosts(), [1_000_000.0]
    keeper = Keeper(hosts, FakeProbe(), SharedLocks(lambda: now[0]).for_replica("a"), TIMING, interval=0.05,
                    clock=lambda: now[0], max_workers=5, types_of=lambda cluster: {"m5.large"})  # fmt: skip
    cluster, _ = await keeper.get_or_create(ClusterKey("alice", "w1"))
    hosts.workers[cluster.cluster_id] = [
        {**_worker("i-1", "2026-12-05T10:00:01+00:00"), "InstanceType": "m5.large"},
        {**_worker("i-2", "2026-12-05T10:00:02+00:00"), "InstanceType": "p4d.24xlarge"},
    ]
    try:
        await _until(lambda: keeper.held == 1)
        with capture_logs() as logs:
            await keeper.discover()
        assert hosts.trimmed == [
            (cluster.cluster_id, "i-2", "type p4d.24xlarge is not one the keeper offers"),
        ]
        assert [line["event"] for line in logs if line["log_level"] == "warning"] == [
            "worker ended by the keeper"
        ]
    finally:
        await keeper.stop()
