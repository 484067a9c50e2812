"""Data, not code, from tenants: a keeper cluster's scheduler is its user's, so a user can make it answer
anything. Here a hostile scheduler (a TLS server holding the cluster's real scheduler certificate, so the
keeper's mutual TLS accepts it, as it would a user's patched scheduler on their primary) answers every
dask message, its handshake included, with a frame that runs code when `distributed` unpickles it
(`os.mkdir` of a marker); its dashboard serves hostile Prometheus text.

The control shows the payload is real: `distributed.core.rpc`, what the keeper used before, runs it. The
keeper's reader (`TlsSchedulerClients`: clients from metrics, the launch hold over `dask_wire`) then
leaves no trace: no marker, no exception, only "could not be told" (False) or "unknown" (None)."""

from __future__ import annotations

import pickle
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from distributed.core import rpc
from distributed.security import Security
from structlog.testing import capture_logs
from tests.hostile import Payload, hostile_message, hostile_scheduler

from swarm_autoscaler.adapters.dask_wire import WireError, first_frame
from swarm_autoscaler.keeper.adapters.dask_clients import LIMIT, TlsSchedulerClients, present_from_metrics
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.credentials import Credentials, InProcessCredentials
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState

CID = "kc-hostile"


@dataclass
class Hostile:
    url: str
    dashboard: str
    marker: Path
    creds: Credentials
    files: dict[str, str]

    def cluster(self) -> Cluster:
        now = time.time()
        return Cluster(
            CID, ClusterKey("mallory", "w1"), ClusterState.RUNNING, now, now,
            scheduler_url=self.url, dashboard_url=self.dashboard,
        )  # fmt: skip


@pytest.fixture
async def hostile(tmp_path: Path) -> AsyncIterator[Hostile]:
    creds = make_credentials(CID)
    files = {}
    for name, text in {**creds.for_primary(), **creds.for_client()}.items():
        (tmp_path / name).write_text(text)
        files[name] = str(tmp_path / name)
    marker = tmp_path / "ran"
    listen = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=files["ca.pem"], tls_scheduler_cert=files["scheduler.pem"],
        tls_scheduler_key=files["scheduler-key.pem"], require_encryption=True,
    ).get_listen_args("scheduler")["ssl_context"]  # fmt: skip

    async def metrics(_: web.Request) -> web.Response:  # hostile text: NaN, negatives, junk, pickles
        body = b"dask_scheduler_client_connections_added_total NaN\n" + pickle.dumps(Payload(str(marker)))
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with hostile_scheduler(marker, listen) as url:
            yield Hostile(url, f"http://127.0.0.1:{http_port}", marker, creds, files)
    finally:
        await runner.cleanup()


async def test_a_hostile_scheduler_runs_no_code_in_the_keeper_while_dask_s_own_comm_would(
    hostile: Hostile,
) -> None:
    keeper_side = TlsSchedulerClients(InProcessCredentials(lambda _: hostile.creds), timeout=3)
    try:
        assert await keeper_side.hold_launches(hostile.cluster(), "wallet w1 spent its budget") is False
        assert await keeper_side.hold_launches(hostile.cluster(), "") is False
        assert await keeper_side.clients(hostile.cluster()) is None
    finally:
        await keeper_side.close()
    assert not hostile.marker.exists(), "the keeper ran the tenant's code"

    # The control: what the keeper did before (distributed's rpc, with the same TLS files) runs it.
    f = hostile.files
    args = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=f["ca.pem"], tls_client_cert=f["client.pem"], tls_client_key=f["client-key.pem"],
        require_encryption=True,
    ).get_connection_args("client")  # fmt: skip
    with pytest.raises(Exception):  # noqa: B017  whatever it raises after running the payload
        async with rpc(hostile.url, connection_args=args, timeout=3) as scheduler:  # type: ignore[no-untyped-call]
            await scheduler.set_metadata(keys=["k"], value="v")
    assert hostile.marker.exists(), "the control did not run the payload: the test proves nothing"


def test_the_wire_decodes_a_pickled_frame_as_a_plain_map_and_refuses_what_is_malformed(
    tmp_path: Path,
) -> None:
    """The keeper's decoder on its own: the hostile frame is a map with a `__Pickled__` key, nothing
    more; truncated or oversized framing is an error, not an allocation or a crash."""
    message = hostile_message(tmp_path / "ran")
    assert first_frame(message[8:]) == {"__Pickled__": 1}
    assert not (tmp_path / "ran").exists()
    for bad in (
        b"",
        b"\x00" * 7,
        struct.pack("<Q", 0),
        struct.pack("<QQ", 1, 10**12),
        struct.pack("<Q", 2**63),
    ):
        with pytest.raises(WireError):
            first_frame(bad)
    with pytest.raises(WireError):
        first_frame(struct.pack("<QQ", 1, 1) + b"\xc1")  # 0xc1: never used in msgpack


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "dask_scheduler_client_connections_added_total 3.0\ndask_scheduler_client_connections_removed_total 1.0\n",
            2,
        ),
        (
            "dask_scheduler_client_connections_added_total 1.0\ndask_scheduler_client_connections_removed_total 1.0\n",
            0,
        ),
        (
            "dask_scheduler_client_connections_added_total 1.0\ndask_scheduler_client_connections_removed_total 4.0\n",
            None,
        ),
        (
            "dask_scheduler_client_connections_added_total NaN\ndask_scheduler_client_connections_removed_total 0\n",
            None,
        ),
        (
            "dask_scheduler_client_connections_added_total 1e400\ndask_scheduler_client_connections_removed_total 0\n",
            None,
        ),
        (
            "dask_scheduler_client_connections_added_total -2\ndask_scheduler_client_connections_removed_total -3\n",
            None,
        ),
        ("dask_scheduler_client_connections_added_total\n", None),
        ("", None),
    ],
)
def test_the_client_count_is_read_from_metrics_text_and_anything_odd_is_unknown(
    text: str, expected: int | None
) -> None:
    """Prometheus text as distributed serves it (connections added less removed; the cluster's own
    autoscaler is no client); what a hostile scheduler could serve instead reads as unknown (None), which never
    ends a cluster."""
    assert present_from_metrics(text) == expected


async def test_an_oversized_metrics_page_is_unknown_not_read_into_memory() -> None:
    """A scheduler's dashboard that streams more than `LIMIT` bytes: the keeper stops reading at the
    limit and says unknown."""

    async def huge(_: web.Request) -> web.StreamResponse:
        return web.Response(body=b"#" * (LIMIT + 10))

    app = web.Application()
    app.router.add_get("/metrics", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    reader = TlsSchedulerClients(InProcessCredentials(make_credentials), timeout=3)
    try:
        now = time.time()
        cluster = Cluster(
            CID, ClusterKey("mallory", "w1"), ClusterState.RUNNING, now, now,
            scheduler_url="", dashboard_url=f"http://127.0.0.1:{port}",
        )  # fmt: skip
        assert await reader.clients(cluster) is None
    finally:
        await reader.close()
        await runner.cleanup()


async def test_a_running_cluster_whose_credentials_are_gone_is_reported_once_and_gets_no_new_ca() -> None:
    """Redis came back empty under a running cluster: the keeper's launch hold (its only TLS use of a
    running cluster) makes no new CA, says so once with what to do, and reports "not told"."""
    store = InProcessCredentials(make_credentials)
    reader = TlsSchedulerClients(store, timeout=1)
    now = time.time()
    cluster = Cluster(
        CID, ClusterKey("alice", "w1"), ClusterState.RUNNING, now, now, scheduler_url="tls://127.0.0.1:1"
    )
    try:
        with capture_logs() as logs:
            assert await reader.hold_launches(cluster, "spent") is False
            assert await reader.hold_launches(cluster, "spent") is False
        assert [e["cluster"] for e in logs if e["event"] == "credentials lost"] == [CID]
        assert await store.get(CID) is None
    finally:
        await reader.close()
