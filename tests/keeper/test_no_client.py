"""No client, no cluster, on a real dask scheduler speaking TLS with a cluster's credentials: the keeper
counts its clients from the scheduler's Prometheus text (data, never a pickled answer: the cluster's own
autoscaler, a real `DaskWorkload`, is not one; a user's client is, also while it holds results; a
published dataset keeps tasks in memory, which the probe counts as work), and a keeper with the real
probes ends the cluster once it had no client and no work for the no-client timeout, not before."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from distributed import Client, Scheduler, Worker, fire_and_forget
from distributed.security import Security
from tests.keeper.fakes import FakeHosts, SharedLocks

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.keeper.adapters.dask_clients import TlsSchedulerClients
from swarm_autoscaler.keeper.adapters.dask_probe import HttpSchedulerProbe
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.credentials import Credentials, InProcessCredentials
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState
from swarm_autoscaler.keeper.service import Keeper

CID = "kc-0001"  # FakeHosts' first id


@dataclass
class Primary:
    scheduler: Scheduler
    creds: Credentials
    files: dict[str, str]

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.scheduler.http_server.port}"

    def client_security(self) -> Security:
        f = self.files
        return Security(  # type: ignore[no-untyped-call]
            tls_ca_file=f["ca.pem"], tls_client_cert=f["client.pem"], tls_client_key=f["client-key.pem"],
            require_encryption=True,
        )  # fmt: skip

    def worker_security(self) -> Security:
        f = self.files
        return Security(  # type: ignore[no-untyped-call]
            tls_ca_file=f["ca.pem"], tls_worker_cert=f["worker.pem"], tls_worker_key=f["worker-key.pem"],
            require_encryption=True,
        )  # fmt: skip

    def cluster(self) -> Cluster:
        return Cluster(
            CID, ClusterKey("alice", "w1"), ClusterState.RUNNING, time.time(), time.time(),
            scheduler_url=self.scheduler.address, dashboard_url=self.dashboard,
        )  # fmt: skip


@pytest.fixture
async def primary(tmp_path: Path) -> AsyncIterator[Primary]:
    creds = make_credentials(CID)
    files = {}
    for name, text in {**creds.for_primary(), **creds.for_client()}.items():
        (tmp_path / name).write_text(text)
        files[name] = str(tmp_path / name)
    security = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=files["ca.pem"], tls_scheduler_cert=files["scheduler.pem"],
        tls_scheduler_key=files["scheduler-key.pem"], require_encryption=True,
    )  # fmt: skip
    async with Scheduler(
        host="127.0.0.1", port=0, protocol="tls", security=security, dashboard_address="127.0.0.1:0"
    ) as scheduler:  # type: ignore[no-untyped-call]
        yield Primary(scheduler, creds, files)


@pytest.fixture
async def reader(primary: Primary) -> AsyncIterator[TlsSchedulerClients]:
    """The keeper's reader of this cluster's clients (closed after the test: it keeps an HTTP session)."""
    store = InProcessCredentials(lambda _: primary.creds)
    await store.get_or_make(CID)  # made when the primary fetched its files (the reader makes none)
    clients = TlsSchedulerClients(store, timeout=5)
    yield clients
    await clients.close()


async def test_clients_are_counted_from_data_leaving_out_the_cluster_s_own_autoscaler(
    primary: Primary, reader: TlsSchedulerClients
) -> None:
    clients, cluster = reader, primary.cluster()
    assert await clients.clients(cluster) == 0
    f = primary.files
    async with DaskWorkload(
        primary.scheduler.address, tls_files=(f["ca.pem"], f["worker.pem"], f["worker-key.pem"])
    ) as autoscaler:
        await autoscaler.connect()
        assert len(primary.scheduler.clients) == 1  # fire-and-forget's: the autoscaler is no client
        assert await clients.clients(cluster) == 0
        async with Worker(primary.scheduler.address, security=primary.worker_security(), nthreads=1):  # type: ignore[no-untyped-call]
            async with Client(
                primary.scheduler.address, security=primary.client_security(), asynchronous=True
            ) as user:  # type: ignore[no-untyped-call]
                assert await clients.clients(cluster) == 1
                future = user.submit(sum, [1, 2])
                assert await future == 3  # a result held for the user
                assert await clients.clients(cluster) == 1
                await user.publish_dataset(kept=future)
            # The published dataset: results kept for a client come back to are work for the probe
            # (and the keeper reads clients only when the probe finds none).
            probe = HttpSchedulerProbe(timeout=3)
            try:
                assert (await probe.probe(primary.dashboard)).busy
            finally:
                await probe.close()
            async with Client(
                primary.scheduler.address, security=primary.client_security(), asynchronous=True
            ) as again:  # type: ignore[no-untyped-call]
                await again.unpublish_dataset("kept")
            assert await clients.clients(cluster) == 0
    assert not [k for k in primary.scheduler.clients if k.startswith("Client-")]  # the keeper never was one


async def test_another_cluster_s_credentials_or_no_scheduler_fail_quietly(
    primary: Primary, reader: TlsSchedulerClients
) -> None:
    elsewhere = InProcessCredentials(make_credentials)
    await elsewhere.get_or_make(CID)  # a set of another CA under this cluster's id
    other = TlsSchedulerClients(elsewhere, timeout=3)
    assert not await other.hold_launches(primary.cluster(), "refused: another cluster's certificate")
    await other.close()
    gone = dataclasses.replace(primary.cluster(), dashboard_url="http://127.0.0.1:1")
    assert await reader.clients(gone) is None


async def wait_for(predicate, seconds: float) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < seconds, "timed out"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def test_the_keeper_ends_a_cluster_once_no_client_and_no_work_lasted_the_timeout(
    primary: Primary, reader: TlsSchedulerClients
) -> None:
    hosts, probe = FakeHosts(), HttpSchedulerProbe(timeout=3)
    keeper = Keeper(
        hosts, probe, SharedLocks(time.time).for_replica("a"),
        KeeperTiming(idle_timeout=300.0, max_start_time=60.0, no_client_timeout=1.5),
        interval=0.1, clients=reader,
    )  # fmt: skip
    security, f = primary.client_security(), primary.files
    own = DaskWorkload(  # the cluster's own autoscaler, connected as on a real primary (not a user)
        primary.scheduler.address, tls_files=(f["ca.pem"], f["worker.pem"], f["worker-key.pem"])
    )
    try:
        await own.__aenter__()
        await own.connect()
        async with Worker(primary.scheduler.address, security=primary.worker_security(), nthreads=1):  # type: ignore[no-untyped-call]
            async with Client(primary.scheduler.address, security=security, asynchronous=True) as user:  # type: ignore[no-untyped-call]
                cluster, _ = await keeper.get_or_create(ClusterKey("alice", "w1"))
                start = dataclasses.replace(
                    cluster, scheduler_url=primary.scheduler.address, dashboard_url=primary.dashboard
                )
                hosts.clusters[CID] = start
                keeper._known[CID] = start  # the addresses a real primary's tags would carry
                await wait_for(lambda: hosts.clusters[CID].state == ClusterState.RUNNING, 10)
                await asyncio.sleep(3.0)  # twice the timeout with the client connected
                assert hosts.clusters[CID].state == ClusterState.RUNNING and not hosts.terminate_calls
                fire_and_forget(user.submit(time.sleep, 2.5, pure=False))  # work outliving the client
            await asyncio.sleep(2.0)  # no client, but work: kept
            assert hosts.clusters[CID].state == ClusterState.RUNNING and not hosts.terminate_calls
            took = await wait_for(lambda: bool(hosts.terminate_calls), 10)
        ended = hosts.clusters[CID]
        assert ended.state == ClusterState.ENDING and "no client and no work" in ended.reason
        assert (
            1.0 <= took <= 4.0
        )  # the rest of the work (~0.5 s), then the timeout (1.5 s) and a check or two
    finally:
        await keeper.stop()
        await probe.close()
        await own.__aexit__(None, None, None)


async def test_a_launch_hold_set_by_the_keeper_reaches_the_cluster_s_autoscaler(
    primary: Primary, reader: TlsSchedulerClients
) -> None:
    keeper_side, cluster, f = reader, primary.cluster(), primary.files
    async with DaskWorkload(
        primary.scheduler.address, tls_files=(f["ca.pem"], f["worker.pem"], f["worker-key.pem"])
    ) as autoscaler:
        assert (await autoscaler.observe()).launch_hold == ""
        assert await keeper_side.hold_launches(cluster, "wallet w1 spent its budget")
        assert (await autoscaler.observe()).launch_hold == "wallet w1 spent its budget"
        assert await keeper_side.hold_launches(cluster, "")
        assert (await autoscaler.observe()).launch_hold == ""
    elsewhere = InProcessCredentials(make_credentials)
    await elsewhere.get_or_make(CID)
    other = TlsSchedulerClients(elsewhere, timeout=3)
    assert not await other.hold_launches(cluster, "refused: another cluster's certificate")
