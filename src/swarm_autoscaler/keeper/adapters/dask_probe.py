"""`keeper.ports.SchedulerProbe` over a dask scheduler's HTTP endpoint (its dashboard port, 8787).

`GET /health` says whether it answers; `GET /metrics` (Prometheus text, served by distributed when
prometheus-client is installed) gives `dask_scheduler_tasks{state=...}`. A cluster has work while any
task is processing, waiting, queued, unrunnable (`no-worker`) or held in memory for a client (a result
a connected client has not released is use too). Light on purpose: the keeper probes every cluster
every few seconds, and one HTTP request costs far less than a dask client connection.
"""

from __future__ import annotations

import aiohttp

from swarm_autoscaler.keeper.lifecycle import Probe

BUSY_STATES = ("processing", "waiting", "queued", "no-worker", "memory")
_PREFIX = "dask_scheduler_tasks{state="


def busy_from_metrics(text: str) -> bool:
    """True when the Prometheus text shows a task in one of `BUSY_STATES`."""
    for line in text.splitlines():
        if not line.startswith(_PREFIX):
            continue
        state, _, value = line[len(_PREFIX) :].partition("}")
        try:
            count = float(value.strip())
        except ValueError:
            continue
        if state.strip('"') in BUSY_STATES and count > 0:
            return True
    return False


class HttpSchedulerProbe:
    """Probes with one shared aiohttp session; `timeout` bounds each probe."""

    def __init__(self, timeout: float = 3.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def probe(self, url: str) -> Probe:
        if self._session is None:
            # No keep-alive: a pooled connection can outlive a scheduler that stopped listening, and a
            # probe must see the server as it is now.
            connector = aiohttp.TCPConnector(force_close=True)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        base = url.rstrip("/")
        try:
            async with self._session.get(f"{base}/health") as health:
                if health.status != 200:
                    return Probe(answered=False)
            async with self._session.get(f"{base}/metrics") as metrics:
                text = await metrics.text() if metrics.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return Probe(answered=False)
        return Probe(answered=True, busy=busy_from_metrics(text))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
