"""The keeper's cost on EC2: the real adapter (`Ec2Primaries`) on the moto server, over HTTP.

Creates `CLUSTERS` clusters (one RunInstances each), runs the keeper over them for a window at a short
check interval with every scheduler answering and idle, counts the EC2 API calls by operation, then
ends them all. Figures: seconds per create and per end, and the calls per minute the keeper makes in
steady state, measured at the bench's timing and scaled to the defaults (check interval 5 s, idle timeout
5 min, so heartbeats are written every 30 s) for 1,000 clusters.

Run: `python -m bench keeper-ec2` (or `make bench`). `--quick` uses fewer clusters and a shorter window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import structlog

from swarm_autoscaler.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.lifecycle import KeeperTiming, Probe
from swarm_autoscaler.keeper.locks import InProcessLocks
from swarm_autoscaler.keeper.model import ClusterKey, ClusterState
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler.localcloud import MotoServer, provision_network
from swarm_autoscaler.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY

INTERVAL, IDLE = 0.5, 20.0  # heartbeats written every max(IDLE / 10, INTERVAL) = 2 s
DEFAULT_INTERVAL, DEFAULT_WRITE_EVERY, AT_SCALE = 5.0, 30.0, 1000


async def measure(clusters: int, window: float) -> dict[str, float]:
    from tests.keeper.fakes import FakeProbe

    with MotoServer(seed=5) as moto:
        net = provision_network(moto.endpoint)
        hosts = Ec2Primaries(
            keeper_name="bench",
            region=net.region,
            endpoint=moto.endpoint,
            access_key_id=LOCAL_ACCESS_KEY,
            secret_access_key=LOCAL_SECRET_KEY,
            primary_type="m5.large",
            ami_id=net.ami_id,
            user_data=lambda key, cid: f"#!/bin/bash\necho {cid}\n",
            subnet_ids=net.subnet_ids,
            security_group_ids=[net.security_group_id],
        )
        async with hosts:
            started = time.perf_counter()
            made = [await hosts.create(ClusterKey(f"user{i}", "none"), hosts.now()) for i in range(clusters)]
            create_s = (time.perf_counter() - started) / clusters
            probe = FakeProbe()
            for cluster in made:
                probe.answers[cluster.dashboard_url] = Probe(answered=True, busy=False)
            keeper = Keeper(
                hosts, probe, InProcessLocks(), KeeperTiming(IDLE, 600.0), interval=INTERVAL, clock=hosts.now
            )
            before = Counter(hosts.stats.api_calls)
            stop = asyncio.Event()
            running = asyncio.create_task(keeper.run(stop))
            await asyncio.sleep(window)
            calls = Counter(hosts.stats.api_calls)
            calls.subtract(before)
            checks = keeper.checks
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
        "left": left,
        "checks_per_s": checks / window,
        "describe_per_min": calls["DescribeInstances"] / window * 60,
        "tags_per_min": calls["CreateTags"] / window * 60,
        "other": sum(n for op, n in calls.items() if op not in ("DescribeInstances", "CreateTags")),
    }


def main(flags: list[str]) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    clusters, window = (20, 6.0) if "--quick" in flags else (100, 20.0)
    m = asyncio.run(measure(clusters, window))
    write_every = max(IDLE / 10, INTERVAL)
    tags_per_cluster = m["tags_per_min"] / clusters * write_every / 60  # CreateTags per cluster per write
    print(f"{clusters} clusters on moto over HTTP, keeper checking every {INTERVAL:g} s for {window:g} s:")
    print(
        f"  create {m['create_s'] * 1000:.0f} ms per cluster (RunInstances), end {m['end_s'] * 1000:.0f} ms"
    )
    print(f"  {m['checks_per_s']:.0f} checks/s; EC2 calls: DescribeInstances {m['describe_per_min']:.0f}/min")
    print(
        f"  (one listing, then an interval's wait), CreateTags {m['tags_per_min']:.0f}/min ({tags_per_cluster:.2f} per"
    )
    print(
        f"  cluster per heartbeat write), other calls {m['other']:.0f}; {m['left']:.0f} clusters left after ending"
    )
    per_min_tags = AT_SCALE * tags_per_cluster * 60 / DEFAULT_WRITE_EVERY
    print(
        f"  at the defaults with {AT_SCALE} clusters: DescribeInstances {60 / DEFAULT_INTERVAL:.0f}/min per "
        f"replica (1 page), CreateTags {per_min_tags:.0f}/min ({per_min_tags / 60:.0f}/s)"
    )
