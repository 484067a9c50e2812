"""One scenario per planner rule: plain data in, the WHOLE Plan compared out."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from tests.builders import (
    CATALOGUE,
    NOW,
    Machine,
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
    unlabelled,
)
from tests.builders import worker_address as addr
from tests.core.randomized import apply

from swarm_autoscaler.core.actions import (
    Action,
    ActivateNode,
    Cordon,
    DrainNode,
    HostIdle,
    Launch,
    NodeDown,
    NodeOurs,
    NodeUpdate,
    NoTasks,
    NothingWaits,
    NotJoined,
    NoWorker,
    Plan,
    RemoveNode,
    Retired,
    RetireWorkers,
    Terminate,
    Uncordon,
    Unplaceable,
)
from swarm_autoscaler.core.cluster import Bucket, allowed, classify
from swarm_autoscaler.core.marks import STRAY_RETIREMENT
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Availability,
    InstanceState,
    NodeMarks,
    NodeStatus,
    Policy,
    Resources,
    Snapshot,
    Task,
    TypePolicy,
    Unavailable,
)
from swarm_autoscaler.core.plan import plan

GIB = 1024**3
DRAINED = NodeMarks(ready=True, drained_since=NOW - 10)


def launch(type_name: str, count: int, tasks: int) -> Launch:
    return Launch(type_name, count, launch_reason(tasks, type_name))


@dataclass(frozen=True)
class Marked:
    """An expected change of node `n`'s marks, written as the changes to its marks in the case's
    snapshot. The Case resolves it where the plan carries a node's marks (`core.updates`): the node's
    NodeUpdate with its complete new marks, or its DrainNode when the expected plan drains it; an
    expected Cordon or Uncordon carries the node's resolved marks with `cordoned_since` set (now) or
    cleared."""

    n: int
    why: str
    changes: dict[str, float | bool | None]


def mark(n: int, why: str, **changes: float | bool | None) -> NodeUpdate:
    return Marked(n, why, changes)  # type: ignore[return-value]  # resolved by Case.__post_init__


def _resolved(expected: Plan, snapshot: Snapshot) -> Plan:
    marks = {n.id: n.marks for n in snapshot.nodes}
    draining = {a.node_id for a in expected.actions if isinstance(a, DrainNode)}
    ending = {a.node_ids[0] for a in expected.actions if isinstance(a, Terminate) and len(a.node_ids) == 1}
    for a in expected.actions:
        if isinstance(a, Marked):
            node = f"node-{a.n}"
            marks[node] = replace(marks[node], **a.changes)  # type: ignore[arg-type]
    actions: list[Action] = []
    for a in expected.actions:
        match a:
            case Marked(n=n) if f"node-{n}" in draining | ending:
                continue
            case Marked(n=n, why=why):
                actions.append(NodeUpdate(f"node-{n}", why, marks[f"node-{n}"]))
            case DrainNode(node_id=node) if _before_end(marks, snapshot, node) != _observed(snapshot, node):
                actions.append(replace(a, marks=_before_end(marks, snapshot, node)))
            case Terminate(node_ids=(node,)) if node in marks and marks[node] != _observed(snapshot, node):
                actions.append(replace(a, marks=marks[node]))
            case Cordon(node_id=node):
                actions.append(replace(a, marks=replace(marks[node], cordoned_since=NOW)))
            case Uncordon(node_id=node):
                actions.append(replace(a, marks=replace(marks[node], cordoned_since=None)))
            case _:
                actions.append(a)
    return replace(expected, actions=tuple(actions))


def _before_end(marks: dict[str, NodeMarks], snapshot: Snapshot, node_id: str) -> NodeMarks:
    """A drained node's marks: its termination mark, if the plan terminates it too, rides in the
    Terminate, written only when that goes ahead."""
    return replace(marks[node_id], termination_started=_observed(snapshot, node_id).termination_started)


def _observed(snapshot: Snapshot, node_id: str) -> NodeMarks:
    return next(n.marks for n in snapshot.nodes if n.id == node_id)


def labelled(parts: Machine, instance_labels: dict[str, str], node_labels: dict[str, str]) -> Machine:
    """A machine whose instance was launched with `instance_labels` and whose node has `node_labels`."""
    inst, node, worker = parts
    return replace(inst, labels=instance_labels), replace(node, labels=node_labels), worker


OWNED = {OWNERSHIP_LABEL: "c1", "instance-type": "m5.large"}  # the labels a launch gives an instance
LABELS_WHY = "labels its instance was launched with"


def retire(n: int, delay: str = "60s") -> RetireWorkers:
    """The expected retirement of machine `n`'s worker, planned on its host being idle."""
    return RetireWorkers((addr(n),), f"idle for at least drain_delay={delay}", (HostIdle(hostname(n)),))


def retire_holder(n: int, delay: str = "60s") -> RetireWorkers:
    """The expected retirement of machine `n`'s worker that holds results only: planned on its host
    running nothing (dask moves the results first)."""
    why = f"idle for at least drain_delay={delay}; its results move to a worker that stays"
    return RetireWorkers((addr(n),), why, (NoTasks(hostname(n)),))


def drain(n: int, reason: str, retired: bool = True) -> DrainNode:
    """The expected drain of node `n`: still idle and ours, and its worker really retired when the
    plan retires it first."""
    expect = (HostIdle(hostname(n)), NodeOurs(f"node-{n}"), *((Retired(hostname(n)),) if retired else ()))
    return DrainNode(f"node-{n}", hostname(n), reason, expect=expect)


def idle_and_ours(n: int) -> tuple[HostIdle, NodeOurs]:
    return HostIdle(hostname(n)), NodeOurs(f"node-{n}")


def removal(n: int, reason: str) -> RemoveNode:
    """The expected removal of node `n`: its host idle, the node still down and ours."""
    return RemoveNode(
        f"node-{n}",
        hostname(n),
        reason,
        (HostIdle(hostname(n)), NodeDown(f"node-{n}"), NodeOurs(f"node-{n}")),
    )


def cordon(n: int, reason: str) -> Cordon:
    """The expected cordon of machine `n`: nothing waits on its worker and its node is still ours."""
    return Cordon(
        f"node-{n}", hostname(n), (addr(n),), reason, (NothingWaits(hostname(n)), NodeOurs(f"node-{n}"))
    )


@dataclass(frozen=True)
class Case:
    name: str
    snapshot: Snapshot
    expected: Plan
    policy: Policy = field(default_factory=make_policy)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expected", _resolved(self.expected, self.snapshot))


def busy_large(n: int, **kw: object) -> tuple[object, ...]:
    """An m5.large machine whose worker runs two 1-cpu tasks: full, nothing queued."""
    return machine(n, processing=make_tasks(2, f"run{n}-"), **kw)  # type: ignore[arg-type]


def timed_queue(ends_in: float, expected: float | None = 100.0) -> list[Task]:
    """An m5.large worker's processing: two 1-cpu tasks running (with dask's duration estimate
    `expected`, ending in `ends_in` seconds by it) and one waiting behind them."""
    started = NOW + ends_in - (expected if expected is not None else 100.0)
    run = [replace(make_task(f"run{i}"), executing=True, started=started, expected=expected) for i in (0, 1)]
    return [*run, replace(make_task("wait"), expected=expected)]


SCALE_UP = [
    Case("nothing observed, nothing to do", make_snapshot(), Plan()),
    Case(
        "a burst is packed onto the cheapest type that fits",
        make_snapshot(unrunnable=make_tasks(3)),
        Plan((launch("m5.large", 2, 3),), pending=3, placed=(("new", 3),)),
    ),
    Case(
        "a worker's processing tasks beyond its resources are the estimated queue",
        assemble(machine(1, processing=make_tasks(4, "p"))),
        Plan((launch("m5.large", 1, 2),), pending=2, placed=(("new", 2),)),
    ),
    Case(
        "a queued task its busy worker will start within the tolerated wait buys nothing",
        # dask's estimate: 100 s; the running tasks end in 30 s, the tolerated wait is 120 s
        assemble(machine(1, processing=timed_queue(ends_in=30))),
        Plan(pending=1, placed=(("own-worker", 1),)),
    ),
    Case(
        "a queued task its busy worker starts only after the tolerated wait still buys a machine",
        assemble(machine(1, processing=timed_queue(ends_in=300, expected=400))),
        Plan((launch("m5.large", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "without dask's duration estimate a queued task buys a machine",
        assemble(machine(1, processing=timed_queue(ends_in=30, expected=None))),
        Plan((launch("m5.large", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "tolerated_wait 0 buys a machine for every queued task",
        assemble(machine(1, processing=timed_queue(ends_in=30))),
        Plan((launch("m5.large", 1, 1),), pending=1, placed=(("new", 1),)),
        make_policy(tolerated_wait=0.0),
    ),
    Case(
        "a task starting soon on its worker still takes free room on another active worker",
        # dask moves it there (it has an estimate), so that worker must not be drained meanwhile
        assemble(
            machine(1, processing=timed_queue(ends_in=30)),
            machine(2, "m5.xlarge", processing=make_tasks(1, "p")),
        ),
        Plan(pending=1, placed=(("active", 1),)),
    ),
    Case(
        "a task starting soon on its worker may take room on a cordoned worker, which is uncordoned",
        # the cordoned machine is up and paid for; letting it empty while a queue grows costs more
        assemble(
            machine(1, processing=timed_queue(ends_in=30)),
            machine(
                2,
                "m5.xlarge",
                processing=[replace(make_task("c0"), executing=True)],  # 3 of its 4 cpus free
                marks=NodeMarks(ready=True, cordoned_since=NOW - 30),
                retiring=True,
            ),
        ),
        Plan(
            (Uncordon("node-2", hostname(2), (addr(2),), "1 pending task(s) fit on this cordoned worker"),),
            pending=1,
            placed=(("cordoned", 1),),
        ),
    ),
    Case(
        "a task starting soon on its worker activates no drained node",
        assemble(
            machine(1, processing=timed_queue(ends_in=30)),
            machine(2, worker=False, availability=Availability.DRAIN, marks=DRAINED),
        ),
        Plan(pending=1, placed=(("own-worker", 1),)),
    ),
    Case(
        "a queued task is never placed back onto its own worker",
        # 4 cpus: the 3-cpu task runs, the 2-cpu one waits; the 1 cpu left cannot take it.
        assemble(machine(1, "m5.xlarge", processing=[make_task("big", 3), make_task("q", 2)])),
        Plan((launch("m5.large", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "free capacity of active workers is used first",
        assemble(machine(1, "m5.xlarge", processing=make_tasks(1, "p")), unrunnable=make_tasks(2)),
        Plan(pending=2, placed=(("active", 2),)),
    ),
    Case(
        "a drained node that receives tasks is activated instead of launching",
        assemble(
            machine(1, worker=False, availability=Availability.DRAIN, marks=DRAINED),
            unrunnable=make_tasks(3),
        ),
        Plan(
            (
                mark(1, "reactivated for pending work", drained_since=None),
                ActivateNode("node-1", hostname(1), "2 pending task(s) fit on this drained node"),
                launch("m5.large", 1, 1),
            ),
            pending=3,
            placed=(("drained", 2), ("new", 1)),
        ),
    ),
    Case(
        "a reserve node is activated too, after the drained ones",
        assemble(
            machine(1, worker=False, availability=Availability.DRAIN, marks=DRAINED),
            machine(2, worker=False, availability=Availability.DRAIN, marks=DRAINED, age=10),
            unrunnable=make_tasks(3),
        ),
        Plan(
            (
                mark(1, "reactivated for pending work", drained_since=None),
                mark(2, "reactivated for pending work", drained_since=None),
                ActivateNode("node-1", hostname(1), "2 pending task(s) fit on this drained node"),
                ActivateNode("node-2", hostname(2), "1 pending task(s) fit on this drained node"),
            ),
            pending=3,
            placed=(("drained", 2), ("reserve", 1)),
        ),
        make_policy(types=[TypePolicy("m5.large", reserve=1)]),
    ),
    Case(
        "a joining node's capacity counts before anything new",
        assemble(machine(1, worker=False, marks=NodeMarks(), age=30), unrunnable=make_tasks(1)),
        Plan(pending=1, placed=(("joining", 1),)),
    ),
    Case(
        "an in-flight instance's capacity counts, so one task never causes two launches",
        make_snapshot(instances=[make_instance(1, age=5)], unrunnable=make_tasks(3)),
        Plan((launch("m5.large", 1, 1),), pending=3, placed=(("launched", 2), ("new", 1))),
    ),
    Case(
        "the type's overhead is taken from its capacity before fitting",
        make_snapshot(unrunnable=[make_task("t", cpus=2)]),
        Plan((launch("m5.xlarge", 1, 1),), pending=1, placed=(("new", 1),)),
        make_policy(types=[TypePolicy("m5.large", overhead=Resources(0.25, GIB)), TypePolicy("m5.xlarge")]),
    ),
    Case(
        "a type without a known price sorts after priced ones",
        make_snapshot(
            unrunnable=make_tasks(1),
            types=[make_instance_type("m5.large", price=None), *CATALOGUE[1:]],
        ),
        Plan((launch("m5.xlarge", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "the policy's price overrides the catalogue's",
        make_snapshot(unrunnable=make_tasks(1)),
        Plan((launch("m5.xlarge", 1, 1),), pending=1, placed=(("new", 1),)),
        make_policy(types=[TypePolicy("m5.large", price_per_hour=1.0), TypePolicy("m5.xlarge")]),
    ),
    Case(
        "on equal prices the smaller type wins",
        make_snapshot(
            unrunnable=make_tasks(1),
            types=[make_instance_type("big", 8, 32, price=0.1), make_instance_type("small", 2, 8, price=0.1)],
        ),
        Plan((launch("small", 1, 1),), pending=1, placed=(("new", 1),)),
        make_policy(types=["big", "small"]),
    ),
    Case(
        "a pinned task gets its type",
        make_snapshot(unrunnable=[make_task("p", pinned="c5.2xlarge")]),
        Plan((launch("c5.2xlarge", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "a type EC2 refused recently is skipped for the next best",
        make_snapshot(unrunnable=make_tasks(1), unavailable=[Unavailable("m5.large", NOW + 30)]),
        Plan((launch("m5.xlarge", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "a refusal that expired no longer counts",
        make_snapshot(unrunnable=make_tasks(1), unavailable=[Unavailable("m5.large", NOW)]),
        Plan((launch("m5.large", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "small tasks fill the room left in a bigger new instance",
        make_snapshot(unrunnable=[make_task("big", 3), *make_tasks(3)]),
        Plan((launch("m5.xlarge", 1, 2), launch("m5.large", 1, 2)), pending=4, placed=(("new", 4),)),
    ),
    Case(
        "launches stop at max_instances (live plus in-flight)",
        assemble(busy_large(1), unrunnable=make_tasks(5, cpus=2)),  # type: ignore[arg-type]
        Plan((launch("m5.large", 2, 2),), pending=5, placed=(("new", 2),)),
        make_policy(max_instances=3),
    ),
    Case(
        "launches stop at max_launch_per_tick",
        make_snapshot(unrunnable=make_tasks(5, cpus=2)),
        Plan((launch("m5.large", 3, 3),), pending=5, placed=(("new", 3),)),
        make_policy(max_launch_per_tick=3),
    ),
    Case(
        "min_instances are kept with the cheapest type",
        make_snapshot(),
        Plan((Launch("m5.large", 2, "2 to keep min_instances=2"),)),
        make_policy(min_instances=2),
    ),
    Case(
        "tasks no allowed type can run are unplaceable and do not block the others",
        make_snapshot(
            unrunnable=[
                make_task("huge", cpus=64),
                make_task("pinned-away", pinned="x1.32xlarge"),
                make_task("pinned-small", cpus=3, pinned="m5.large"),
                make_task("ok"),
            ]
        ),
        Plan(
            (launch("m5.large", 1, 1),),
            unplaceable=(
                Unplaceable(
                    "huge",
                    "needs cpus=64 ram=1GiB, more than any allowed instance type offers after its overhead",
                ),
                Unplaceable("pinned-away", "pinned to x1.32xlarge, which is not an allowed instance type"),
                Unplaceable(
                    "pinned-small", "needs cpus=3 ram=1GiB, more than m5.large offers after its overhead"
                ),
            ),
            pending=4,
            placed=(("new", 1),),
        ),
    ),
]

EMPTY_LONG = NodeMarks(ready=True, empty_since=NOW - 100)
SCALE_DOWN = [
    Case(
        "a node whose worker becomes idle is marked empty",
        assemble(machine(1)),
        Plan((mark(1, "worker idle", empty_since=NOW),)),
    ),
    Case(
        "an idle node not yet empty for drain_delay is left alone",
        assemble(machine(1, marks=NodeMarks(ready=True, empty_since=NOW - 30))),
        Plan(),
    ),
    Case(
        "an idle worker empty for drain_delay is retired and its node drained",
        assemble(machine(1, marks=EMPTY_LONG)),
        Plan(
            (
                mark(1, "drained", empty_since=None, drained_since=NOW),
                retire(1),
                drain(1, "empty for 100s (drain_delay 60s)"),
            )
        ),
    ),
    Case(
        "a node whose worker is gone is drained after drain_delay",
        assemble(machine(1, worker=False, marks=EMPTY_LONG)),
        Plan(
            (
                mark(1, "drained", empty_since=None, drained_since=NOW),
                drain(1, "empty for 100s (drain_delay 60s)", retired=False),
            )
        ),
    ),
    Case(
        "a worker that runs nothing but holds a client's results is marked empty",
        assemble(machine(1, unique=True), busy_large(2)),  # type: ignore[arg-type]
        Plan((mark(1, "worker holds results only", empty_since=NOW),)),
    ),
    Case(
        "a worker holding results only, empty for drain_delay, is retired (its results move to a worker "
        "that stays) and its node drained once it really left",
        assemble(machine(1, unique=True, marks=EMPTY_LONG), busy_large(2)),  # type: ignore[arg-type]
        Plan(
            (
                mark(1, "drained", empty_since=None, drained_since=NOW),
                retire_holder(1),
                drain(1, "empty for 100s (drain_delay 60s)"),
            )
        ),
    ),
    Case(
        "the only worker holding results is kept: no other worker could receive them",
        assemble(machine(1, unique=True, marks=NodeMarks(ready=True, empty_since=NOW - 1000))),
        Plan(),
    ),
    Case(
        "of idle workers holding results with no other worker left, all but one (the last by key) go",
        assemble(machine(1, unique=True, marks=EMPTY_LONG), machine(2, unique=True, marks=EMPTY_LONG)),
        Plan(
            (
                mark(1, "drained", empty_since=None, drained_since=NOW),
                retire_holder(1),
                drain(1, "empty for 100s (drain_delay 60s)"),
            )
        ),
    ),
    Case(
        "an idle worker without results goes, the one holding results stays to receive nothing more",
        assemble(machine(1, marks=EMPTY_LONG), machine(2, unique=True, marks=EMPTY_LONG)),
        Plan(
            (
                mark(1, "drained", empty_since=None, drained_since=NOW),
                retire(1),
                drain(1, "empty for 100s (drain_delay 60s)"),
            )
        ),
    ),
    Case(
        "a cordoned worker holding results stays when no uncordoned worker would be left to take them",
        assemble(
            machine(1, unique=True, retiring=True, marks=replace(EMPTY_LONG, cordoned_since=NOW - 200)),
            machine(2, marks=EMPTY_LONG),
        ),
        Plan(
            (
                mark(2, "drained", empty_since=None, drained_since=NOW),
                retire(2),
                drain(2, "empty for 100s (drain_delay 60s)"),
            )
        ),
    ),
    Case(
        "pending work blocks scale-down",
        assemble(machine(1, marks=EMPTY_LONG), unrunnable=[make_task("p", pinned="c5.2xlarge")]),
        Plan((launch("c5.2xlarge", 1, 1),), pending=1, placed=(("new", 1),)),
    ),
    Case(
        "unplaceable work does not block scale-down",
        assemble(machine(1, marks=EMPTY_LONG), unrunnable=[make_task("huge", cpus=99)]),
        Plan(
            (
                mark(1, "drained", empty_since=None, drained_since=NOW),
                retire(1),
                drain(1, "empty for 100s (drain_delay 60s)"),
            ),
            unplaceable=(
                Unplaceable(
                    "huge",
                    "needs cpus=99 ram=1GiB, more than any allowed instance type offers after its overhead",
                ),
            ),
            pending=1,
        ),
    ),
    Case(
        "drained nodes beyond the reserve are terminated after termination_delay; the newest is kept",
        assemble(
            machine(
                1,
                worker=False,
                availability=Availability.DRAIN,
                marks=NodeMarks(True, drained_since=NOW - 200),
            ),
            machine(
                2,
                worker=False,
                availability=Availability.DRAIN,
                age=500,
                marks=NodeMarks(True, None, NOW - 200),
            ),
        ),
        Plan(
            (
                mark(1, "terminating", termination_started=NOW),
                Terminate(
                    ("i-0001",),
                    "drained for at least termination_delay=120s, beyond the reserve",
                    ("node-1",),
                    idle_and_ours(1),
                ),
            )
        ),
        make_policy(types=[TypePolicy("m5.large", reserve=1)]),
    ),
    Case(
        "a joined node gets the labels its instance was launched with; labels it already has are not rewritten",
        assemble(
            labelled(
                machine(1, marks=NodeMarks(True, empty_since=NOW - 5)),
                {"instance-type": "m5.large", "zone": "a"},
                {"zone": "a"},
            ),
            labelled(
                machine(2, marks=NodeMarks(True, empty_since=NOW - 5)),
                {"instance-type": "m5.large"},
                {"instance-type": "m5.large"},
            ),
        ),
        Plan((NodeUpdate("node-1", LABELS_WHY, labels=(("instance-type", "m5.large"),)),)),
        make_policy(consolidate_below=0.0),  # two idle workers: consolidation is another case's subject
    ),
    Case(
        "tasks the scheduler holds in its own queue (every worker saturated) are pending work too",
        assemble(busy_large(1), queued=make_tasks(4, "root-")),
        Plan(
            (launch("m5.large", 2, 4),),
            pending=4,
            placed=(("new", 4),),
        ),
    ),
    Case(
        "an empty reserve is filled when nothing is pending: the machine joins, idles and is drained into it",
        make_snapshot(),
        Plan((Launch("m5.large", 1, "1 to fill the reserve of 1 warm m5.large"),)),
        make_policy(types=[TypePolicy("m5.large", reserve=1)]),
    ),
    Case(
        "an idle active machine of the type already counts as the reserve's spare: nothing launched",
        assemble(machine(1, marks=NodeMarks(True, empty_since=NOW - 5))),
        Plan(),
        make_policy(types=[TypePolicy("m5.large", reserve=1)]),
    ),
    Case(
        "a drained node not yet drained for termination_delay is kept",
        assemble(
            machine(1, worker=False, availability=Availability.DRAIN, marks=NodeMarks(True, None, NOW - 60))
        ),
        Plan(),
    ),
    Case(
        "a node seen drained without a mark gets one",
        assemble(machine(1, worker=False, availability=Availability.DRAIN)),
        Plan((mark(1, "seen drained", drained_since=NOW),)),
    ),
    Case(
        "an idle node that receives pending work is not drained, even when other work cannot be served",
        # max_instances reached: the 8-cpu task gets nothing, so scale-down runs; the 1-cpu task is placed
        assemble(machine(1, marks=EMPTY_LONG), unrunnable=[make_task("big", 8), make_task("small")]),
        Plan((mark(1, "has work again", empty_since=None),), pending=2, placed=(("active", 1),)),
        make_policy(max_instances=1),
    ),
    Case(
        "a drained node that receives pending work is activated, not terminated, even at max_instances",
        assemble(
            machine(1, worker=False, availability=Availability.DRAIN, marks=NodeMarks(True, None, NOW - 200)),
            unrunnable=[make_task("big", 8), make_task("small")],
        ),
        Plan(
            (
                mark(1, "reactivated for pending work", drained_since=None),
                ActivateNode("node-1", hostname(1), "1 pending task(s) fit on this drained node"),
            ),
            pending=2,
            placed=(("drained", 1),),
        ),
        make_policy(max_instances=1),
    ),
    Case(
        "a drained node whose worker holds unique results is never terminated",
        assemble(
            machine(1, availability=Availability.DRAIN, unique=True, marks=NodeMarks(True, None, NOW - 200))
        ),
        Plan(),
    ),
    Case(
        "scale-down never goes below min_instances",
        assemble(
            machine(1, worker=False, availability=Availability.DRAIN, marks=NodeMarks(True, None, NOW - 999))
        ),
        Plan(),
        make_policy(min_instances=1),
    ),
]

REPAIR = [
    Case(
        "a broken instance is terminated even while work is pending",
        make_snapshot(instances=[make_instance(1, age=700)], unrunnable=make_tasks(1)),
        Plan(
            (
                Terminate(
                    ("i-0001",),
                    "broken: not up with a worker within 600s of launch",
                    expect=(NoWorker(hostname(1)), NotJoined(hostname(1))),
                ),
                launch("m5.large", 1, 1),
            ),
            pending=1,
            placed=(("new", 1),),
        ),
    ),
    Case(
        "a node that joined but never got a worker within max_start_time is broken",
        assemble(machine(1, worker=False, marks=NodeMarks(), age=700)),
        Plan(
            (
                mark(1, "terminating", termination_started=NOW),
                Terminate(
                    ("i-0001",),
                    "broken: not up with a worker within 600s of launch",
                    ("node-1",),
                    (NoWorker(hostname(1)), NodeOurs("node-1")),
                ),
            )
        ),
    ),
    Case(
        "a joined node is marked ready when first seen with its worker",
        assemble(machine(1, marks=NodeMarks())),
        Plan((mark(1, "joined with a connected worker; worker idle", ready=True, empty_since=NOW),)),
    ),
    Case(
        "a node that goes down is marked",
        assemble(busy_large(1, status=NodeStatus.DOWN)),  # type: ignore[arg-type]
        Plan((mark(1, "node is down", down_since=NOW),)),
    ),
    Case(
        "a node that comes back has its down mark cleared",
        assemble(busy_large(1, marks=NodeMarks(True, down_since=NOW - 50))),  # type: ignore[arg-type]
        Plan((mark(1, "node is ready again", down_since=None),)),
    ),
    Case(
        "a node down past node_down_timeout is removed with its instance: one Terminate, still down",
        assemble(
            machine(1, worker=False, status=NodeStatus.DOWN, marks=NodeMarks(True, down_since=NOW - 400))
        ),
        Plan(
            (
                Terminate(
                    ("i-0001",),
                    "node down for 400s (node_down_timeout 300s)",
                    ("node-1",),
                    (HostIdle(hostname(1)), NodeDown("node-1"), NodeOurs("node-1")),
                ),
            )
        ),
    ),
    Case(
        "a node of ours whose instance is gone is removed",
        make_snapshot(nodes=[make_node(1, status=NodeStatus.DOWN, labels={"instance-type": "m5.large"})]),
        Plan((removal(1, "its instance is gone"),)),
    ),
    Case(
        "unowned and manager nodes are never touched",
        assemble(
            (None, make_node(1, status=NodeStatus.DOWN, marks=NodeMarks(), ours=False), None),
            (None, make_node(2, manager=True, marks=NodeMarks()), machine(2)[2]),
            machine(3, manager=True, marks=EMPTY_LONG),
        ),
        Plan(),
    ),
    Case(
        "a termination that did not take is asked again, on a first termination's checks: no worker "
        "connected since, its node still ours",
        assemble(machine(1, worker=False, marks=NodeMarks(True, termination_started=NOW - 200))),
        Plan(
            (
                Terminate(
                    ("i-0001",),
                    "termination requested earlier did not take; asking again",
                    ("node-1",),
                    (NoWorker(hostname(1)), NodeOurs("node-1")),
                ),
            )
        ),
    ),
    Case(
        "a drained machine whose termination did not take, its worker still connected and idle, is asked "
        "again with its host idle",
        assemble(
            machine(
                1,
                availability=Availability.DRAIN,
                marks=NodeMarks(True, drained_since=NOW - 400, termination_started=NOW - 200),
            )
        ),
        Plan(
            (
                Terminate(
                    ("i-0001",),
                    "termination requested earlier did not take; asking again",
                    ("node-1",),
                    idle_and_ours(1),
                ),
            )
        ),
    ),
    Case(
        "a terminating mark on a node that serves work (ready, active, its worker connected) is stale: "
        "cleared, never asked again (a skipped or cut-short termination left it)",
        assemble(machine(1, marks=NodeMarks(True, termination_started=NOW - 200))),
        Plan(
            (
                mark(
                    1,
                    "marked terminating, but it serves work: no termination went out; mark cleared",
                    termination_started=None,
                ),
            )
        ),
    ),
    Case(
        "broken machines are terminated one per action, each with what it was planned on",
        make_snapshot(instances=[make_instance(1, age=700), make_instance(2, age=700)]),
        Plan(
            tuple(
                Terminate(
                    (f"i-000{n}",),
                    "broken: not up with a worker within 600s of launch",
                    expect=(NoWorker(hostname(n)), NotJoined(hostname(n))),
                )
                for n in (1, 2)
            )
        ),
    ),
    Case(
        "a down node matching no instance with only the instance-type label is not ours: never touched",
        make_snapshot(
            nodes=[make_node(1, status=NodeStatus.DOWN, labels={"instance-type": "m5.large"}, ours=False)]
        ),
        Plan(),
    ),
    Case(
        "a joined node of an owned instance that lacks the ownership label gets it from its instance",
        assemble(
            unlabelled(
                labelled(busy_large(1), OWNED, {"instance-type": "m5.large"})  # type: ignore[arg-type]
            )
        ),
        Plan((NodeUpdate("node-1", LABELS_WHY, labels=((OWNERSHIP_LABEL, "c1"),)),)),
    ),
    Case(
        "the node of an instance being terminated is recognised by hostname: labelled ours and removed once down",
        # it joined after the termination was asked, so it was never labelled nor removed with it
        assemble(
            (
                replace(make_instance(1, state=InstanceState.SHUTTING_DOWN), labels=OWNED),
                make_node(1, status=NodeStatus.DOWN, marks=NodeMarks(), labels={}, ours=False),
                None,
            )
        ),
        Plan(
            (
                NodeUpdate("node-1", LABELS_WHY, labels=tuple(sorted(OWNED.items()))),
                removal(1, "its instance is shutting-down"),
            )
        ),
    ),
    Case(
        "the node of an instance being terminated is left while it is still ready (the machine shuts down)",
        assemble(
            (
                replace(make_instance(1, state=InstanceState.SHUTTING_DOWN), labels=OWNED),
                make_node(1, marks=NodeMarks(), labels=OWNED),
                None,
            )
        ),
        Plan(),
    ),
    Case(
        "a node of ours whose instance is gone is kept while it is ready",
        make_snapshot(nodes=[make_node(1)]),
        Plan(),
    ),
    Case(
        "a node of ours whose instance is gone is kept while a worker on it has work",
        make_snapshot(
            nodes=[make_node(1, status=NodeStatus.DOWN)], workers=[make_worker(1, processing=make_tasks(1))]
        ),
        Plan(),
    ),
    Case(
        "a node down for less than node_down_timeout is kept",
        assemble(
            machine(1, worker=False, status=NodeStatus.DOWN, marks=NodeMarks(True, down_since=NOW - 100))
        ),
        Plan(),
    ),
    Case(
        "a node down past node_down_timeout whose worker still has work is kept",
        assemble(busy_large(1, status=NodeStatus.DOWN, marks=NodeMarks(True, down_since=NOW - 400))),  # type: ignore[arg-type]
        Plan(),
    ),
    Case(
        "the down node of an instance being terminated is kept while a worker on it has work",
        assemble(
            (
                make_instance(1, state=InstanceState.SHUTTING_DOWN),
                make_node(1, status=NodeStatus.DOWN),
                make_worker(1, unique=True),
            )
        ),
        Plan(),
    ),
    Case(
        "a termination that did not take is not asked again while its worker has work",
        assemble(busy_large(1, marks=NodeMarks(True, termination_started=NOW - 200))),  # type: ignore[arg-type]
        Plan(),
    ),
    Case(
        "a broken (stopped) machine whose worker still has work is not terminated",
        assemble(
            (
                make_instance(1, state=InstanceState.STOPPED),
                *busy_large(1)[1:],  # type: ignore[misc]
            )
        ),
        Plan(),
    ),
    Case(
        "an instance already shutting down is left to EC2",
        make_snapshot(instances=[make_instance(1, state=InstanceState.SHUTTING_DOWN)]),
        Plan(),
    ),
]


def running(n: int, prefix: str, **shape: float | str | None) -> tuple[Task, ...]:
    """`n` tasks the worker reports as executing."""
    return tuple(replace(t, executing=True) for t in make_tasks(n, prefix, **shape))


def ending(n: int, prefix: str, in_s: float = 30.0, **shape: float | str | None) -> tuple[Task, ...]:
    """`n` executing tasks that dask's estimates say end in `in_s` seconds."""
    return tuple(replace(t, started=NOW + in_s - 60.0, expected=60.0) for t in running(n, prefix, **shape))


def xlarge(n: int, tasks: tuple[Task, ...], **kw: object) -> Machine:
    return machine(n, "m5.xlarge", processing=tasks, **kw)  # type: ignore[arg-type]


def with_foo(parts: Machine) -> Machine:
    """A machine whose worker also offers one `foo` (a dask resource) and runs a 1-cpu task that needs it."""
    inst, node, worker = parts
    assert worker is not None
    task = replace(make_task("foo-task", foo=1), executing=True)
    res = replace(worker.resources, generic=(("foo", 1.0),))
    return inst, node, replace(worker, resources=res, processing=(task,))


CORDONED = NodeMarks(ready=True, cordoned_since=NOW - 30)
USES_25 = "uses 25% of its machine; the rest of its type has room for its tasks"
SURGE_ABOVE_2 = make_policy(types=(TypePolicy("m5.large", surge_above=2), "m5.xlarge", "c5.2xlarge"))
GPU_IDLE = "runs no GPU task on its g4dn.xlarge (75% used); cheaper machines have room for its tasks"

CONSOLIDATE = [
    Case(
        "dask spread one task onto each of two machines: the first, least used, is cordoned to empty",
        assemble(xlarge(1, running(1, "a")), xlarge(2, running(2, "b"))),
        Plan((cordon(1, USES_25),)),
    ),
    Case(
        "a worker with a task waiting on it is never cordoned: the task would never start",
        assemble(xlarge(1, (*running(1, "a"), *make_tasks(1, "w"))), xlarge(2, running(1, "b"))),
        Plan((cordon(2, USES_25),)),
    ),
    Case(
        "the last uncordoned worker of a type stays, and a busy one above the threshold is kept",
        assemble(xlarge(1, running(1, "a")), xlarge(2, running(3, "b")), xlarge(3, running(1, "c"))),
        Plan((cordon(1, USES_25),)),
    ),
    Case(
        "no cordon when the next task would fit only on room summed over several workers (the flap)",
        # four workers have 1 cpu free each: 4 cpus in all, but the next 2-cpu task fits on none of them,
        # so dask would queue it and the cordon would be undone a tick later
        assemble(
            xlarge(1, running(2, "a")),
            *(xlarge(n, (*running(1, f"b{n}-", cpus=2), *running(1, f"c{n}-"))) for n in (2, 3, 4, 5)),
        ),
        Plan(),
    ),
    Case(
        "a worker is cordoned when each of its tasks and the next one fit on one other worker each",
        assemble(xlarge(1, running(2, "a")), *(xlarge(n, running(3, f"b{n}-")) for n in (2, 3, 4))),
        Plan((cordon(1, "uses 50% of its machine; the rest of its type has room for its tasks"),)),
    ),
    Case(
        "no cordon when the other workers of the type have no room for its tasks",
        assemble(xlarge(1, running(1, "a", ram_gib=8)), xlarge(2, running(1, "b", cpus=1, ram_gib=12))),
        Plan(),
    ),
    Case(
        "consolidate_below 0 turns consolidation off",
        assemble(xlarge(1, running(1, "a")), xlarge(2, running(1, "b"))),
        Plan(),
        make_policy(consolidate_below=0.0),
    ),
    Case(
        "nothing is cordoned while work is pending",
        assemble(
            xlarge(1, running(1, "a")), xlarge(2, running(1, "b")), unrunnable=make_tasks(1, "u", cpus=8)
        ),
        Plan(
            (launch("c5.2xlarge", 1, 1),),
            pending=1,
            placed=(("new", 1),),
        ),
    ),
    Case(
        "pending work that fits a cordoned worker takes it back before drained nodes or new machines",
        assemble(
            xlarge(1, running(3, "a"), retiring=True, marks=CORDONED),
            machine(2, "m5.xlarge", worker=False, availability=Availability.DRAIN, marks=DRAINED),
            unrunnable=make_tasks(1, "u"),
        ),
        Plan(
            (Uncordon("node-1", hostname(1), (addr(1),), "1 pending task(s) fit on this cordoned worker"),),
            pending=1,
            placed=(("cordoned", 1),),
        ),
    ),
    Case(
        "a cordoned worker with a task waiting on it is uncordoned, or the task would never start",
        assemble(
            xlarge(1, (*running(1, "a"), *make_tasks(1, "w", cpus=4)), retiring=True, marks=CORDONED),
            xlarge(2, ()),
        ),
        Plan(
            (Uncordon("node-1", hostname(1), (addr(1),), "1 task(s) wait on this cordoned worker"),),
            pending=1,
            placed=(("active", 1),),
        ),
    ),
    Case(
        "a worker using more than consolidate_below is never cordoned",
        assemble(xlarge(1, running(1, "a")), xlarge(2, running(1, "b"))),
        Plan(),
        make_policy(consolidate_below=0.2),
    ),
    Case(
        "the least used worker is not cordoned while a task waits on it, even with room elsewhere",
        assemble(
            xlarge(1, (*running(1, "a"), make_task("w", cpus=0.5))),
            *(xlarge(n, running(3, f"b{n}-")) for n in (2, 3, 4)),
        ),
        Plan(),
    ),
    Case(
        "nothing is cordoned while work is pending that cannot get capacity (max_instances reached)",
        assemble(xlarge(1, running(1, "a")), xlarge(2, running(1, "b")), unrunnable=[make_task("u", cpus=8)]),
        Plan(pending=1),
        make_policy(max_instances=2),
    ),
    Case(
        "nothing is cordoned while the plan uncordons a worker a task waits on: one change at a time",
        assemble(
            xlarge(1, (*running(1, "a"), make_task("w")), retiring=True, marks=CORDONED),
            xlarge(2, running(1, "b")),
            xlarge(3, running(1, "c")),
        ),
        Plan((Uncordon("node-1", hostname(1), (addr(1),), "1 task(s) wait on this cordoned worker"),)),
    ),
    Case(
        "a worker whose task needs a resource no other worker has stays uncordoned; the other is cordoned",
        assemble(with_foo(xlarge(1, ())), xlarge(2, running(1, "b"))),
        Plan((cordon(2, USES_25),)),
    ),
    Case(
        "tasks counted on a worker for an earlier cordon go with it when it is considered in turn",
        # node-1's task is counted on node-2; node-2's own task and that one need both 1-cpu rooms left,
        # and then the next task would fit nowhere: only node-1 is cordoned
        assemble(
            xlarge(1, running(1, "a")),
            xlarge(2, running(1, "b")),
            xlarge(3, running(3, "c")),
            xlarge(4, running(3, "d")),
        ),
        Plan((cordon(1, USES_25),)),
    ),
    Case(
        "under load, with the pending work placed on one worker, an under-used other is cordoned",
        # node-1 runs 4 tasks with 2 more waiting: they go on node-2 (the fullest with room); node-3's
        # task and the next fit on node-4
        assemble(
            xlarge(1, (*running(4, "a"), *make_tasks(2, "w"))),
            *(xlarge(n, running(1, f"b{n}-")) for n in (2, 3, 4)),
        ),
        Plan((cordon(3, USES_25),), pending=2, placed=(("active", 2),)),
    ),
    Case(
        "under load, a cordoned worker that emptied is drained; an idle uncordoned one is left to take work",
        assemble(
            xlarge(1, (*running(4, "a"), *make_tasks(1, "w"))),
            xlarge(2, running(1, "b")),
            xlarge(3, (), retiring=True, marks=replace(CORDONED, empty_since=NOW - 61)),
            xlarge(4, (), marks=EMPTY_LONG),
        ),
        Plan(
            (
                mark(3, "drained", empty_since=None, drained_since=NOW, cordoned_since=None),
                retire(3),
                drain(3, "empty for 61s (drain_delay 60s)"),
            ),
            pending=1,
            placed=(("active", 1),),
        ),
    ),
    Case(
        "a GPU machine running only CPU tasks is cordoned when cheaper machines have room for them",
        assemble(
            machine(1, "g4dn.xlarge", processing=ending(3, "g")),
            machine(2, "c5.2xlarge", processing=running(6, "c2-")),
            machine(3, "c5.2xlarge", processing=running(6, "c3-")),
        ),
        Plan((cordon(1, GPU_IDLE),)),
    ),
    Case(
        "an expensive machine under the threshold is cordoned when cheaper machines have room for its tasks",
        assemble(
            machine(1, "c5.2xlarge", processing=ending(2, "c")),
            *(xlarge(n, running(3, f"b{n}-")) for n in (2, 3, 4)),
        ),
        Plan((cordon(1, "uses 25% of its c5.2xlarge; cheaper machines have room for its tasks"),)),
    ),
    Case(
        "an expensive machine whose tasks dask expects to run past the tolerated wait is not cordoned for "
        "cheaper ones (its room would be lost while they run on)",
        assemble(
            machine(1, "c5.2xlarge", processing=ending(2, "c", in_s=600.0)),
            *(xlarge(n, running(3, f"b{n}-")) for n in (2, 3, 4)),
        ),
        Plan(),
    ),
    Case(
        "a machine whose task is pinned to its type is not cordoned for cheaper ones",
        assemble(
            machine(1, "c5.2xlarge", processing=ending(2, "c", pinned="c5.2xlarge")),
            *(xlarge(n, running(3, f"b{n}-")) for n in (2, 3, 4)),
        ),
        Plan(),
    ),
    Case(
        "of two light machines of different types, the dearer is cordoned, never the cheaper onto it",
        assemble(xlarge(1, running(1, "a")), machine(2, "c5.2xlarge", processing=ending(1, "c"))),
        Plan((cordon(2, "uses 12% of its c5.2xlarge; cheaper machines have room for its tasks"),)),
    ),
    Case(
        "a type with a queue threshold launches nothing while at most that many tasks wait on its workers",
        assemble(machine(1, processing=(*running(2, "a"), *make_tasks(2, "w")))),
        Plan(pending=2, placed=(("below-surge", 2),)),
        SURGE_ABOVE_2,
    ),
    Case(
        "a type with a queue threshold launches once more tasks than that wait",
        assemble(machine(1, processing=(*running(2, "a"), *make_tasks(3, "w")))),
        Plan((launch("m5.large", 2, 3),), pending=3, placed=(("new", 3),)),
        SURGE_ABOVE_2,
    ),
    Case(
        "a queue longer than the threshold is not held back when the maximum caps the launch below it",
        # one new m5.large may be launched (max 2): it takes 2 of the 5 waiting tasks, 3 find no room
        assemble(machine(1, processing=(*running(2, "a"), *make_tasks(5, "w")))),
        Plan((launch("m5.large", 1, 2),), pending=5, placed=(("new", 2),)),
        replace(SURGE_ABOVE_2, max_instances=2),
    ),
    Case(
        "a queue threshold does not hold back the first machine of its type (none is up to run the tasks)",
        assemble(unrunnable=make_tasks(2, "u")),
        Plan((launch("m5.large", 1, 2),), pending=2, placed=(("new", 2),)),
        SURGE_ABOVE_2,
    ),
    Case(
        "a cordon mark whose worker takes tasks again (restarted) is cleared",
        assemble(xlarge(1, running(1, "a"), marks=CORDONED)),
        Plan((mark(1, "worker takes tasks again", cordoned_since=None),)),
    ),
    Case(
        "a worker left retiring by a retirement cut short (no cordon mark) is set running again",
        # act awaits every retirement it starts: one still retiring at the next plan was cut short (dask
        # may still be retiring it: harmless, see keep_cordons) or restored closing_gracefully by dask
        # after an uncordon, and then nothing else makes it leave the bucket (the live burst500: 23 of
        # 40 stayed)
        assemble(xlarge(1, (), retiring=True), xlarge(2, running(1, "b"))),
        Plan((Uncordon("node-1", hostname(1), (addr(1),), STRAY_RETIREMENT),)),
    ),
    Case(
        "a busy worker left retiring is set running again too (it finishes its tasks either way)",
        assemble(xlarge(1, running(1, "a"), retiring=True), xlarge(2, running(1, "b"))),
        Plan((Uncordon("node-1", hostname(1), (addr(1),), STRAY_RETIREMENT),)),
    ),
    Case(
        "a cordoned worker that emptied is retired and drained after drain_delay like any other",
        assemble(
            xlarge(1, (), retiring=True, marks=replace(CORDONED, empty_since=NOW - 61)),
            xlarge(2, running(1, "b")),
        ),
        Plan(
            (
                mark(1, "drained", empty_since=None, drained_since=NOW, cordoned_since=None),
                retire(1),
                drain(1, "empty for 61s (drain_delay 60s)"),
            )
        ),
    ),
]


def test_a_cordoned_worker_is_active_a_retiring_one_without_the_mark_is_retiring() -> None:
    snapshot = assemble(xlarge(1, (), retiring=True, marks=CORDONED), xlarge(2, (), retiring=True))
    cluster = classify(snapshot, make_policy())
    assert [m.key for m in cluster.active] == ["i-0001"] and cluster.active[0].cordoned
    assert [m.key for m in cluster.retiring] == ["i-0002"] and not cluster.retiring[0].cordoned


@pytest.mark.parametrize("case", SCALE_UP + SCALE_DOWN + REPAIR + CONSOLIDATE, ids=lambda c: c.name)
def test_rule(case: Case) -> None:
    assert plan(case.snapshot, case.policy) == case.expected


@pytest.mark.parametrize("case", SCALE_UP + SCALE_DOWN + REPAIR + CONSOLIDATE, ids=lambda c: c.name)
def test_rule_transitions_are_in_the_table(case: Case) -> None:
    result = plan(case.snapshot, case.policy)
    before = classify(case.snapshot, case.policy).bucket_of()
    after = classify(apply(case.snapshot, result), case.policy).bucket_of()
    moves = {(before[k], after.get(k, Bucket.GONE)) for k in before}
    moves |= {(Bucket.NEW, after[k]) for k in after.keys() - before.keys()}
    assert all(allowed(a, b) for a, b in moves), moves
