"""act with the warm pool's actions: a Stop is re-checked and fenced as a termination, batched into one
cloud call, and removes its node; a Start is gentle, and a refusal for capacity is an outcome of kind
"capacity" that backs the pair off (the next plan launches instead)."""

from __future__ import annotations

import dataclasses

from tests.daemon.test_act import CLUSTER, World

from swarm_autoscaler.core.actions import HostIdle, Launch, NodeOurs, Plan, Start, Stop
from swarm_autoscaler.core.model import InstanceState, PoolPhase
from swarm_autoscaler.daemon.act import ActConfig, act


def _stop(n: int, node: str, host: str) -> Stop:
    return Stop((f"i-{n:04d}",), "drained; into the pool", (node,), expect=(HostIdle(host), NodeOurs(node)))


async def test_stops_are_fenced_batched_and_remove_their_nodes() -> None:
    w = World()
    (n1, h1), (n2, h2) = w.machine(1), w.machine(2)
    outcomes = await act(
        Plan((_stop(1, n1, h1), _stop(2, n2, h2))), w.snapshot(), w.ports, config=ActConfig(CLUSTER)
    )
    assert all(o.ok for o in outcomes), outcomes
    assert [c for c in w.cloud.calls if c[0] == "stop"] == [("stop", ("i-0001", "i-0002"))]
    assert {w.cloud.instances[i].state for i in ("i-0001", "i-0002")} == {InstanceState.STOPPED}
    assert n1 not in w.swarm.nodes and n2 not in w.swarm.nodes
    assert ("fence", (h1, h2)) in w.workload.fence_calls


async def test_a_stop_whose_machine_got_work_is_skipped() -> None:
    w = World()
    node, host = w.machine(1, worker=False)
    w.workload.workers.append(World.worker(1, tasks=1))  # work arrived after the plan
    [outcome] = await act(Plan((_stop(1, node, host),)), w.snapshot(), w.ports, config=ActConfig(CLUSTER))
    assert outcome.kind == "skipped" and "has work" in outcome.detail
    assert w.cloud.instances["i-0001"].state is InstanceState.RUNNING and node in w.swarm.nodes
    assert not [c for c in w.cloud.calls if c[0] == "stop"]


async def test_a_start_runs_and_a_refused_start_is_a_capacity_outcome() -> None:
    w = World()
    for n in (1, 2):
        w.machine(n, worker=False)
        w.cloud.instances[f"i-{n:04d}"] = dataclasses.replace(
            w.cloud.instances[f"i-{n:04d}"], state=InstanceState.STOPPED
        )
    [ok] = await act(Plan((Start(("i-0001",), "m5.large", "work"),)), w.snapshot(), w.ports)
    assert ok.ok and w.cloud.instances["i-0001"].pool is PoolPhase.START
    assert w.cloud.instances["i-0001"].launched_at == w.clock.now
    w.cloud.refuse_types.add("m5.large")
    [refused, launch] = await act(
        Plan((Start(("i-0002",), "m5.large", "work"), Launch("m5.xlarge", 1, "work"))), w.snapshot(), w.ports
    )
    assert (refused.ok, refused.kind) == (False, "capacity")
    assert launch.ok  # a refusal blocks nothing else
    assert w.cloud.unavailable(w.clock.now)[0].type_name == "m5.large"


async def test_a_pool_launch_reaches_the_cloud_as_one() -> None:
    w = World()
    [outcome] = await act(Plan((Launch("m5.large", 2, "refill", pool=True),)), w.snapshot(), w.ports)
    assert outcome.ok
    assert {i.pool for i in w.cloud.instances.values()} == {PoolPhase.PREPARE}
