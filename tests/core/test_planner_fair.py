"""Rules of a fair and frugal planner (issue 37), one scenario per rule, the WHOLE Plan compared.

Each scenario stands in for a case a peer's unit tests (the modelled-on system's) ran against our
planner, or for a defect measured in the simulator; each failed on the planner before its fix.
Plain data in (the builders of tests/builders.py), the plan out: no fake, no clock but `NOW`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from tests.builders import (
    NOW,
    assemble,
    hostname,
    launch_reason,
    machine,
    make_instance,
    make_instance_type,
    make_node,
    make_policy,
    make_snapshot,
    make_task,
    make_tasks,
    make_worker,
)
from tests.builders import worker_address as addr

from swarm_autoscaler.core.actions import (
    ActivateNode,
    Cordon,
    DrainNode,
    HostIdle,
    Launch,
    NodeOurs,
    NodeUpdate,
    Plan,
    Retired,
    RetireWorkers,
    Start,
    Terminate,
)
from swarm_autoscaler.core.model import (
    Arrivals,
    Availability,
    InstanceState,
    NodeMarks,
    Policy,
    Snapshot,
    TypePolicy,
)
from swarm_autoscaler.core.plan import plan

GPU = "g4dn.xlarge"
DRAINED = NodeMarks(ready=True, drained_since=NOW - 10)
IDLE = NodeMarks(ready=True, empty_since=NOW - 61)  # empty past the drain delay (60 s)


def launch(type_name: str, count: int, tasks: int) -> Launch:
    return Launch(type_name, count, launch_reason(tasks, type_name))


def reactivated(n: int, marks: NodeMarks = DRAINED) -> NodeUpdate:
    changed = dataclasses.replace(marks, drained_since=None, empty_since=None)
    return NodeUpdate(f"node-{n}", "reactivated for pending work", changed)


def activate(n: int, tasks: int = 1) -> ActivateNode:
    return ActivateNode(f"node-{n}", hostname(n), f"{tasks} pending task(s) fit on this drained node")


# Six types, one pinned job shape each that fills a whole machine of its type: 150 jobs of each type
# want 150 machines of it. With room for 50, a fair split gives each type 8 or 9.
SIX = tuple(make_instance_type(f"t{c}.big", c, 4 * c, price=0.05 * c) for c in (2, 4, 8, 16, 32, 64))


def pinned_jobs(per_type: int) -> tuple:  # type: ignore[type-arg]
    return tuple(
        make_task(f"{t.name}-{i}", t.resources.cpus, 4 * t.resources.cpus, pinned=t.name)
        for t in SIX
        for i in range(per_type)
    )


def five_each() -> tuple:  # type: ignore[type-arg]
    """Five machines' worth of pinned work for each of three types (one job fills one machine)."""
    shapes = (("m5.large", 2, 8), ("m5.xlarge", 4, 16), ("c5.2xlarge", 8, 16))
    return tuple(make_task(f"{n}-{i}", c, r, pinned=n) for n, c, r in shapes for i in range(5))


@dataclass(frozen=True)
class Case:
    name: str
    snapshot: Snapshot
    expected: Plan
    policy: Policy


def retire(n: int) -> RetireWorkers:
    return RetireWorkers((addr(n),), "idle for at least drain_delay=60s", (HostIdle(hostname(n)),))


def drain(n: int, reason: str, marks: NodeMarks | None = None) -> DrainNode:
    """The expected drain of node `n`, carrying the node's new marks (`core.updates`)."""
    expect = (HostIdle(hostname(n)), NodeOurs(f"node-{n}"), Retired(hostname(n)))
    return DrainNode(f"node-{n}", hostname(n), reason, expect, marks)


def gpu_base(**kw: object) -> Policy:
    gpu = TypePolicy(GPU, **kw)  # type: ignore[arg-type]
    return make_policy((TypePolicy("m5.large"), TypePolicy("m5.xlarge"), gpu))


CASES = [
    Case(
        "at the cap, needs of 5/5/5 machines with room for 8 are split 3/3/2, not 5/3/0",
        make_snapshot(unrunnable=five_each()),
        Plan(
            (launch("c5.2xlarge", 3, 3), launch("m5.xlarge", 3, 3), launch("m5.large", 2, 2)),
            pending=15,
            placed=(("new", 8),),
        ),
        make_policy(max_instances=8),
    ),
    Case(
        "at the cap, 150 pinned jobs for each of 6 types with room for 50 get 9/9/8/8/8/8 machines",
        make_snapshot(unrunnable=pinned_jobs(150), types=SIX),
        Plan(
            tuple(launch(t.name, n, n) for t, n in zip(reversed(SIX), (9, 9, 8, 8, 8, 8), strict=True)),
            pending=900,
            placed=(("new", 50),),
        ),
        make_policy(tuple(t.name for t in SIX), max_instances=50),
    ),
    Case(
        "below the cap every type gets all it needs (no share is taken from anyone)",
        make_snapshot(unrunnable=five_each()),
        Plan(
            (launch("c5.2xlarge", 5, 5), launch("m5.xlarge", 5, 5), launch("m5.large", 5, 5)),
            pending=15,
            placed=(("new", 15),),
        ),
        make_policy(max_instances=20),
    ),
    Case(
        "a type's base (minimum 2) stays active with its workers however long it idles",
        assemble(machine(1, GPU, marks=IDLE), machine(2, GPU, marks=IDLE)),
        Plan(),
        gpu_base(minimum=2),
    ),
    Case(
        "above its base a type's idle machines are drained as usual, the base's kept",
        assemble(machine(1, GPU, marks=IDLE), machine(2, GPU, marks=IDLE), machine(3, GPU, marks=IDLE)),
        Plan(
            (
                retire(3),
                drain(3, "empty for 61s (drain_delay 60s)", NodeMarks(ready=True, drained_since=NOW)),
            )
        ),
        gpu_base(minimum=2),
    ),
]


def gpu_work(n: int) -> tuple:  # type: ignore[type-arg]
    return make_tasks(n, "gpu", gpus=1, cpus=2, ram_gib=4)


def drained_gpu(n: int) -> tuple:  # type: ignore[type-arg]
    return machine(n, GPU, worker=False, availability=Availability.DRAIN, marks=DRAINED)


def stopped(n: int, type_name: str) -> tuple:  # type: ignore[type-arg]
    return make_instance(n, type_name, InstanceState.STOPPED), None, None


def terminate(n: int, reason: str, marks: NodeMarks) -> tuple[Terminate]:
    """The expected termination of machine `n`, its node's terminating mark riding in it (written only
    when the termination goes ahead)."""
    node = f"node-{n}"
    ending = dataclasses.replace(marks, termination_started=NOW)
    expect = (HostIdle(hostname(n)), NodeOurs(node))
    return (Terminate((f"i-{n:04d}",), reason, (node,), expect=expect, marks=ending),)


def unowned_worker(n: int, cpus: float) -> tuple:  # type: ignore[type-arg]
    """A node the daemon did not launch (a static base, a manager's worker) with an idle dask worker."""
    return None, make_node(n, ours=False), make_worker(n, cpus, 16)


LONG_IDLE = NodeMarks(ready=True, drained_since=NOW - 700)
RESERVE_LIMIT = TypePolicy("m5.large", reserve=1, reserve_idle_limit=600.0)

CASES += [
    Case(
        "the queue threshold counts a drained base: 4 GPU jobs below surge_above=5 launch nothing",
        assemble(drained_gpu(1), drained_gpu(2), unrunnable=gpu_work(4)),
        Plan(
            (reactivated(1), reactivated(2), activate(1), activate(2)),
            pending=4,
            placed=(("drained", 2), ("below-surge", 2)),
        ),
        gpu_base(minimum=2, surge_above=5),
    ),
    Case(
        "a drained GPU machine is not reactivated for CPU-only work a cheaper type fits",
        assemble(drained_gpu(1), unrunnable=make_tasks(1)),
        Plan((launch("m5.large", 1, 1),), pending=1, placed=(("new", 1),)),
        gpu_base(),
    ),
    Case(
        "a drained GPU machine is reactivated for GPU work",
        assemble(drained_gpu(1), unrunnable=gpu_work(1)),
        Plan((reactivated(1), activate(1)), pending=1, placed=(("drained", 1),)),
        gpu_base(),
    ),
    Case(
        "an empty reserve is filled by starting a stopped warm-pool machine, not by a launch",
        assemble(stopped(1, "m5.large")),
        Plan((Start(("i-0001",), "m5.large", "fill the reserve of 1 warm m5.large from its warm pool"),)),
        make_policy((TypePolicy("m5.large", reserve=1, warm_pool=1),)),
    ),
    Case(
        "a reserve unused past its inactivity limit is let go",
        assemble(machine(1, worker=False, availability=Availability.DRAIN, marks=LONG_IDLE)),
        Plan(terminate(1, "reserve unused for 700s (reserve_idle_limit 600s)", LONG_IDLE)),
        make_policy((RESERVE_LIMIT,)),
    ),
    Case(
        "a reserve past its inactivity limit is not refilled while its type stays unused",
        make_snapshot(),
        Plan(),
        make_policy((RESERVE_LIMIT,)),
    ),
    Case(
        "idle room on a worker the daemon does not own takes queued work before any launch",
        assemble(machine(1, processing=make_tasks(5, "q")), unowned_worker(9, 4)),
        Plan(pending=3, placed=(("unowned", 3),)),
        make_policy(),
    ),
]


# ------------------------------------------------------------------------------------ spot notices
# A rebalance recommendation (EC2: this spot machine is at raised risk) is advice, not an interruption:
# Karpenter only records an event for it. Before, it was handled as one: busy workers were retired and
# their running work redone elsewhere.

REBALANCE = NOW - 10
LET_GO = f"EC2 gave notice at {REBALANCE:.0f} that it takes i-0001 back"


def rebalanced(parts: tuple, interrupted: bool = False) -> tuple:  # type: ignore[type-arg]
    inst, node, worker = parts
    inst = dataclasses.replace(inst, spot=True, rebalance_at=REBALANCE)
    if interrupted:
        inst = dataclasses.replace(inst, interrupted_at=REBALANCE)
    return inst, node, worker


def busy(n: int) -> tuple:  # type: ignore[type-arg]
    running = [dataclasses.replace(t, executing=True) for t in make_tasks(2, f"run{n}-")]
    return machine(n, processing=running)


def rebalance_cordon(n: int) -> Cordon:
    why = f"EC2 recommends rebalancing i-{n:04d} (notice at {REBALANCE:.0f}): it takes no new task"
    marks = NodeMarks(ready=True, cordoned_since=NOW)  # the node's marks, cordoned now (`core.updates`)
    return Cordon(f"node-{n}", hostname(n), (addr(n),), why, (NodeOurs(f"node-{n}"),), marks)


def replacement(n: int) -> Launch:
    why = f"1 to replace i-{n:04d} early (EC2 recommends rebalancing it)"
    return Launch("m5.large", 1, why)


def cordoned(parts: tuple) -> tuple:  # type: ignore[type-arg]
    inst, node, worker = parts
    node = dataclasses.replace(node, marks=NodeMarks(ready=True, cordoned_since=NOW - 5))
    return inst, node, dataclasses.replace(worker, retiring=True)


CASES += [
    Case(
        "a rebalance recommendation on a busy machine: replacement launched early, worker cordoned",
        assemble(rebalanced(busy(1))),
        Plan((replacement(1), rebalance_cordon(1))),
        make_policy(),
    ),
    Case(
        "once cordoned for a rebalance recommendation, a busy machine is left to finish its work",
        assemble(cordoned(rebalanced(busy(1)))),
        Plan(),
        make_policy(),
    ),
    Case(
        "an idle machine with a rebalance recommendation is let go at once, as for an interruption",
        assemble(rebalanced(machine(1))),
        Plan(
            (
                RetireWorkers(
                    (addr(1),), f"{LET_GO}: its results move to workers that stay", (NodeOurs("node-1"),)
                ),
                DrainNode(
                    "node-1",
                    hostname(1),
                    LET_GO,
                    (Retired(hostname(1)), NodeOurs("node-1")),
                ),
                Terminate(
                    ("i-0001",),
                    f"{LET_GO}: let go",
                    ("node-1",),
                    expect=(HostIdle(hostname(1)), Retired(hostname(1)), NodeOurs("node-1")),
                    marks=NodeMarks(ready=True, termination_started=NOW),  # written only if it goes ahead
                ),
            )
        ),
        make_policy(),
    ),
    Case(
        "an interruption warning on a busy machine is handled as before: retired, drained, replaced",
        assemble(rebalanced(busy(1), interrupted=True)),
        Plan(
            (
                launch("m5.large", 1, 2),
                RetireWorkers(
                    (addr(1),), f"{LET_GO}: its results move to workers that stay", (NodeOurs("node-1"),)
                ),
                DrainNode(
                    "node-1",
                    hostname(1),
                    LET_GO,
                    (Retired(hostname(1)), NodeOurs("node-1")),
                ),
                Terminate(
                    ("i-0001",),
                    f"{LET_GO}: let go",
                    ("node-1",),
                    expect=(HostIdle(hostname(1)), Retired(hostname(1)), NodeOurs("node-1")),
                    marks=NodeMarks(ready=True, termination_started=NOW),  # written only if it goes ahead
                ),
            ),
            pending=2,
            placed=(("new", 2),),
        ),
        make_policy(),
    ),
]


# ------------------------------------------------------------------------------- idle that pays off
# How long an idle machine is kept follows the arrivals the daemon has seen (core/arrivals.py): kept
# for the drain and termination delays only while the next task for its type is expected within what a
# relaunch costs (2 x tolerated_wait = 240 s here). Measured: a trickle of one job every 10 minutes,
# each on a fresh machine, billed 2 minutes of idling per machine.

TRICKLE = Arrivals(last=NOW - 300, gap=600)  # the next task for m5.large: in 300 s
STREAM = Arrivals(last=NOW - 20, gap=30)  # in 10 s
EMPTY_6S = NodeMarks(ready=True, empty_since=NOW - 6)


def seen(snapshot: Snapshot, **arrivals: Arrivals) -> Snapshot:
    by_type = {name.replace("_", "."): a for name, a in arrivals.items()}
    return dataclasses.replace(snapshot, arrivals=by_type)


WHY_TRICKLE = (
    "idle_floor 5s: the next task for m5.large is expected in 300s (one every 600s), "
    "later than a relaunch costs (240s)"
)

CASES += [
    Case(
        "an idle machine whose next task is expected later than a relaunch costs: drained after "
        "idle_floor and terminated in the same plan (re-checked idle and retired after the drain)",
        seen(assemble(machine(1, marks=EMPTY_6S)), m5_large=TRICKLE),
        Plan(
            (
                RetireWorkers((addr(1),), f"idle for at least 5s ({WHY_TRICKLE})", (HostIdle(hostname(1)),)),
                drain(1, f"empty for 6s ({WHY_TRICKLE})", NodeMarks(ready=True, drained_since=NOW)),
                Terminate(
                    ("i-0001",),
                    f"let go once drained ({WHY_TRICKLE})",
                    ("node-1",),
                    expect=(HostIdle(hostname(1)), Retired(hostname(1)), NodeOurs("node-1")),
                    marks=NodeMarks(ready=True, drained_since=NOW, termination_started=NOW),
                ),
            )
        ),
        make_policy(),
    ),
    Case(
        "and once drained it is terminated at once, not after termination_delay",
        seen(
            assemble(machine(1, worker=False, availability=Availability.DRAIN, marks=DRAINED)),
            m5_large=TRICKLE,
        ),
        Plan(terminate(1, f"drained for at least 0s ({WHY_TRICKLE}), beyond the reserve", DRAINED)),
        make_policy(),
    ),
    Case(
        "an idle machine whose next task is expected soon is kept for drain_delay as before",
        seen(assemble(machine(1, marks=EMPTY_6S)), m5_large=STREAM),
        Plan(),
        make_policy(),
    ),
    Case(
        "with idle_learning off the delays are the policy's whatever was seen",
        seen(assemble(machine(1, marks=EMPTY_6S)), m5_large=TRICKLE),
        Plan(),
        dataclasses.replace(make_policy(), idle_learning=False),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_rule(case: Case) -> None:
    assert plan(case.snapshot, case.policy) == case.expected
