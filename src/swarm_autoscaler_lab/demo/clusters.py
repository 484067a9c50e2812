"""`swarm-autoscaler demo --clusters N`: N users' on-demand clusters, through the keeper's HTTP API.

The keeper is built from settings as `swarm-autoscaler keeper` builds it (same EC2 adapter against a
moto server, same redis locks on a real redis-server, same API), and every primary it launches boots in
the keeper's local cloud into a cluster of its own: a swarm, a real dask scheduler and that cluster's
autoscaler (`localcloud.primary`). Each user, a few seconds after the previous one:

1. asks for a cluster (`PUT /v1/clusters/<user>/<wallet>`) and polls `GET` until it is `running`;
2. submits its work to the cluster's scheduler and heartbeats while it waits: the cluster's autoscaler
   launches workers, which join the primary's swarm and connect to its scheduler, then retires them
   once the work is done;
3. releases its results and stops heartbeating: after the idle timeout (short in `--fast`) the keeper
   ends the cluster, terminating the primary and anything left of its workers.

The run ends when every cluster has ended (its `GET` answers 404), or at the time-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from swarm_autoscaler_lab.demo.clusters_view import ClustersDashboard, ClustersView, UserRun
from swarm_autoscaler_lab.localcloud import tls_files
from swarm_autoscaler_lab.localcloud.keepercloud import KeeperCloud, KeeperCloudOptions

WALLETS = ("w-research", "none", "w-teaching", "w-lab", "none")
UNAVAILABLE_RETRIES = 20  # 503s in a row (10 s of polling) before a user gives up on the keeper


@dataclass(frozen=True, slots=True)
class ClustersOptions:
    clusters: int = 3
    fast: bool = False
    json: bool = False
    timeout_s: float = 300.0
    seed: int = 7

    @property
    def stagger_s(self) -> float:
        return 2.0 if self.fast else 5.0

    @property
    def idle_timeout_s(self) -> float:
        return 8.0 if self.fast else 30.0


def user_work(index: int, fast: bool, seed: int) -> list[float]:
    """Task durations (seconds) of user `index`: each user brings more work than the one before."""
    rng = random.Random(seed + index)
    scale = 0.5 if fast else 1.0
    return [round(rng.uniform(2.0, 4.0) * scale, 2) for _ in range(4 + 4 * index)]


def _sleep_task(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


class KeeperApi:
    """The keeper's HTTP API, as a client sees it (bearer token on every request)."""

    def __init__(self, base_url: str, token: str, ca_pem: str | None = None) -> None:
        """`ca_pem`: the keeper's CA, for an https:// keeper whose certificate it made itself."""
        self.base_url = base_url.rstrip("/")
        tls = ssl.create_default_context(cadata=ca_pem) if ca_pem else None
        self._session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"},
            connector=aiohttp.TCPConnector(ssl=tls) if tls else None,
        )

    async def call(self, method: str, path: str, json: Any = None) -> tuple[int, Any]:
        """`json`: the request's body, when it has one (a create's `{"profile": ...}`)."""
        async with self._session.request(method, f"{self.base_url}{path}", json=json) as response:
            body = await response.json() if response.content_type == "application/json" else None
            return response.status, body

    async def security(self, path: str, folder: Path) -> Any:
        """The client's dask `Security` for the live cluster at `path`, its TLS files (from
        `GET <path>/credentials`) written in `folder`."""
        status, body = await self.call("GET", path + "/credentials")
        if status != 200:
            raise RuntimeError(f"GET {path}/credentials answered {status}: {body}")
        return tls_files.client_security_of(tls_files.write_files(folder, body["files"]))

    async def close(self) -> None:
        await self._session.close()


@dataclass
class Session:
    """One user's session against the keeper."""

    api: KeeperApi
    run: UserRun
    view: ClustersView
    work: list[float]
    started: float
    heartbeat_every: float

    @property
    def path(self) -> str:
        return f"/v1/clusters/{self.run.user}/{self.run.wallet}"

    async def __call__(self, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            cluster = await self._request()
            with tempfile.TemporaryDirectory(prefix="swarm-autoscaler-client-") as folder:
                security = await self.api.security(self.path, Path(folder))
                await self._work(cluster["scheduler_url"], security)
            await self._wait_end()
        except Exception as exc:  # shown on the dashboard and in the summary; the others go on
            self.run.phase, self.run.error = "failed", f"{type(exc).__name__}: {exc}"
            self.view.event(f"{self.run.user}: {self.run.error}")

    async def _request(self) -> dict[str, Any]:
        self.run.phase = "requesting"
        status, cluster = await self.api.call("PUT", self.path)
        if status not in (200, 201):
            raise RuntimeError(f"PUT answered {status}: {cluster}")
        self.run.created, self.run.cluster_id = status == 201, cluster["id"]
        self.view.event(f"{self.run.user}: PUT -> {status} {cluster['id']} ({cluster['state']})")
        self.run.phase = "starting"
        unavailable = 0  # consecutive 503s: the keeper could not read its cloud; a client asks again
        while cluster["state"] != "running":
            if cluster["state"] == "failed":
                raise RuntimeError(f"cluster failed: {cluster.get('reason')}")
            await asyncio.sleep(0.5)
            status, cluster = await self.api.call("GET", self.path)
            unavailable = unavailable + 1 if status == 503 else 0
            if status == 503 and unavailable < UNAVAILABLE_RETRIES:
                cluster = {"state": self.run.state}
                continue
            if status != 200:
                raise RuntimeError(f"GET answered {status}: {cluster}")
            self.run.state = cluster["state"]
        self.run.running_after_s = time.monotonic() - self.started
        self.view.event(f"{self.run.user}: running, scheduler {cluster['scheduler_url']}")
        return dict(cluster)

    async def _work(self, scheduler_url: str, security: Any) -> None:
        from distributed import Client

        self.run.phase, self.run.tasks = "working", len(self.work)
        async with Client(scheduler_url, asynchronous=True, security=security) as client:  # type: ignore[no-untyped-call]
            futures = [
                client.submit(
                    _sleep_task, s, key=f"{self.run.user}-{i:03d}", resources={"CPU": 1.0}, pure=False
                )
                for i, s in enumerate(self.work)
            ]
            last_beat = time.monotonic()
            while self.run.done < len(futures):
                await asyncio.sleep(0.5)
                self.run.done = sum(1 for f in futures if f.status == "finished")
                if time.monotonic() - last_beat >= self.heartbeat_every:
                    await self.api.call("POST", self.path + "/heartbeat")
                    last_beat = time.monotonic()
            for f in futures:
                f.release()
        self.run.phase = "idle"
        self.view.event(f"{self.run.user}: {len(futures)} tasks done; heartbeats stop")

    async def _wait_end(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            status, cluster = await self.api.call("GET", self.path)
            if status == 404:
                break
            self.run.state = cluster["state"]
        self.run.phase, self.run.state, self.run.ended = "ended", "gone", True
        self.run.ended_after_s = time.monotonic() - self.started
        self.view.event(f"{self.run.user}: cluster {self.run.cluster_id} ended (404)")


async def run_clusters(opts: ClustersOptions) -> dict[str, Any]:
    started = time.monotonic()
    view = ClustersView(
        users=[UserRun(f"user{i + 1}", WALLETS[i % len(WALLETS)]) for i in range(opts.clusters)]
    )
    cloud = KeeperCloudOptions(fast=opts.fast, seed=opts.seed)
    async with KeeperCloud(cloud) as kc, kc.keeper(idle_timeout_s=opts.idle_timeout_s) as (url, _):
        api = KeeperApi(url, kc.token)
        sessions = [
            Session(api, run, view, user_work(i, opts.fast, opts.seed), started, opts.idle_timeout_s / 4)
            for i, run in enumerate(view.users)
        ]
        tasks = [asyncio.create_task(s(i * opts.stagger_s)) for i, s in enumerate(sessions)]
        try:
            with ClustersDashboard() as dash:
                await _watch(kc, api, view, tasks, dash, started, opts.timeout_s)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await api.close()
        await _settle(kc, timeout=30.0)
        await asyncio.sleep(2 * (1.0 if opts.fast else 2.0))  # the last usage readings
        final = KeeperApi(url, kc.token)
        try:
            await _costs(final, view)
        finally:
            await final.close()
        return _summary(kc, view, time.monotonic() - started)


async def _watch(
    kc: KeeperCloud,
    api: KeeperApi,
    view: ClustersView,
    tasks: list[asyncio.Task[None]],
    dash: ClustersDashboard,
    started: float,
    timeout: float,
) -> None:
    """Refresh the view until every session is over or the time-out."""
    seen: set[str] = set()
    while not all(t.done() for t in tasks) and time.monotonic() - started < timeout:
        view.elapsed = time.monotonic() - started
        live = await asyncio.to_thread(kc.instances)
        seen.update(live)
        view.instances, view.launched = len(live), len(seen)
        for run in view.users:
            primary = kc.primaries.by_cluster(run.cluster_id) if kc.primaries and run.cluster_id else None
            run.workers = primary.worker_count() if primary is not None else 0
            run.peak_workers = max(run.peak_workers, run.workers)
        await _costs(api, view)
        dash.update(view)
        await asyncio.sleep(0.5)


async def _costs(api: KeeperApi, view: ClustersView) -> None:
    """Each wallet's running cost, as the keeper counts it (`GET /v1/usage`)."""
    with contextlib.suppress(aiohttp.ClientError):
        status, body = await api.call("GET", "/v1/usage")
        if status != 200 or not isinstance(body, dict):
            return
        spent = {(w["user_id"], w["wallet_id"]): w["cost_usd"] for w in body.get("wallets", ())}
        for run in view.users:
            run.cost_usd = spent.get((run.user, run.wallet), run.cost_usd)


async def _settle(kc: KeeperCloud, timeout: float) -> None:
    """Wait (bounded) for the last terminations to reach EC2 before counting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = await asyncio.to_thread(kc.instances)
        if not live:
            return
        await asyncio.sleep(0.5)


def _summary(kc: KeeperCloud, view: ClustersView, wall: float) -> dict[str, Any]:
    every = kc.instances(("pending", "running", "shutting-down", "terminated", "stopping", "stopped"))
    states = [inst["State"]["Name"] for inst in every.values()]
    return {
        "clusters": len(view.users),
        "clusters_created": sum(1 for u in view.users if u.created),
        "clusters_ended": sum(1 for u in view.users if u.ended),
        "launches": len(every),
        "terminations": sum(1 for s in states if s in ("shutting-down", "terminated")),
        "final_instances": sum(1 for s in states if s in ("pending", "running")),
        "peak_workers": {u.user: u.peak_workers for u in view.users},
        "wallet_cost_usd": {f"{u.user}/{u.wallet}": u.cost_usd for u in view.users},
        "tasks_done": sum(u.done for u in view.users),
        "tasks": sum(u.tasks for u in view.users),
        "errors": {u.user: u.error for u in view.users if u.error},
        "wall_s": round(wall, 1),
    }


def summary_lines(result: dict[str, Any]) -> Iterator[str]:
    yield "demo summary (on-demand clusters)"
    yield f"  clusters created      {result['clusters_created']} of {result['clusters']}"
    yield f"  clusters ended        {result['clusters_ended']}"
    yield f"  tasks done            {result['tasks_done']} of {result['tasks']}"
    yield f"  peak workers          {result['peak_workers']}"
    yield f"  cost per wallet (USD) {result['wallet_cost_usd']}"
    yield f"  instances launched    {result['launches']} (primaries and workers)"
    yield f"  instances terminated  {result['terminations']}"
    yield f"  final instances       {result['final_instances']}"
    yield f"  wall time             {result['wall_s']} s"
    for user, error in result["errors"].items():
        yield f"  error                 {user}: {error}"


def main(opts: ClustersOptions) -> int:
    result = asyncio.run(run_clusters(opts))
    for line in summary_lines(result):
        print(line)
    if opts.json:
        print(json.dumps(result, sort_keys=True))
    n = result["clusters"]
    ok = result["clusters_created"] == n and result["clusters_ended"] == n and result["final_instances"] == 0
    return 0 if ok else 1
