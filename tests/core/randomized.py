"""Random snapshots for property tests (hypothesis strategies), and `apply()`: a tiny world that carries
out a plan's actions at once, to see which bucket every machine lands in next."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from hypothesis import strategies as st
from tests.builders import CATALOGUE, NOW, hostname, make_task

from swarm_autoscaler.core.actions import (
    ActivateNode,
    Cordon,
    DrainNode,
    Launch,
    NodeUpdate,
    Plan,
    RemoveNode,
    RetireWorkers,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.drift import SPEC_LABEL
from swarm_autoscaler.core.model import (
    OWNERSHIP_LABEL,
    Availability,
    Instance,
    InstanceState,
    Node,
    NodeMarks,
    NodeStatus,
    Policy,
    Resources,
    Snapshot,
    Task,
    TypePolicy,
    Unavailable,
    Worker,
)

TYPES = tuple(t.name for t in CATALOGUE)
SHAPES = (
    {"cpus": 0.5, "ram_gib": 1},
    {"cpus": 1, "ram_gib": 2},
    {"cpus": 2, "ram_gib": 4},
    {"cpus": 3, "ram_gib": 12},
    {"cpus": 1, "ram_gib": 2, "gpus": 1},
    {"cpus": 1, "ram_gib": 1, "pinned": "c5.2xlarge"},
    {"cpus": 2, "ram_gib": 2, "pinned": "m5.xlarge"},
    {"cpus": 64, "ram_gib": 1},  # never placeable
    {"cpus": 0, "ram_gib": 0},  # no restrictions at all
)
TIMES = st.sampled_from((None, NOW - 1000, NOW - 200, NOW - 90, NOW - 10, NOW))
# Marks written by a replica whose clock was off, or left from long ago: in the future, or far past.
STALE = st.sampled_from((NOW + 300, NOW + 3600, NOW - 30 * 86400))
# Instance ages; negative ones are launch times in the future (EC2's clock ahead of the daemon's).
AGES = st.sampled_from((-3600.0, -300.0, 5.0, 300.0, 700.0, 5000.0))
SUBNETS = ("subnet-a", "subnet-b")

# The labels an owned instance is listed with: its launch labels and, always, the ownership label (the
# EC2 adapter adds it for every instance its tags prove ours), which the planner copies onto its node.
CLUSTER = "test"


# Every instance was launched with spec "v1"; the policies give every type but m5.large spec "v2", so the
# random worlds' machines of the other types are drifted (drift.py) and every property holds with them.
# (Measured: few of those worlds' outdated machines are active and working, so rolls themselves are
# rare here; tests/core/test_drift.py states them. No draw: the samples stay the same.)
SPEC_LAUNCHED, SPEC_NOW = "v1", "v2"


def _launch_labels(type_name: str) -> MappingProxyType[str, str]:
    return MappingProxyType({"instance-type": type_name, OWNERSHIP_LABEL: CLUSTER, SPEC_LABEL: SPEC_LAUNCHED})


def when(draw: st.DrawFn) -> float | None:
    """A mark's time: usually a sane one, one time in six stale."""
    return draw(STALE) if not draw(st.integers(0, 5)) else draw(TIMES)


@st.composite
def tasks(draw: st.DrawFn, prefix: str, max_size: int, executing: bool = False) -> tuple[Task, ...]:
    shapes = draw(st.lists(st.sampled_from(SHAPES), max_size=max_size))
    made = (make_task(f"{prefix}{i}", **shape) for i, shape in enumerate(shapes))  # type: ignore[arg-type]
    return tuple(timed(draw, t, executing and draw(st.booleans())) for t in made)


ESTIMATES = st.sampled_from((None, 30.0, 100.0, 600.0))


SHORT = st.sampled_from((None, 30.0, 60.0, 100.0))  # estimates of tasks ending within the tolerated wait


def timed(draw: st.DrawFn, task: Task, executing: bool, short: bool = False) -> Task:
    """`task` with dask's duration estimate and, when executing, a start time (either may be absent);
    `short`: estimates and starts that mostly end it within the default tolerated wait."""
    starts = (None, NOW - 20, NOW - 10, NOW - 5) if short else (None, NOW - 500, NOW - 90, NOW - 10)
    started = draw(st.sampled_from(starts)) if executing else None
    return dataclasses.replace(
        task, executing=executing, expected=draw(SHORT if short else ESTIMATES), started=started
    )


@st.composite
def machines(draw: st.DrawFn, n: int) -> tuple[Instance | None, Node | None, Worker | None]:
    """Machine `n` in any state: instance (or none), node (or none), worker (or none). Marks may be
    stale, launch times in the future, and a node may lack our ownership label (`ours`): always when it
    has no instance of ours, sometimes when it just joined and is not labelled yet."""
    type_name = draw(st.sampled_from(TYPES))
    host = hostname(n)
    instance = None
    if draw(st.integers(0, 9)):
        state = draw(st.sampled_from([InstanceState.RUNNING] * 5 + list(InstanceState)))
        subnet = draw(st.sampled_from(SUBNETS))
        instance = Instance(
            f"i-{n:04d}",
            type_name,
            state,
            NOW - draw(AGES),
            host,
            subnet_id=subnet,
            labels=_launch_labels(type_name),
        )
    node = None
    if draw(st.integers(0, 3)):
        marks = NodeMarks(
            draw(st.booleans()),
            when(draw),
            when(draw),
            when(draw) if not draw(st.integers(0, 4)) else None,
            when(draw),
            when(draw) if not draw(st.integers(0, 2)) else None,
        )
        manager = not draw(st.integers(0, 15))
        node = Node(
            f"node-{n}",
            host,
            draw(st.sampled_from([Availability.ACTIVE] * 3 + list(Availability))),
            draw(st.sampled_from([NodeStatus.READY] * 4 + list(NodeStatus))),
            is_manager=manager,
            marks=marks,
            labels={"instance-type": type_name} if draw(st.booleans()) else {},
            ours=not manager and (draw(st.integers(0, 7)) > 0 if instance else draw(st.booleans())),
        )
    worker = None
    if node is not None and draw(st.integers(0, 3)):
        worker = make_worker_of(
            draw,
            n,
            type_name,
            processing=draw(tasks(f"w{n}-", 6, executing=True)) if draw(st.booleans()) else (),
            unique=not draw(st.integers(0, 5)),
            retiring=not draw(st.integers(0, 8)),
        )
    return instance, node, worker


def make_worker_of(
    draw: st.DrawFn, n: int, type_name: str, processing: tuple[Task, ...], unique: bool, retiring: bool
) -> Worker:
    """The worker of machine `n`, with its type's resources."""
    host = hostname(n)
    res = next(t.resources for t in CATALOGUE if t.name == type_name)
    return Worker(f"tcp://{host}:8786", host, host, res, processing, unique, retiring)


REFUSALS = st.builds(
    Unavailable,
    st.sampled_from(TYPES),
    st.sampled_from((NOW + 30, NOW + 300, NOW - 5)),
    st.sampled_from((*SUBNETS, "")),  # "": a refusal the adapter could not tie to one subnet
)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """Anything at all: machines in every state, pending work (unrunnable and queued in the scheduler),
    capacity refusals per type and subnet."""
    parts = [draw(machines(n)) for n in range(1, draw(st.integers(0, 8)) + 1)]
    return Snapshot(
        now=NOW,
        instance_types=CATALOGUE,
        instances=tuple(i for i, _, _ in parts if i is not None),
        nodes=tuple(n for _, n, _ in parts if n is not None),
        workers=tuple(w for _, _, w in parts if w is not None),
        unrunnable=draw(tasks("u", 12)) if draw(st.booleans()) else (),
        unavailable=tuple(draw(st.lists(REFUSALS, max_size=3))),
        queued=draw(tasks("q", 8)) if not draw(st.integers(0, 2)) else (),
    )


PHASES = (
    "idle",
    "busy",
    "drained",
    "kept",
    "busy-drained",
    "retiring",
    "broken",
    "down",
    "orphan",
    "terminating",
)


@st.composite
def scaling_down(draw: st.DrawFn) -> Snapshot:
    """What scale-down and repair act on: a fleet of one or two types whose machines are each in one
    phase of their way out (idle for a while, drained, retiring, broken, down, terminating), beside
    busy ones, idle ones holding results a client keeps, drained ones whose worker holds work or that
    the scheduler kept (it holds the only copy of a result), nodes of other owners, stale marks and launch times in the future. Work is pending
    one time in three."""
    parts = [draw(leaving(n)) for n in range(1, draw(st.integers(2, 8)) + 1)]
    return Snapshot(
        now=NOW,
        instance_types=CATALOGUE,
        instances=tuple(i for i, _, _ in parts if i is not None),
        nodes=tuple(n for _, n, _ in parts if n is not None),
        workers=tuple(w for _, _, w in parts if w is not None),
        unrunnable=_regrowth(draw) if not draw(st.integers(0, 3)) else (),
        unavailable=tuple(draw(st.lists(REFUSALS, max_size=2))),
        queued=draw(tasks("q", 3)) if not draw(st.integers(0, 4)) else (),
    )


def _running(draw: st.DrawFn, work: tuple[Task, ...]) -> tuple[Task, ...]:
    """`work` as drawn (some tasks waiting) one time in four, else all of it executing: a task waiting on
    a worker is pending work, and pending work holds back scale-down, the rules this fleet is for."""
    return (
        work if not draw(st.integers(0, 3)) else tuple(dataclasses.replace(t, executing=True) for t in work)
    )


def _regrowth(draw: st.DrawFn) -> tuple[Task, ...]:
    """Work arriving on a shrinking fleet: any tasks, or (one time in two) a batch of the shapes its
    machines run, often more than its idle workers take, so that drained machines are activated."""
    if draw(st.booleans()):
        return draw(tasks("u", 3))
    shapes = draw(st.lists(st.sampled_from(SHAPES[1:3]), min_size=2, max_size=8))
    return tuple(make_task(f"u{i}", **s) for i, s in enumerate(shapes))  # type: ignore[arg-type]


@st.composite
def leaving(draw: st.DrawFn, n: int) -> tuple[Instance | None, Node | None, Worker | None]:
    """Machine `n` in one of PHASES."""
    phase = draw(
        st.sampled_from(
            (
                *PHASES,
                "idle",
                "idle",
                "idle",
                "drained",
                "drained",
                "drained",
                "drained",
                "drained",
                "broken",
                "kept",
            )
        )
    )
    type_name = draw(st.sampled_from(("m5.large", "m5.xlarge")))
    host = hostname(n)
    # A broken machine past its start time more often than not: the termination of one is a rule to
    # reach. Any other machine was launched long ago, by EC2's clock one time in eight ahead of ours.
    if phase == "broken":
        age = draw(st.sampled_from((700.0, 5000.0)) if draw(st.booleans()) else AGES)
    else:
        age = 5000.0 if draw(st.integers(0, 7)) else -300.0
    instance = Instance(
        f"i-{n:04d}",
        type_name,
        InstanceState.RUNNING,
        NOW - age,
        host,
        subnet_id="subnet-a",
        labels=_launch_labels(type_name),
    )
    old = st.sampled_from((NOW - 1000, NOW - 1000, NOW - 1000, None, NOW - 10, NOW + 3600, NOW - 30 * 86400))
    marks = NodeMarks(ready=True)
    availability, status = Availability.ACTIVE, NodeStatus.READY
    work: tuple[Task, ...] = ()
    unique = retiring = False
    if phase == "idle":
        marks = NodeMarks(ready=True, empty_since=draw(old))
        # One idle machine in three holds a result a client keeps (no draw: the samples stay the same)
        unique = n % 3 == 0
    elif phase == "busy":
        work = _running(draw, draw(tasks(f"w{n}-", 3, executing=True)))
        unique = not work or draw(st.booleans())
    elif phase in ("drained", "kept", "busy-drained"):
        availability = Availability.DRAIN
        marks = NodeMarks(ready=True, drained_since=draw(old))
        unique = phase == "kept"
        retiring = phase == "drained" and draw(st.booleans())
        work = _running(draw, draw(tasks(f"w{n}-", 2, executing=True))) if phase == "busy-drained" else ()
    elif phase == "retiring":
        retiring = True
        marks = NodeMarks(ready=True, empty_since=draw(old))
    elif phase == "down":
        status = NodeStatus.DOWN
        marks = NodeMarks(ready=True, down_since=draw(old))
    elif phase == "terminating":
        marks = NodeMarks(ready=True, termination_started=draw(old))
    elif phase == "broken":  # never accepted, and never a worker
        marks = NodeMarks()
    if phase == "broken" and draw(st.booleans()):
        return instance, None, None
    ours = draw(st.integers(0, 7)) > 0 if phase != "orphan" else draw(st.booleans())
    labels = {"instance-type": type_name} if phase != "orphan" or draw(st.booleans()) else {}
    if phase == "orphan":
        instance = None
        status = draw(st.sampled_from((NodeStatus.DOWN, NodeStatus.READY)))
        marks = NodeMarks(ready=draw(st.booleans()))
    node = Node(f"node-{n}", host, availability, status, marks=marks, labels=labels, ours=ours)
    if phase == "broken" or (phase in ("down", "orphan", "terminating") and draw(st.booleans())):
        return instance, node, None
    return instance, node, make_worker_of(draw, n, type_name, work, unique, retiring)


@st.composite
def worlds(draw: st.DrawFn) -> Snapshot:
    """What the properties run on: anything at all (one sample in seven), quiet fleets (consolidation)
    or fleets on their way down (scale-down and repair), three in seven each: the shrinking and the
    quiet fleets each carry rules the others do not reach. The shares each rule is reached with are
    measured by tests/core/test_strategy_reach.py."""
    kinds = (scaling_down, quiet_fleets, scaling_down, quiet_fleets, snapshots, scaling_down, quiet_fleets)
    return draw(draw(st.sampled_from(kinds))())


@st.composite
def cost_fleets(draw: st.DrawFn) -> Snapshot:
    """What the cost levers act on (tests/core/test_cost_levers.py), one of two fleets: full m5.large
    workers, some with one to three tasks waiting (the queue threshold); or m5.large workers with room
    beside dearer machines (c5.2xlarge, g4dn.xlarge) running a few short CPU tasks that the cheaper
    workers could take (the cost-aware pass). Tasks carry dask's estimates, mostly ending soon."""
    queue = draw(st.booleans())
    parts = []
    for n in range(1, draw(st.integers(2, 6)) + 1):
        dear = (not queue and n == 1) or draw(st.integers(0, 5)) == 0
        type_name = draw(st.sampled_from(("c5.2xlarge", "g4dn.xlarge"))) if dear else "m5.large"
        host = hostname(n)
        res = next(t.resources for t in CATALOGUE if t.name == type_name)
        running = 2 if queue and not dear else 1 if type_name == "m5.large" else draw(st.integers(1, 2))
        waiting = draw(st.integers(0, 3)) if queue and not dear else 0
        work = tuple(
            timed(draw, make_task(f"w{n}-{i}", cpus=1, ram_gib=1), True, short=True) for i in range(running)
        )  # the waiting ones without an estimate: each may buy a machine (tolerated_wait aside)
        work += tuple(make_task(f"q{n}-{i}", cpus=1, ram_gib=1) for i in range(waiting))
        marks = NodeMarks(True)
        parts.append(
            (
                Instance(f"i-{n:04d}", type_name, InstanceState.RUNNING, NOW - 1000, host),
                Node(f"node-{n}", host, Availability.ACTIVE, NodeStatus.READY, marks=marks, ours=True),
                Worker(f"tcp://{host}:8786", host, host, res, processing=work),
            )
        )
    return Snapshot(
        now=NOW,
        instance_types=CATALOGUE,
        instances=tuple(i for i, _, _ in parts),
        nodes=tuple(n for _, n, _ in parts),
        workers=tuple(w for _, _, w in parts),
        unrunnable=(),
    )


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    allowed = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=4, unique=True))
    overhead = draw(st.sampled_from((Resources(), Resources(0.25, 512 * 1024**2))))
    return Policy(
        allowed_types=tuple(
            # A queue threshold on two types (no draw: the samples stay the same)
            TypePolicy(
                name,
                reserve=draw(st.sampled_from((0, 0, 0, 1, 2))),
                overhead=overhead,
                surge_above=2 if name != "c5.2xlarge" else 0,
                spec=SPEC_NOW if name != "m5.large" else SPEC_LAUNCHED,
            )
            for name in allowed
        ),
        min_instances=draw(st.sampled_from((0, 0, 1, 3))),
        max_instances=draw(st.integers(0, 12)),
        max_start_time=600.0,
        drain_delay=60.0,
        termination_delay=120.0,
        node_down_timeout=300.0,
        max_launch_per_tick=draw(st.sampled_from((0, 0, 2))),
        consolidate_below=draw(st.sampled_from((0.5, 0.5, 1.0, 0.5, 0.0))),  # the default, 0.5, mostly
        tolerated_wait=draw(st.sampled_from((0.0, 120.0, 600.0))),
    )


def apply(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot right after every action of `plan` took effect (same `now`). Launched instances get
    ids `new-<type>-<k>`."""
    world = _World(
        {i.id: i for i in snapshot.instances},
        {n.id: n for n in snapshot.nodes},
        {w.address: w for w in snapshot.workers},
    )
    for action in plan.actions:
        world.carry_out(action, snapshot.now)
    return dataclasses.replace(
        snapshot,
        instances=tuple(world.instances.values()),
        nodes=tuple(world.nodes.values()),
        workers=tuple(world.workers.values()),
    )


@dataclasses.dataclass
class _World:
    instances: dict[str, Instance]
    nodes: dict[str, Node]
    workers: dict[str, Worker]

    def carry_out(self, action: object, now: float) -> None:
        match action:
            case NodeUpdate(node_id=node_id, marks=marks) if marks is not None:
                self.nodes[node_id] = dataclasses.replace(self.nodes[node_id], marks=marks)
            case ActivateNode(node_id=node_id) | DrainNode(node_id=node_id):
                active = isinstance(action, ActivateNode)
                availability = Availability.ACTIVE if active else Availability.DRAIN
                node = self.nodes[node_id]
                marks = (
                    action.marks if isinstance(action, DrainNode) and action.marks is not None else node.marks
                )
                self.nodes[node_id] = dataclasses.replace(node, availability=availability, marks=marks)
            case RetireWorkers(addresses=addresses):
                for a in addresses:
                    self.workers[a] = dataclasses.replace(self.workers[a], retiring=True)
            case (
                Cordon(node_id=node_id, addresses=addresses) | Uncordon(node_id=node_id, addresses=addresses)
            ):
                self.cordon(node_id, addresses, now if isinstance(action, Cordon) else None, action.marks)
            case Terminate(instance_ids=ids, node_ids=node_ids):
                for iid in ids:
                    self.instances[iid] = dataclasses.replace(
                        self.instances[iid], state=InstanceState.SHUTTING_DOWN
                    )
                for node_id in node_ids:
                    self.nodes.pop(node_id, None)
            case RemoveNode(node_id=node_id):
                self.nodes.pop(node_id, None)
            case Launch(type_name=type_name, count=count):
                for k in range(count):
                    iid = f"new-{type_name}-{k}"
                    self.instances[iid] = Instance(iid, type_name, InstanceState.PENDING, now, f"host-{iid}")

    def cordon(
        self, node_id: str, addresses: tuple[str, ...], since: float | None, planned: NodeMarks | None
    ) -> None:
        """Cordon (since = now) or uncordon (None): the node's marks (as planned, when the action carries
        them) and the workers' status."""
        node = self.nodes[node_id]
        marks = planned if planned is not None else dataclasses.replace(node.marks, cordoned_since=since)
        self.nodes[node_id] = dataclasses.replace(node, marks=marks)
        for a in addresses:
            self.workers[a] = dataclasses.replace(self.workers[a], retiring=since is not None)


def clone(snapshot: Snapshot) -> Snapshot:
    """An equal snapshot made of new objects (copy.deepcopy cannot copy the mapping proxies)."""

    def fresh(items: tuple[object, ...]) -> tuple[object, ...]:
        return tuple(dataclasses.replace(x) for x in items)  # type: ignore[type-var]

    return Snapshot(
        snapshot.now,
        fresh(snapshot.instance_types),  # type: ignore[arg-type]
        fresh(snapshot.instances),  # type: ignore[arg-type]
        fresh(snapshot.nodes),  # type: ignore[arg-type]
        fresh(snapshot.workers),  # type: ignore[arg-type]
        fresh(snapshot.unrunnable),  # type: ignore[arg-type]
        fresh(snapshot.unavailable),  # type: ignore[arg-type]
        fresh(snapshot.queued),  # type: ignore[arg-type]
    )


# What a quiet fleet is drawn for: cordons ("consolidating": nothing pending, light workers),
# uncordons ("recovering": cordoned workers that a task waits on or pending work fits), or any mix.
QUIET = ("consolidating", "recovering", "consolidating", "recovering", "consolidating", "mixed")


@st.composite
def quiet_fleets(draw: st.DrawFn) -> Snapshot:
    """What consolidation acts on: joined machines of one or two types whose workers run a few tasks
    (some may wait, some workers may be cordoned), often with nothing pending. Drawn for one of QUIET:
    a mixed fleet alone rarely reaches a cordon or an uncordon (one needs nothing pending, the other
    pending work or a waiting task)."""
    flavour = draw(st.sampled_from(QUIET))
    parts = []
    kinds = draw(st.sampled_from(FLEET_TYPES))
    short = "g4dn.xlarge" in kinds  # a GPU fleet's tasks end soon: the cost-aware pass may move them
    load = draw(st.sampled_from((1, 2, 4)))  # most tasks a worker runs: light fleets are the ones to shrink
    for n in range(1, draw(st.integers(2 if flavour == "mixed" else 3, 7)) + 1):
        type_name = draw(st.sampled_from(kinds))
        host = hostname(n)
        res = next(t.resources for t in CATALOGUE if t.name == type_name)
        cordoned = _cordoned(draw, flavour)
        # Recovering fleets keep some drained machines too: the work that fits no worker activates one.
        drained = flavour == "recovering" and not cordoned and not draw(st.integers(0, 2))
        marks = NodeMarks(
            ready=True,
            cordoned_since=NOW - 30 if cordoned else None,
            drained_since=NOW - 30 if drained else None,
        )
        if drained:
            work: tuple[Task, ...] = ()
        elif flavour == "recovering" and not cordoned:
            work = _full(n, type_name)  # the work that comes goes to cordoned or drained machines
        else:
            work = _quiet_work(draw, n, flavour, cordoned, load, type_name, short)
        availability = Availability.DRAIN if drained else Availability.ACTIVE
        parts.append(
            (
                Instance(f"i-{n:04d}", type_name, InstanceState.RUNNING, NOW - 1000, host),
                Node(f"node-{n}", host, availability, NodeStatus.READY, marks=marks, ours=True),
                Worker(f"tcp://{host}:8786", host, host, res, processing=work, retiring=cordoned),
            )
        )
    if flavour == "recovering":  # more work than the active workers have room for, now and then
        shapes = draw(st.lists(st.sampled_from(SHAPES[:4]), min_size=2, max_size=6))
        pending = tuple(timed(draw, make_task(f"u{i}", **s), False) for i, s in enumerate(shapes))  # type: ignore[arg-type]
    else:
        pending = draw(tasks("u", 2)) if flavour == "mixed" and not draw(st.integers(0, 3)) else ()
    # The work that comes has no worker yet, or (recovering, one time in two) waits in the scheduler's queue.
    queued = flavour == "recovering" and draw(st.booleans())
    return Snapshot(
        now=NOW,
        instance_types=CATALOGUE,
        instances=tuple(i for i, _, _ in parts),
        nodes=tuple(n for _, n, _ in parts),
        workers=tuple(w for _, _, w in parts),
        unrunnable=() if queued else pending,
        queued=pending if queued else (),
    )


# The types of a quiet fleet. A plan cordons or activates only machines of a type the policy allows, so
# m5.large, the type policies() allows most often, is among them.
FLEET_TYPES = (
    ("m5.large",),
    ("m5.xlarge",),
    ("c5.2xlarge",),
    ("m5.large", "m5.xlarge"),
    ("m5.xlarge", "c5.2xlarge"),
    ("m5.large", "c5.2xlarge"),
    ("m5.xlarge", "g4dn.xlarge"),
)


def _cordoned(draw: st.DrawFn, flavour: str) -> bool:
    if flavour == "consolidating":
        return False
    return not draw(st.integers(0, 1 if flavour == "recovering" else 4))


def _quiet_work(
    draw: st.DrawFn, n: int, flavour: str, cordoned: bool, load: int, type_name: str, short: bool
) -> tuple[Task, ...]:
    """A quiet worker's tasks, each executing (five times in six) or waiting on it; when consolidating,
    one or two executing small ones; when recovering, a cordoned worker has one waiting half the time."""
    if flavour == "consolidating":
        shapes = draw(st.lists(st.sampled_from(SHAPES[:3]), min_size=1, max_size=2))
        return tuple(timed(draw, make_task(f"w{n}-{i}", **s), True, short) for i, s in enumerate(shapes))  # type: ignore[arg-type]
    fitting = SHAPES[:3] if type_name == "m5.large" else SHAPES[:4]  # 3 CPUs do not fit an m5.large
    shapes = draw(st.lists(st.sampled_from(fitting), max_size=load))
    work = tuple(
        timed(draw, make_task(f"w{n}-{i}", **shape), draw(st.integers(0, 5)) > 0, short)  # type: ignore[arg-type]
        for i, shape in enumerate(shapes)
    )
    if flavour == "recovering" and cordoned and draw(st.booleans()):
        work += (timed(draw, make_task(f"w{n}-wait", **SHAPES[1]), False),)  # type: ignore[arg-type]
    return work


def _full(n: int, type_name: str) -> tuple[Task, ...]:
    """One executing task that takes the whole of a `type_name` machine: pending work must go elsewhere."""
    res = next(t.resources for t in CATALOGUE if t.name == type_name)
    return (Task(f"w{n}-full", Resources(res.cpus, res.ram), executing=True),)
