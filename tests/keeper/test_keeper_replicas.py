"""Replicas share the clusters: three `swarm-autoscaler keeper` processes of one keeper (the same name,
the same redis-server, one moto server over HTTP) hold 30 clusters between them, at most their share
each; one is killed with SIGKILL and the two others take its clusters over within the lease's TTL and a
check or two; and no cluster is ever acted on by two replicas at once, as moto's call log shows (each
replica signs its EC2 calls with its own access key id, so every CreateTags and TerminateInstances on a
cluster's primary names the replica that sent it).

The clusters' schedulers are one small HTTP server here answering `/health` and a busy `/metrics` for
each cluster (its address tagged on each primary), so each cluster's holder writes its heartbeat into
the primary's tags every few seconds: a steady stream of actions per cluster, each attributed."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from aiohttp import web
from tests.keeper.test_keeper_process import CLI, TOKEN, _healthy, free_port, keeper_env

from swarm_autoscaler.keeper.adapters.tags import DASHBOARD_URL_TAG
from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.ec2_faults import Ec2Call
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = pytest.mark.timeout(240)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPLICAS = 3
CLUSTERS = 30
CHECK_INTERVAL = 0.5
# 4 s, not 2: in a full suite run each replica's listing of moto (which holds every earlier module's
# machines) was slow enough for presences and leases to lapse, and clusters were handed round
LEASE_TTL = 4.0
KEYS = [f"REPLICA{i}ACCESSKEY" for i in range(REPLICAS)]
MUTATING = ("CreateTags", "TerminateInstances")


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with MotoServer(seed=7) as server:
        yield server


@pytest.fixture(scope="module")
def network(moto: MotoServer) -> LocalNetwork:
    return provision_network(
        moto.endpoint, prefix=claim_loopback_prefix()
    )  # private IPs on loopback: probes stay local


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="replicas-Redis-pw") as server:
        yield server


@pytest.fixture
async def raw_ec2(moto: MotoServer) -> AsyncIterator[Any]:
    async with get_session().create_client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=moto.endpoint,
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
        config=AioConfig(retries={"total_max_attempts": 1, "mode": "standard"}),
    ) as client:
        yield client


@pytest.fixture
async def schedulers() -> AsyncIterator[str]:
    """Every cluster's scheduler, busy: `<base>/<cluster id>/health` and `.../metrics`."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text='dask_scheduler_tasks{state="processing"} 1.0\n')

    app = web.Application()
    app.router.add_get("/{cid}/health", health)
    app.router.add_get("/{cid}/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _gauge(session: aiohttp.ClientSession, base: str, name: str) -> int | None:
    try:
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
    except aiohttp.ClientError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return round(float(line.split()[1]))
    return None


async def _split(session: aiohttp.ClientSession, bases: list[str]) -> list[int | None]:
    return [await _gauge(session, base, "keeper_leases_held") for base in bases]


async def _whole_split(session: aiohttp.ClientSession, bases: list[str]) -> list[int | None]:
    """The split read again (for up to 2 s) until it counts every cluster: the replicas are asked one after
    another, and on a loaded host a lease renewed late is between holders for a moment."""
    split = await _split(session, bases)
    for _ in range(20):
        if sum(s or 0 for s in split) == CLUSTERS:
            break
        await asyncio.sleep(0.1)
        split = await _split(session, bases)
    return split


async def _until(predicate: Any, within: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if await predicate():
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {within}s: {what}")


def _writers(
    calls: list[Ec2Call], primaries: dict[str, str], since: float, until: float
) -> dict[str, set[str]]:
    """For each cluster, the access keys (replicas) whose mutating EC2 calls named its primary."""
    out: dict[str, set[str]] = defaultdict(set)
    for call in calls:
        if call.action not in MUTATING or call.access_key not in KEYS or not since <= call.at < until:
            continue
        for key, value in call.params.items():
            if key.startswith(("ResourceId.", "InstanceId.")) and value in primaries:
                out[primaries[value]].add(call.access_key)
    return out


def _writer_runs(calls: list[Ec2Call], primaries: dict[str, str], since: float) -> dict[str, list[str]]:
    """From `since` on, each cluster's mutating calls' writers in order, collapsed into runs (A, B, A is
    a cluster going back to a replica another has driven since; A, B alone is a handover)."""
    runs: dict[str, list[str]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.at):
        if call.action not in MUTATING or call.access_key not in KEYS or call.at < since:
            continue
        for key, value in call.params.items():
            if key.startswith(("ResourceId.", "InstanceId.")) and value in primaries:
                order = runs[primaries[value]]
                if not order or order[-1] != call.access_key:
                    order.append(call.access_key)
    return runs


async def test_three_replicas_share_30_clusters_and_take_over_a_killed_ones_within_a_lease(
    moto: MotoServer,
    network: LocalNetwork,
    redis_server: RedisServer,
    raw_ec2: Any,
    schedulers: str,
    tmp_path: Path,
) -> None:
    ports = [free_port() for _ in range(REPLICAS)]
    shared = keeper_env(moto, network, redis_server, ports[0])  # one name and one redis for all
    shared.update(
        {
            "AUTOSCALER_KEEPER_CHECK_INTERVAL": f"{CHECK_INTERVAL}s",
            "AUTOSCALER_KEEPER_LOCK_TTL": f"{LEASE_TTL}s",
            "AUTOSCALER_KEEPER_IDLE_TIMEOUT": "8s",  # busy clusters: a heartbeat write every 4 s
            "AUTOSCALER_KEEPER_NO_CLIENT_TIMEOUT": "0s",
            "AUTOSCALER_LOG_FORMAT": "json",
        }
    )
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    procs: list[asyncio.subprocess.Process] = []
    logs = [(tmp_path / f"replica{i}.log").open("wb") for i in range(REPLICAS)]
    primaries: dict[str, str] = {}  # instance id -> cluster id
    moto.faults.record()
    try:
        for i, port in enumerate(ports):
            env = dict(shared)
            env.update(
                {
                    "AUTOSCALER_KEEPER_HTTP_PORT": str(port),
                    "AUTOSCALER_KEEPER_PUBLIC_URL": bases[i],
                    "AUTOSCALER_EC2_ACCESS_KEY_ID": KEYS[i],
                }
            )
            procs.append(
                await asyncio.create_subprocess_exec(CLI, "keeper", stdout=logs[i], stderr=logs[i], env=env)
            )
        await asyncio.gather(*(_healthy(base, proc) for base, proc in zip(bases, procs, strict=True)))

        async with aiohttp.ClientSession() as session:
            for n in range(CLUSTERS):  # through every replica in turn, as a load balancer would
                async with session.put(f"{bases[n % REPLICAS]}/v1/clusters/user{n}/w", headers=AUTH) as reply:
                    assert reply.status == 201, await reply.text()
                    cid = (await reply.json())["id"]
                found = await raw_ec2.describe_instances(
                    Filters=[{"Name": "tag:swarm-autoscaler/keeper/cluster-id", "Values": [cid]}]
                )
                (instance,) = [i for r in found["Reservations"] for i in r["Instances"]]
                primaries[instance["InstanceId"]] = cid
                await raw_ec2.create_tags(
                    Resources=[instance["InstanceId"]],
                    Tags=[{"Key": DASHBOARD_URL_TAG, "Value": f"{schedulers}/{cid}"}],
                )

            share = math.ceil(CLUSTERS / REPLICAS)

            async def settled() -> bool:
                split = await _split(session, bases)
                return None not in split and sum(s or 0 for s in split) == CLUSTERS

            await _until(settled, 60, "the replicas never held every cluster between them")
            await asyncio.sleep(3 * LEASE_TTL)  # steady: the same split, and heartbeats written meanwhile
            # a CI run once read [10, 9, 10] here: one lease between holders at the moment of the read
            await _until(settled, 30, "the replicas no longer held every cluster between them")
            before = await _whole_split(session, bases)
            print(f"\nsplit of {CLUSTERS} clusters over {REPLICAS} replicas: {before} (share {share})")
            assert sum(s or 0 for s in before) == CLUSTERS
            assert all(s is not None and s <= share for s in before)
            steady_until = time.time()

            victim = max(range(REPLICAS), key=lambda i: before[i] or 0)
            killed_at = time.time()
            procs[victim].send_signal(signal.SIGKILL)
            print(
                f"killed at {time.strftime('%H:%M:%S', time.gmtime(killed_at))}.{round(killed_at % 1 * 1000):03d}"
            )
            await procs[victim].wait()
            survivors = [b for i, b in enumerate(bases) if i != victim]

            async def taken_over() -> bool:
                split = await _split(session, survivors)
                return None not in split and sum(s or 0 for s in split) == CLUSTERS

            await _until(taken_over, 30, "the killed replica's clusters were never taken over")
            took = time.time() - killed_at
            after = await _split(session, survivors)
            print(
                f"replica {victim} (held {before[victim]}) killed with SIGKILL: its clusters taken over in "
                f"{took:.2f}s (lease TTL {LEASE_TTL}s, check interval {CHECK_INTERVAL}s); survivors now {after}"
            )
            assert took <= LEASE_TTL + 2 * CHECK_INTERVAL + 1.0  # + 1 s: a loaded shared test host
            assert all(s is not None and s <= math.ceil(CLUSTERS / (REPLICAS - 1)) for s in after)
            await asyncio.sleep(3 * LEASE_TTL)  # the new holders' heartbeat writes
            ended_at = time.time()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 30)
        for log in logs:
            log.close()
        with contextlib.suppress(Exception):
            if primaries:
                await raw_ec2.terminate_instances(InstanceIds=list(primaries))

    calls = moto.faults.recorded()
    first_steady = steady_until - 3 * LEASE_TTL
    during = _writers(calls, primaries, first_steady, steady_until)
    afterwards = _writers(calls, primaries, killed_at + took, ended_at)
    # Double actions: a cluster acted on by two replicas within one window.
    doubles = sum(len(w) - 1 for w in during.values() if len(w) > 1)
    doubles += sum(len(w) - 1 for w in afterwards.values() if len(w) > 1)
    per_replica = Counter(next(iter(w)) for w in during.values() if len(w) == 1)
    print(
        f"mutating EC2 calls by replica, steady: {dict(sorted(per_replica.items()))}; double actions: {doubles}"
    )
    assert doubles == 0, {c: w for c, w in {**during, **afterwards}.items() if len(w) > 1}
    # and from the steady split to the end, the takeover itself included: no cluster went back to a
    # replica another had driven since. (Not while the shares settle at the start: there a loaded host
    # hands clusters round the replicas as leases are given up and taken, one holder at a time.)
    settling = _writer_runs(calls, primaries, 0.0)
    runs = _writer_runs(calls, primaries, first_steady)
    returned = {cid: order for cid, order in runs.items() if len(order) != len(set(order))}
    handed = sum(1 for order in runs.values() if len(order) > 1)
    print(
        f"from the steady split on: {handed} clusters handed over, {len(returned)} driven again by an "
        f"earlier driver; over the whole run {sum(len(o) - 1 for o in settling.values())} handovers"
    )
    assert handed >= before[victim]  # the check saw the takeover's handovers
    assert not returned, returned
    assert len(during) == CLUSTERS and len(afterwards) == CLUSTERS  # every cluster was acted on, by one
    assert sorted(per_replica.values()) == sorted(s or 0 for s in before)
    assert all(KEYS[victim] not in w for w in afterwards.values())
    # a survivor mostly keeps its own clusters: the killed replica's move, and the survivors' shares
    # grow from 10 to 15, so at most a handful of theirs change hands while the counts settle
    moved = [c for c, w in during.items() if KEYS[victim] not in w and afterwards[c] != w]
    print(f"survivors' own clusters that changed hands at the takeover: {len(moved)}")
    assert len(moved) <= CLUSTERS // REPLICAS, moved
