"""`keeper.ports.SchedulerClients` over a cluster's TLS scheduler: who is connected to it.

The scheduler's HTTP metrics give only a count of clients, and the cluster's own autoscaler is one of
them; so the keeper asks the scheduler itself, over `tls://` with the cluster's client credentials (the
same files a user's client holds), through one `distributed.core.rpc` call: no `Client` is made (the
keeper never counts as a client), and the function run on the scheduler (`run_function`, pickled by
value so it does not depend on the scheduler's copy of this package) only lists its clients' ids and
how many keys each holds.

Present are every client except the cluster's own autoscaler (`adapters.dask.CLIENT_NAME`) and dask's
`fire-and-forget` pseudo-client (whose tasks are work, which the probe already sees). A client that
holds results is connected, so it counts; so do published datasets (`published-<name>`: results kept
for a client to come back to) while they hold any. Read only when the probe found no work, and never raises: anything
wrong is None (unknown), and an unknown count never ends a cluster.

`hold_launches` is the keeper's way to stop a cluster growing (its wallet's budget is spent): one
`set_metadata` call puts the reason under `adapters.dask.LAUNCH_HOLD_KEY` in the scheduler's metadata,
which the cluster's own autoscaler reads at every tick and then launches nothing more ("" lifts it).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import structlog
from distributed.core import rpc
from distributed.protocol.pickle import dumps
from distributed.security import Security

from swarm_autoscaler.adapters.dask import CLIENT_NAME, LAUNCH_HOLD_KEY
from swarm_autoscaler.keeper.credentials import CredentialStore
from swarm_autoscaler.keeper.model import Cluster

log = structlog.get_logger("swarm_autoscaler.keeper.clients")

OWN_PREFIX = f"Client-{CLIENT_NAME}-"
IGNORED = ("fire-and-forget",)
PUBLISHED = "published-"
_CACHE = 2048  # connection settings (an SSL context each) kept for this many clusters


def _clients_function() -> Callable[..., list[tuple[str, int]]]:
    # Defined inside a function: cloudpickle sends a local function by value (a module-level one by
    # reference, which the scheduler would import from its own, maybe other, version of this package).
    def swarm_autoscaler_keeper_clients(dask_scheduler: Any) -> list[tuple[str, int]]:
        return [(str(key), len(state.wants_what)) for key, state in dask_scheduler.clients.items()]

    return swarm_autoscaler_keeper_clients


def present(clients: list[tuple[str, int]]) -> int:
    """How many of a scheduler's clients count as present (see the module docstring): a published
    dataset's pseudo-client only while it holds keys (the scheduler keeps it after an unpublish)."""
    count = 0
    for key, holds in clients:
        if key.startswith(PUBLISHED):
            count += holds > 0
        elif key not in IGNORED and not key.startswith(OWN_PREFIX):
            count += 1
    return count


class TlsSchedulerClients:
    """Reads each cluster's clients with its credentials from `credentials`; `timeout` bounds a read."""

    def __init__(self, credentials: CredentialStore, timeout: float = 5.0) -> None:
        self._credentials = credentials
        self._timeout = timeout
        self._function = dumps(_clients_function())  # type: ignore[no-untyped-call]
        self._no_args = dumps(())  # type: ignore[no-untyped-call]
        self._no_kwargs = dumps({})  # type: ignore[no-untyped-call]
        self._args: OrderedDict[str, dict[str, Any]] = OrderedDict()

    async def clients(self, cluster: Cluster) -> int | None:
        url = cluster.scheduler_url
        if not url:
            return None
        try:
            args = await self._connection_args(cluster.cluster_id, url)
            async with asyncio.timeout(self._timeout):
                async with rpc(url, connection_args=args, timeout=self._timeout) as scheduler:  # type: ignore[no-untyped-call]
                    answer = await scheduler.run_function(
                        function=self._function, args=self._no_args, kwargs=self._no_kwargs, wait=True
                    )
        except Exception as exc:  # a remote error comes back as whatever the scheduler raised
            log.debug("clients unreadable", cluster=cluster.cluster_id, error=type(exc).__name__)
            return None
        if not isinstance(answer, dict) or answer.get("status") != "OK":
            return None
        return present(list(answer.get("result") or []))

    async def hold_launches(self, cluster: Cluster, reason: str) -> bool:
        """Hold (`reason`) or lift ("") the cluster's launches; False when the scheduler cannot be
        told now (the keeper tells it again at its next check). Never raises."""
        url = cluster.scheduler_url
        if not url:
            return False
        try:
            args = await self._connection_args(cluster.cluster_id, url)
            async with asyncio.timeout(self._timeout):
                async with rpc(url, connection_args=args, timeout=self._timeout) as scheduler:  # type: ignore[no-untyped-call]
                    await scheduler.set_metadata(keys=[LAUNCH_HOLD_KEY], value=reason)
        except Exception as exc:  # a remote error comes back as whatever the scheduler raised
            log.debug("launch hold not set", cluster=cluster.cluster_id, error=type(exc).__name__)
            return False
        return True

    async def _connection_args(self, cluster_id: str, url: str) -> dict[str, Any]:
        """TLS settings with the cluster's client files (kept in memory only); none for `tcp://`."""
        if not url.startswith("tls://"):
            return {}
        known = self._args.get(cluster_id)
        if known is not None:
            self._args.move_to_end(cluster_id)
            return known
        files = (await self._credentials.get_or_make(cluster_id)).for_client()
        security = Security(  # type: ignore[no-untyped-call]
            tls_ca_file=files["ca.pem"],
            tls_client_cert=files["client.pem"],
            tls_client_key=files["client-key.pem"],
            require_encryption=True,
        )
        args: dict[str, Any] = security.get_connection_args("client")  # type: ignore[no-untyped-call]
        self._args[cluster_id] = args
        while len(self._args) > _CACHE:
            self._args.popitem(last=False)
        return args

    def forget(self, cluster_id: str) -> None:
        self._args.pop(cluster_id, None)
