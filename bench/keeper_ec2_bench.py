"""The keeper's cost on EC2: the real adapter (`Ec2Primaries`) on the moto server, over HTTP.

Creates `CLUSTERS` clusters (one RunInstances each), runs the keeper over them at a short check interval
until every cluster is `running`, then counts the EC2 API calls by operation over two windows: every
scheduler answering and idle, then every scheduler busy (work counts as use, so each check is a
heartbeat), over two heartbeat write intervals. Then it ends them all. Figures: seconds per create and per end, and the calls per minute in
each steady state, measured at the bench's timing and scaled to the defaults (check interval 5 s, idle
timeout 5 min, the keeper's heartbeat write interval at that timeout) for 1,000 clusters.

Run: `python -m bench keeper-ec2` (or `make bench`). `--quick` uses fewer clusters and shorter windows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import structlog

from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.locks import InProcessLocks
from swarm_autoscaler.keeper.model import ClusterKey, ClusterState
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud import MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY

INTERVAL, IDLE = 0.5, 60.0  # long enough that no cluster ends during the windows
DEFAULT_INTERVAL, AT_SCALE = 5.0, 1000


def _hosts(endpoint: str) -> Ec2Primaries:
    net = provision_network(endpoint)
    return Ec2Primaries(
        keeper_name="bench",
        region=net.region,
        endpoint=endpoint,
        access_key_id=LOCAL_ACCESS_KEY,
        secret_access_key=LOCAL_SECRET_KEY,
        primary_type="m5.large",
        ami_id=net.ami_id,
        user_data=lambda key, cid: f"#!/bin/bash\necho {cid}\n",
        subnet_ids=net.subnet_ids,
        security_group_ids=[net.security_group_id],
    )


async def _count(hosts: Ec2Primaries, window: float) -> Counter[str]:
    before = Counter(hosts.stats.api_calls)
    await asyncio.sleep(window)
    calls = Counter(hosts.stats.api_calls)
    calls.subtract(before)
    return calls


async def _all_running(keeper: Keeper, clusters: int) -> None:
    for _ in range(3000):  # ten minutes at most
        if sum(c.state == ClusterState.RUNNING for c in keeper.clusters) >= clusters:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the clusters did not all become running")


async def measure(clusters: int, window: float) -> dict[str, float]:
    from tests.keeper.fakes import FakeProbe

    with MotoServer(seed=5) as moto:
        async with _hosts(moto.endpoint) as hosts:
            started = time.perf_counter()
            made = [await hosts.create(ClusterKey(f"user{i}", "none"), hosts.now()) for i in range(clusters)]
            create_s = (time.perf_counter() - started) / clusters
            probe = FakeProbe()
            for cluster in made:
                probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=False)
            keeper = Keeper(
                hosts, probe, InProcessLocks(), KeeperTiming(IDLE, 600.0), interval=INTERVAL, clock=hosts.now
            )
            stop = asyncio.Event()
            running = asyncio.create_task(keeper.run(stop))
            warm = time.perf_counter()
            await _all_running(keeper, clusters)
            warm_s = time.perf_counter() - warm
            checks = keeper.checks
            idle = await _count(hosts, window)
            idle_checks = keeper.checks - checks
            for cluster in made:
                probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=True)
            # Count over two write intervals, from half-way between two of them (every cluster wrote its
            # first busy heartbeat as it turned busy, and they all write in step: a window starting or
            # ending at a write would count one write too many or too few per cluster).
            await asyncio.sleep(1.5 * keeper.write_every)
            busy_window = 2 * keeper.write_every
            busy = await _count(hosts, busy_window)
            stop.set()
            await running
            started = time.perf_counter()
            for cluster in made:
                await hosts.update(cluster.cluster_id, state=ClusterState.ENDING)
                while await hosts.terminate(cluster.cluster_id):
                    pass
            end_s = (time.perf_counter() - started) / clusters
            left = len(await hosts.list_clusters())
    return {
        "create_s": create_s,
        "end_s": end_s,
        "warm_s": warm_s,
        "left": left,
        "checks_per_s": idle_checks / window,
        "describe_per_min": idle["DescribeInstances"] / window * 60,
        "idle_tags_per_min": idle["CreateTags"] / window * 60,
        "busy_window": busy_window,
        "busy_tags_per_min": busy["CreateTags"] / busy_window * 60,
        "other": sum(n for op, n in (idle + busy).items() if op not in ("DescribeInstances", "CreateTags")),
    }


def main(flags: list[str]) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    clusters, window = (20, 8.0) if "--quick" in flags else (100, 20.0)
    m = asyncio.run(measure(clusters, window))
    unused = InProcessLocks()
    write_every = Keeper(None, None, unused, KeeperTiming(IDLE), interval=INTERVAL).write_every  # type: ignore[arg-type]
    default_every = Keeper(None, None, unused, KeeperTiming(), interval=DEFAULT_INTERVAL).write_every  # type: ignore[arg-type]
    print(
        f"{clusters} clusters on moto over HTTP, keeper checking every {INTERVAL:g} s (idle timeout {IDLE:g} s,"
    )
    print(
        f"  heartbeats written at most every {write_every:g} s), {window:g} s idle then {m['busy_window']:g} s busy:"
    )
    print(
        f"  create {m['create_s'] * 1000:.0f} ms per cluster (RunInstances), end {m['end_s'] * 1000:.0f} ms; "
        f"all running after {m['warm_s']:.1f} s"
    )
    print(f"  idle: {m['checks_per_s']:.0f} checks/s; DescribeInstances {m['describe_per_min']:.0f}/min")
    for name in ("idle", "busy"):
        per_write = m[f"{name}_tags_per_min"] / clusters * write_every / 60  # per cluster per write interval
        at_scale = AT_SCALE * per_write * 60 / default_every
        print(
            f"  {name}: CreateTags {m[f'{name}_tags_per_min']:.0f}/min ({per_write:.2f} per cluster per "
            f"{write_every:g} s); at the defaults with {AT_SCALE} clusters (written at most every "
            f"{default_every:g} s): {at_scale:.0f}/min"
        )
    print(
        f"  other calls {m['other']:.0f}; {m['left']:.0f} clusters left after ending; at the defaults "
        f"DescribeInstances {60 / DEFAULT_INTERVAL:.0f}/min per replica (1 page for 1,000 clusters)"
    )
