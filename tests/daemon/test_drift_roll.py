"""The drift roll of tests/e2e/test_drift.py on the local cloud without dockerd, in `make test`'s fast lane:
the real daemon built from settings, moto over HTTP for EC2 (the AMI an image registered there), a real
dask scheduler with real workers (the machine emulator's, in-process), and the in-memory swarm standing in
for dockerd. An operator patches m5.large's AMI under load and restarts the daemon with a drift budget of 1:
the two busy machines roll one at a time, replacement first; the one labelled do-not-disrupt is held as it
is until the label is lifted; no busy machine is disrupted and every job completes. The e2e test runs the
same scenario on real dockerd nodes booting from their user data."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from distributed import Client, Event
from tests.e2e.helpers import Record, ec2_client, hostname_of, owned_instances, phase, start, wait_for

from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.actions import Cordon, DrainNode, Launch, RetireWorkers, Stop, Terminate
from swarm_autoscaler.core.budgets import DO_NOT_DISRUPT_LABEL
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

pytestmark = [pytest.mark.timeout(180)]

TYPES = {"m5.large": {}, "m5.xlarge": {}, "r5.large": {}}
Label = Callable[[str, bool], Awaitable[None]]  # (node id, on): the do-not-disrupt label put on or taken off
BUDGET = json.dumps([{"nodes": "1", "reasons": ["drift"]}])
JOB_TIMEOUT_S = 300.0  # a job waits at most this long for its event (the test sets it far sooner)


def _new_ami(lc: LocalCloud) -> str:
    """The patched image, registered in moto as an operator registers a new AMI."""
    reply = ec2_client(lc).register_image(
        Name=f"patched-{time.time_ns()}", Architecture="x86_64", RootDeviceName="/dev/xvda"
    )
    return str(reply["ImageId"])


def _types_with(lc: LocalCloud, ami: str, **m5_large: Any) -> str:
    """The local cloud's AUTOSCALER_EC2_ALLOWED_TYPES with m5.large's AMI changed to `ami` (and its other
    settings updated with `m5_large`)."""
    types: dict[str, dict[str, Any]] = json.loads(lc.env()["AUTOSCALER_EC2_ALLOWED_TYPES"])
    types["m5.large"] = {**types["m5.large"], "ami_id": ami, **m5_large}
    return json.dumps(types)


def _host_running(lc: LocalCloud, key: str) -> str | None:
    assert lc.scheduler is not None
    ts = lc.scheduler.tasks.get(key)
    worker = getattr(ts, "processing_on", None)
    return machine_hostname(str(worker.name)) if worker is not None else None


@dataclass(frozen=True)
class Machine:
    host: str
    node_id: str
    instance_id: str
    addresses: frozenset[str]  # its dask workers'


def _disrupted(rec: Record, m: Machine) -> list[tuple[float, str]]:
    """(time, kind) of every disruptive action the daemon carried out on machine `m`."""
    out = []
    for t, a in rec.actions:
        hit = (
            (
                isinstance(a, Cordon | DrainNode)
                and (machine_hostname(a.hostname) == m.host or a.node_id == m.node_id)
            )
            or (isinstance(a, RetireWorkers) and bool(m.addresses & set(a.addresses)))
            or (isinstance(a, Terminate | Stop) and m.instance_id in a.instance_ids)
        )
        if hit:
            out.append((t, type(a).__name__))
    return out


def _held(rec: Record, host: str, by: str) -> bool:
    return any(
        machine_hostname(h.hostname) == host and h.reason == "drift" and h.by == by
        for r in rec.results
        for h in r.plan.held
    )


@pytest_asyncio.fixture
async def cloud() -> AsyncIterator[LocalCloud]:
    options = LocalCloudOptions(fast=True, cluster_name="drift", allowed_types=TYPES, max_instances=6)
    async with LocalCloud(options) as lc:
        assert lc.emulator is not None
        yield lc


async def test_a_new_ami_rolls_the_busy_fleet_one_at_a_time_sparing_do_not_disrupt(cloud: LocalCloud) -> None:
    swarm = cloud.orchestrator
    assert isinstance(swarm, MemorySwarm)

    async def label(node_id: str, on: bool) -> None:
        node = swarm.nodes[node_id]
        labels = {k: v for k, v in node.labels.items() if k != DO_NOT_DISRUPT_LABEL}
        swarm.nodes[node_id] = dataclasses.replace(
            node, labels=labels | ({DO_NOT_DISRUPT_LABEL: "true"} if on else {})
        )

    await roll_to_a_new_ami(cloud, "", label)


async def roll_to_a_new_ami(lc: LocalCloud, foreign_instance: str, label: Label) -> None:
    """The scenario (see the module docstring), on the local cloud `lc`; `label(node_id, on)` puts the
    do-not-disrupt label on a node or takes it off."""
    assert lc.scheduler is not None and lc.orchestrator is not None and lc.network is not None
    old_ami = lc.network.ami_id
    phases: dict[str, float] = {}
    before = set(owned_instances(lc, ("pending", "running", "shutting-down", "terminated")))
    started = time.monotonic()
    async with Client(lc.scheduler_address, asynchronous=True) as client:
        go = {name: Event(f"drift-go-{name}-{time.time_ns()}", client=client) for name in ("b", "c")}
        # 1. Two machines of the old AMI (a base of two m5.large: they wait, idle, with their workers),
        # then one job on each (dask would pile jobs submitted before the workers on the first to join).
        scheduler = lc.scheduler
        base = {"AUTOSCALER_EC2_ALLOWED_TYPES": _types_with(lc, old_ami, min=2)}
        async with lc.daemon(base) as daemon:
            first = await start(daemon)
            try:
                await wait_for(lambda: len(scheduler.workers) == 2, 240, "two m5.large up with their workers")
                addresses = sorted(scheduler.workers)
                jobs = {
                    name: client.submit(
                        go[name].wait,
                        JOB_TIMEOUT_S,
                        key=f"drift-{name}",
                        workers=[address],
                        allow_other_workers=False,
                        pure=False,
                    )
                    for name, address in zip("bc", addresses, strict=True)
                }
                await wait_for(
                    lambda: len({_host_running(lc, f"drift-{n}") for n in "bc"} - {None}) == 2,
                    30,
                    "both jobs running, on two machines",
                )
            finally:
                await first.halt()
        hosts = {n: str(_host_running(lc, f"drift-{n}")) for n in "bc"}
        nodes = {machine_hostname(n.hostname): n.id for n in await lc.orchestrator.list_nodes()}
        old = {hostname_of(i): iid for iid, i in owned_instances(lc).items() if iid not in before}
        assert set(old) == set(hosts.values()), (old, hosts)
        assert all(i["ImageId"] == old_ami for i in owned_instances(lc).values())
        workers = lc.scheduler.workers.values()
        b, c = (
            Machine(
                h,
                nodes[h],
                old[h],
                frozenset(w.address for w in workers if machine_hostname(str(w.name)) == h),
            )
            for h in (hosts["b"], hosts["c"])
        )
        host_b, host_c = b.host, c.host
        started = phase("two busy machines of the old AMI", started, phases)

        # 2. The operator labels B do-not-disrupt, patches m5.large's AMI and restarts the daemon with a
        # drift budget of 1.
        await label(b.node_id, True)
        new_ami = _new_ami(lc)
        settings = {
            "AUTOSCALER_EC2_ALLOWED_TYPES": _types_with(lc, new_ami),
            "AUTOSCALER_DISRUPTION_BUDGETS": BUDGET,
        }
        async with lc.daemon(settings) as daemon:
            second = await start(daemon)
            rec = second.record
            try:
                # C is rolled (cordoned, its replacement launched in the same plan); B is held as it is.
                await wait_for(
                    lambda: any(machine_hostname(a.hostname) == host_c for a in rec.of(Cordon)),
                    30,
                    "C cordoned",
                )
                assert _held(rec, host_b, "do-not-disrupt")
                started = phase("C cordoned, B held (do-not-disrupt)", started, phases)
                # The label is lifted: B is now held by the budget while C's roll is in flight.
                await label(b.node_id, False)
                await wait_for(lambda: _held(rec, host_b, "budget"), 30, "B held by the drift budget")
                await go["c"].set()
                results = {"c": await jobs["c"]}
                done_c = time.monotonic()
                started = phase("C's job done, B held (budget)", started, phases)
                # C, idle and cordoned, is drained and terminated; only then is B rolled.
                await wait_for(
                    lambda: any(machine_hostname(a.hostname) == host_b for a in rec.of(Cordon)),
                    60,
                    "B cordoned",
                )
                started = phase("C ended, B cordoned", started, phases)
                await go["b"].set()
                results["b"] = await jobs["b"]
                done_b = time.monotonic()
                assert all(j.status == "finished" for j in jobs.values()) and results == {
                    "b": True,
                    "c": True,
                }
                for job in jobs.values():
                    job.release()
                await wait_for(
                    lambda: not owned_instances(lc), 150, "the fleet back at 0 (replacements idle)"
                )
                ticks, seen = rec.results, len(rec.results)
                await wait_for(
                    lambda: len(ticks) > seen and not ticks[-1].plan.actions,
                    20,
                    "a tick with nothing to do",
                )
                started = phase("B ended, replacements joined and scaled down", started, phases)
            finally:
                await second.halt()

    # The roll: both old machines ended, each replaced first by one machine of the new AMI.
    ever = owned_instances(lc, ("pending", "running", "shutting-down", "terminated"))
    launched_second = {iid: i for iid, i in ever.items() if iid not in before and iid not in old.values()}
    assert len(launched_second) == 2 and {i["ImageId"] for i in launched_second.values()} == {new_ami}
    assert all(i["ImageId"] == old_ami for iid, i in ever.items() if iid in old.values())
    assert sum(a.count for a in rec.of(Launch)) == 2
    terminated = {iid for a in rec.of(Terminate) for iid in a.instance_ids}
    assert set(old.values()) <= terminated
    # 0 busy disruptions: nothing touched B or C while its job ran, except C's and B's own cordons (no new
    # task; the running one finishes undisturbed); B, while labelled, not even that.
    for m, done in ((b, done_b), (c, done_c)):
        acts = _disrupted(rec, m)
        assert [k for t, k in acts if t < done and k != "Cordon"] == [], (m, acts)
        assert "Terminate" in [k for _, k in acts], (m, acts)
    # the budget of 1: B's roll began only once C's machine was terminated
    cordon_b = min(t for t, k in _disrupted(rec, b) if k == "Cordon")
    end_c = min(t for t, k in _disrupted(rec, c) if k == "Terminate")
    assert end_c <= cordon_b
    assert all(not a.instance_ids or foreign_instance not in a.instance_ids for a in rec.of(Terminate))
    print(f"drift e2e phases: {json.dumps({k: round(v, 1) for k, v in phases.items()})}")
