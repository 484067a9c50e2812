"""Worlds with warm pools and per-type bases for the pool's property test (test_pool_properties.py).

Each sample is a random world and policy (`worlds()`, `policies()` of randomized.py) given pool sizes and
bases, drawn in one of MODES:

- "mixed": the world decorated at random with stopped, stopping, preparing and starting machines and
  refused starts (strays, refusals and machines on their way in or out of a pool);
- "burst": stopped pool machines of one type (the target) and pending work pinned to it that only an
  empty machine of it takes, more than its idle machines hold: the work should start pool machines;
- "scale-down": drained surplus machines of the target type, past termination_delay, whose pool is
  short and nothing pending: scale-down should stop them into the pool;
- "refill": the target's pool short by more than its idle machines make up, nothing pending: a launch
  into the pool;
- "base": the target type below its base (`minimum`): a base launch.

A targeted mode builds on the random world: it takes the target's refusals away (and, for the modes
that need nothing pending, the pending work), raises the maximum to leave room for what the mode
expects (with a little slack, sometimes none), then decorates the other types as "mixed" does. The
random parts left in keep the invariants exercised on varied worlds; the modes make each pool rule
reached in a stable share, where decoration alone reached some in 2% of samples and its shares moved
by points whenever the strategies of randomized.py changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MappingProxyType

from hypothesis import strategies as st
from tests.builders import CATALOGUE, NOW, hostname
from tests.core.randomized import TYPES, policies, worlds

from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.launches import useful_of
from swarm_autoscaler.core.model import (
    GIB,
    OWNERSHIP_LABEL,
    Availability,
    Instance,
    InstanceState,
    Node,
    NodeMarks,
    NodeStatus,
    Policy,
    PoolPhase,
    Resources,
    Snapshot,
    Task,
    TypePolicy,
    Unavailable,
    Worker,
)

SUBNETS = ("subnet-a", "subnet-b")
MODES = ("mixed", "burst", "scale-down", "refill", "base")

World = tuple[Snapshot, Policy]


@st.composite
def pooled_worlds(draw: st.DrawFn, mode: str) -> World:
    """A world and policy with pools and bases, drawn for `mode`, one of MODES (see the module docstring)."""
    snapshot, policy = draw(worlds()), draw(policies())
    types = tuple(
        dataclasses.replace(
            tp,
            warm_pool=draw(st.sampled_from((0, 1, 2, 3))),
            minimum=draw(st.sampled_from((0, 0, 0, 1))),
        )
        for tp in policy.allowed_types
    )
    world = (snapshot, dataclasses.replace(policy, allowed_types=types))
    if mode == "mixed":
        return _decorate(draw, world, avoid="")
    target = draw(st.sampled_from([tp.name for tp in types]))
    world = _allow(world, target)
    world, need = MAKERS[mode](draw, world, target)
    return _room(draw, _decorate(draw, world, avoid=target), need)


def _allow(world: World, target: str) -> World:
    """The world without EC2's refusals of `target`: the targeted rules need the type available."""
    snapshot, policy = world
    kept = tuple(u for u in snapshot.unavailable if u.type_name != target)
    return dataclasses.replace(snapshot, unavailable=kept), policy


def _room(draw: st.DrawFn, world: World, need: int) -> World:
    """Room for `need` more machines beside the alive ones and what the policy launches first (bases,
    reserves, `min_instances`, at most), with a slack of none to a few: the maximum raised to it, and the
    per-tick limit, if any, too (the budget invariant is checked at its edge in "mixed" worlds)."""
    snapshot, policy = world
    alive = sum(1 for i in snapshot.instances if i.alive)
    first = policy.min_instances + sum(tp.minimum + tp.reserve for tp in policy.allowed_types)
    top = need + first + draw(st.sampled_from((0, 0, 1, 3)))
    per_tick = max(policy.max_launch_per_tick, top) if policy.max_launch_per_tick else 0
    return snapshot, dataclasses.replace(
        policy, max_instances=max(policy.max_instances, alive + top), max_launch_per_tick=per_tick
    )


def _quiet(snapshot: Snapshot) -> Snapshot:
    """Nothing pending: no unrunnable or queued task, and each worker keeps only the tasks that fit on it
    at once (in order), all executing (a task that does not fit waits on its worker: pending work)."""
    return dataclasses.replace(
        snapshot, unrunnable=(), queued=(), workers=tuple(_running(w) for w in snapshot.workers)
    )


def _running(worker: Worker) -> Worker:
    kept: list[Task] = []
    used = Resources()
    for task in worker.processing:
        if not (used + task.needs).fits_in(worker.resources):
            break
        used += task.needs
        kept.append(dataclasses.replace(task, executing=True))
    return dataclasses.replace(worker, processing=tuple(kept))


def _set_type(policy: Policy, name: str, warm_pool: int | None = None, minimum: int | None = None) -> Policy:
    """`policy` with type `name`'s pool size and base changed (those given)."""
    types = tuple(
        dataclasses.replace(
            tp,
            warm_pool=tp.warm_pool if warm_pool is None else warm_pool,
            minimum=tp.minimum if minimum is None else minimum,
        )
        if tp.name == name
        else tp
        for tp in policy.allowed_types
    )
    return dataclasses.replace(policy, allowed_types=types)


def _pool_of(policy: Policy, name: str) -> int:
    return next((tp.warm_pool for tp in policy.allowed_types if tp.name == name), 0)


def _type_policy(policy: Policy, name: str) -> TypePolicy:
    return next(tp for tp in policy.allowed_types if tp.name == name)


def _stopped_of(snapshot: Snapshot, name: str) -> int:
    stopped = (InstanceState.STOPPED, InstanceState.STOPPING)
    return sum(1 for i in snapshot.instances if i.type_name == name and i.state in stopped)


def _idle_of(snapshot: Snapshot, policy: Policy, name: str) -> int:
    """Idle active or drained machines of `name`: refill counts them as on their way into its pool."""
    cluster = classify(snapshot, policy)
    return sum(1 for m in (*cluster.active, *cluster.drained) if m.type_name == name and not m.busy)


def _holders(snapshot: Snapshot, name: str) -> int:
    """At most how many machines of `name` could take a task that fills one: its alive instances and
    the workers of its size (a node without an instance of ours may run one)."""
    whole = next(t.resources for t in CATALOGUE if t.name == name)
    alive = sum(1 for i in snapshot.instances if i.type_name == name and i.alive)
    return alive + sum(1 for w in snapshot.workers if w.resources == whole)


def _labels(name: str) -> MappingProxyType[str, str]:
    return MappingProxyType({"instance-type": name, OWNERSHIP_LABEL: "test"})


def _burst(draw: st.DrawFn, world: World, target: str) -> tuple[World, int]:
    """Stopped pool machines of `target` (one of them, sometimes, in a subnet that refused it) and work
    pinned to it that only an empty machine takes: more tasks than its idle machines hold."""
    snapshot, policy = world
    count = draw(st.integers(1, 3))
    refused = draw(st.sampled_from((False, False, True)))
    subnets = [draw(st.sampled_from(SUBNETS)) for _ in range(count)]
    machines = tuple(
        Instance(f"i-burst{k}", target, InstanceState.STOPPED, NOW - 3000 + k, hostname(200 + k), subnet_id=s)
        for k, s in enumerate(subnets)
    )
    blocked: tuple[Unavailable, ...] = ()
    if refused:  # one more, the newest, in a subnet EC2 just refused: it stays stopped
        other = next(s for s in SUBNETS if s != subnets[-1])
        machines += (
            Instance("i-burst9", target, InstanceState.STOPPED, NOW - 100, hostname(209), subnet_id=other),
        )
        blocked = (Unavailable(target, NOW + 60, other),)
    pool = _stopped_of(snapshot, target) + len(machines) + draw(st.sampled_from((0, 0, 1)))
    policy = _set_type(policy, target, warm_pool=pool)
    whole = next(t.resources for t in CATALOGUE if t.name == target)
    size = Resources(whole.cpus - 0.5, 2 * GIB, whole.gpus)  # only an empty machine of the type takes one
    tasks = _holders(snapshot, target) + draw(st.integers(1, count))
    work = tuple(Task(f"burst-t{k}", size, pinned_type=target) for k in range(tasks))
    snapshot = dataclasses.replace(
        snapshot,
        instances=snapshot.instances + machines,
        unavailable=snapshot.unavailable + blocked,
        unrunnable=snapshot.unrunnable + work,
    )
    return (snapshot, policy), count


def _scale_down(draw: st.DrawFn, world: World, target: str) -> tuple[World, int]:
    """Drained idle machines of `target` past termination_delay, beyond its reserve, its pool short, no
    base kept on it and nothing pending."""
    snapshot, policy = world
    tp = _type_policy(policy, target)
    count = tp.reserve + draw(st.integers(1, 2))
    pool = _stopped_of(snapshot, target) + draw(st.integers(1, 3))
    policy = _set_type(policy, target, warm_pool=pool, minimum=0)
    policy = dataclasses.replace(
        policy, min_instances=min(policy.min_instances, draw(st.sampled_from((0, 1))))
    )
    whole = next(t.resources for t in CATALOGUE if t.name == target)
    parts = []
    for k in range(count):
        host = hostname(220 + k)
        marks = NodeMarks(ready=True, drained_since=NOW - draw(st.sampled_from((200.0, 1000.0))))
        parts.append(
            (
                Instance(
                    f"i-down{k}",
                    target,
                    InstanceState.RUNNING,
                    NOW - 5000,
                    host,
                    subnet_id="subnet-a",
                    labels=_labels(target),
                ),
                Node(f"node-down{k}", host, Availability.DRAIN, NodeStatus.READY, marks=marks, ours=True),
                Worker(f"tcp://{host}:8786", host, host, whole, retiring=draw(st.booleans())),
            )
        )
    snapshot = _quiet(snapshot)
    snapshot = dataclasses.replace(
        snapshot,
        instances=snapshot.instances + tuple(i for i, _, _ in parts),
        nodes=snapshot.nodes + tuple(n for _, n, _ in parts),
        workers=snapshot.workers + tuple(w for _, _, w in parts),
    )
    return (snapshot, policy), 0


def _refill(draw: st.DrawFn, world: World, target: str) -> tuple[World, int]:
    """Nothing pending and `target`'s pool short by more than its idle machines (which scale-down would
    stop into it) make up."""
    snapshot, policy = world
    snapshot = _quiet(snapshot)
    short = draw(st.integers(1, 3))
    pool = _stopped_of(snapshot, target) + _idle_of(snapshot, policy, target) + short
    return (snapshot, _set_type(policy, target, warm_pool=pool)), short


def _base(draw: st.DrawFn, world: World, target: str) -> tuple[World, int]:
    """`target` one or two machines below its base (its reserve on top)."""
    snapshot, policy = world
    cluster = classify(snapshot, policy)
    reserve = sum(1 for m in cluster.reserve if m.type_name == target)
    short = draw(st.integers(1, 2))
    policy = _set_type(policy, target, minimum=useful_of(cluster, target) - reserve + short)
    return (snapshot, policy), short + len(snapshot.unrunnable)


Maker = Callable[[st.DrawFn, World, str], tuple[World, int]]
MAKERS: dict[str, Maker] = {"burst": _burst, "scale-down": _scale_down, "refill": _refill, "base": _base}


def _decorate(draw: st.DrawFn, world: World, avoid: str) -> World:
    """Stopped, stopping, preparing and starting instances of the policy's types but `avoid` (some of a
    type outside it: strays), refused subnets of those types and, in "mixed" worlds (`avoid` empty), a
    few small pending tasks two samples in five, so that pool machines may be started. Each kind of
    machine is drawn on its own (none to three stopped, none or one of each other kind), so that a run
    of similar draws does not leave one kind out of many samples."""
    snapshot, policy = world
    names = [tp.name for tp in policy.allowed_types] * 3 + ["m5.large"]  # mostly allowed types; some strays
    names = [n for n in names if n != avoid] or [next(t for t in TYPES if t != avoid)]
    kinds: list[tuple[InstanceState, PoolPhase | None, list[str]]] = [
        (InstanceState.STOPPED, None, names)
    ] * draw(st.integers(0, 3))
    for state, phase in ((InstanceState.STOPPING, None), (None, PoolPhase.PREPARE), (None, PoolPhase.START)):
        if draw(st.booleans()):
            alive = draw(st.sampled_from((InstanceState.PENDING, InstanceState.RUNNING)))
            kinds.append((state or alive, phase, names))
    poolless = [t for t in TYPES if t != avoid and _pool_of(policy, t) == 0]
    if draw(st.booleans()) and poolless:  # a stray for sure: stopped, of a type without a pool
        kinds.append((InstanceState.STOPPED, None, poolless))
    extra = [
        Instance(
            f"i-pool{n}",
            draw(st.sampled_from(choices)),
            state,
            snapshot.now - draw(st.sampled_from((10.0, 300.0, 5000.0))),
            f"ip-10-9-9-{n}",
            subnet_id=draw(st.sampled_from(SUBNETS)),
            pool=phase,
        )
        for n, (state, phase, choices) in enumerate(kinds)
    ]
    refused = tuple(
        Unavailable(tp.name, snapshot.now + 60, draw(st.sampled_from(SUBNETS)))
        for tp in policy.allowed_types
        if tp.name != avoid and draw(st.sampled_from((True, False, False)))
    )
    stopped = [i for i in extra if i.state is InstanceState.STOPPED and i.type_name in names]
    if draw(st.booleans()) and stopped:  # EC2 just refused where one of them sits: it stays stopped
        hit = draw(st.sampled_from(stopped))
        refused += (Unavailable(hit.type_name, snapshot.now + 60, hit.subnet_id),)
    count = draw(st.sampled_from((0, 0, 0, 1, 8))) if not avoid else 0
    work = tuple(Task(f"pool-t{k}", Resources.of(cpus=1, ram=GIB)) for k in range(count))
    snapshot = dataclasses.replace(
        snapshot,
        instances=snapshot.instances + tuple(extra),
        unavailable=snapshot.unavailable + refused,
        unrunnable=snapshot.unrunnable + work,
    )
    return snapshot, policy
