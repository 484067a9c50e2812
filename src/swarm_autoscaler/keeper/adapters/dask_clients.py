"""`keeper.ports.SchedulerClients` over a cluster's scheduler, reading only data from it.

A keeper cluster's scheduler runs its user's code, so the keeper never decodes what it sends with
anything that can run code (no `distributed` comm, no pickle: see `dask_wire`):

- **who is connected** comes from the scheduler's Prometheus text (`GET <dashboard>/metrics`, the page
  the probe already reads, bounded to `LIMIT` bytes): `dask_scheduler_client_connections_added_total`
  less `..._removed_total` is how many dask clients are connected now. The cluster's own autoscaler is
  not one (it reads its scheduler over `dask_wire` and never registers as a client), so every client
  counted is a user's. Published datasets and results a client left behind keep tasks in memory,
  which the probe already counts as work, so their pseudo-clients need no count here (`clients` is read only when the probe found no work). The keeper
  itself never connects as a dask client. A figure that is missing, negative or not a number reads as
  None (unknown), and an unknown count never ends a cluster;
- **the launch hold** (a wallet that spent its budget) is one `set_metadata` message over the cluster's
  mutual TLS (`dask_wire.call`): the reason under `adapters.dask.LAUNCH_HOLD_KEY`, which the cluster's
  own autoscaler reads at every tick and then launches nothing more ("" lifts it). The answer must be
  `None`; anything else (a pickled payload included) is a failure, told again at the next check.

What a tenant can do is lie about its own figures: keep its own cluster alive (its wallet pays) or lift
its own hold (the keeper still ends the cluster when the budget's grace is over).
"""

from __future__ import annotations

import math
import ssl
from collections import OrderedDict

import aiohttp
import structlog

from swarm_autoscaler.adapters.dask import LAUNCH_HOLD_KEY
from swarm_autoscaler.adapters.dask_wire import call, client_context
from swarm_autoscaler.keeper.credentials import LOST, CredentialStore
from swarm_autoscaler.keeper.model import Cluster

log = structlog.get_logger("swarm_autoscaler.keeper.clients")

ADDED = "dask_scheduler_client_connections_added_total"
REMOVED = "dask_scheduler_client_connections_removed_total"
LIMIT = 1024 * 1024  # bytes of Prometheus text read at most
_CACHE = 2048  # TLS contexts kept for this many clusters


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        metric, _, value = line.partition(" ")
        if metric == name:
            try:
                number = float(value.split()[0])
            except (ValueError, IndexError):
                return None
            return number if math.isfinite(number) and number >= 0 else None
    return None


def present_from_metrics(text: str) -> int | None:
    """Clients connected (all users': the cluster's own autoscaler is no dask client); None when the
    text does not say."""
    added, removed = _sample(text, ADDED), _sample(text, REMOVED)
    if added is None or removed is None or removed > added:
        return None
    return int(added - removed)


class TlsSchedulerClients:
    """Reads each cluster's clients (HTTP metrics) and sets its launch hold (mutual TLS, with the
    cluster's client credentials from `credentials`); `timeout` bounds each."""

    def __init__(self, credentials: CredentialStore, timeout: float = 5.0) -> None:
        self._credentials = credentials
        self._timeout = timeout
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._lost: set[str] = set()  # clusters whose lost credentials were logged (once each)
        self._session: aiohttp.ClientSession | None = None

    async def clients(self, cluster: Cluster) -> int | None:
        url = cluster.dashboard_url
        if not url:
            return None
        try:
            text = await self._metrics(url.rstrip("/") + "/metrics")
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            log.debug("clients unreadable", cluster=cluster.cluster_id, error=type(exc).__name__)
            return None
        return None if text is None else present_from_metrics(text)

    async def _metrics(self, url: str) -> str | None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self._timeout)
            connector = aiohttp.TCPConnector(force_close=True)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        async with self._session.get(url, allow_redirects=False) as answer:
            if answer.status != 200:
                return None
            body = await answer.content.read(LIMIT + 1)
        if len(body) > LIMIT:
            return None
        return body.decode("utf-8")

    async def hold_launches(self, cluster: Cluster, reason: str) -> bool:
        """Hold (`reason`) or lift ("") the cluster's launches; False when the scheduler cannot be
        told now (the keeper tells it again at its next check). Never raises."""
        url = cluster.scheduler_url
        if not url:
            return False
        message = {"op": "set_metadata", "keys": [LAUNCH_HOLD_KEY], "value": reason}
        try:
            context = await self._context(cluster.cluster_id, url)
            answer = await call(url, context, message, self._timeout)
        except Exception as exc:  # whatever a tenant's scheduler does, the keeper carries on
            log.debug("launch hold not set", cluster=cluster.cluster_id, error=type(exc).__name__)
            return False
        return answer is None

    async def _context(self, cluster_id: str, url: str) -> ssl.SSLContext | None:
        """The TLS client context with the cluster's client files (kept in memory only); none for
        `tcp://`."""
        if not url.startswith("tls://"):
            return None
        known = self._contexts.get(cluster_id)
        if known is not None:
            self._contexts.move_to_end(cluster_id)
            return known
        stored = await self._credentials.get(cluster_id)  # never makes a set: see `credentials.LOST`
        if stored is None:  # asked for a running cluster only: its credentials are gone from the store
            if cluster_id not in self._lost:
                self._lost.add(cluster_id)
                log.error("credentials lost", cluster=cluster_id, what_to_do=LOST)
            raise LookupError("no credentials stored for this cluster")
        files = stored.for_client()
        context = client_context(files["ca.pem"], files["client.pem"], files["client-key.pem"])
        self._contexts[cluster_id] = context
        while len(self._contexts) > _CACHE:
            self._contexts.popitem(last=False)
        return context

    def forget(self, cluster_id: str) -> None:
        self._contexts.pop(cluster_id, None)
        self._lost.discard(cluster_id)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
