"""The safety hunt's dynamic-mode worlds: random swarm service workloads with faults on, invariants
checked after every tick (`sim.hunt` draws these for a share of its seeds).

A seed generates a `ServiceCase`: a small policy (as the dask cases draw it), one to five services
(reservations from half a CPU to a GPU, some pinned with `node.labels.instance-type==T`, some behind a
constraint no launched machine meets, some scaled up or down midway), each ending after a duration, and
scripted faults (refused launch calls, machines that never join, daemon restarts). It runs through
`sim.dynamic` (the real planner, the daemon's task-to-demand conversion) and is checked:

- after every tick: live instances never above the maximum; the plan drains, removes, stops or
  terminates no node whose worker (the node) holds a task in the snapshot it saw, nor retires one;
- the world's record: no task lost to a drained, removed, stopped or terminated node (0 busy
  disruptions);
- at the end: the run settled, no placeable task is left pending, and the fleet is back to
  `settled_fleet(policy)` with nothing leaked (every live instance has a ready node and the reverse).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from swarm_autoscaler.core.actions import DrainNode, RemoveNode, RetireWorkers, Stop, Terminate
from swarm_autoscaler.core.model import Policy, Resources, TypePolicy
from swarm_autoscaler.core.plan import plan
from swarm_autoscaler.daemon.tick import TickResult
from swarm_autoscaler_lab.sim.config import priced_catalogue
from swarm_autoscaler_lab.sim.dynamic import ServiceRun, simulate_services
from swarm_autoscaler_lab.sim.engine import Options, Planner, settled_fleet
from swarm_autoscaler_lab.sim.faults import ScriptedFaults
from swarm_autoscaler_lab.sim.servicetrace import Scale, ServiceSpec
from swarm_autoscaler_lab.sim.world import EPOCH, Knobs

TICK_S = 10.0
KNOBS = Knobs(join_s=60.0, join_jitter_s=40.0, shutdown_s=20.0, backoff_initial_s=20.0)
SHAPES = (  # (cpus, ram_gib, gpus, constraints)
    (0.5, 1.0, 0, ()),
    (1.5, 4.0, 0, ()),
    (1.0, 2.0, 0, ("node.labels.instance-type==c5.large",)),
    (3.0, 12.0, 0, ()),
    (1.0, 2.0, 0, ("node.labels.zone==onprem",)),  # unplaceable: no launched machine carries it
    (2.0, 8.0, 1, ()),
    (1.0, 4.0, 1, ("node.labels.instance-type==g4dn.xlarge", "node.role==worker")),
)


@dataclass(frozen=True)
class ServiceCase:
    """One generated dynamic-mode scenario; `events()` lists what shrinking may drop."""

    seed: int
    policy: Policy
    changes: tuple[Scale, ...]
    faults: ScriptedFaults

    def events(self) -> list[tuple[str, object]]:
        f = self.faults
        return [
            *(("scale", c) for c in self.changes),
            *(("refuse-launch-call", n) for n in sorted(f.refused_calls)),
            *(("never-joins-instance", n) for n in sorted(f.never_join)),
            *(("restart-at-tick", n) for n in sorted(f.restarts)),
        ]

    def with_events(self, events: Sequence[tuple[str, object]]) -> ServiceCase:
        def ints(kind: str) -> frozenset[int]:
            return frozenset(v for k, v in events if k == kind and isinstance(v, int))

        changes = tuple(v for k, v in events if k == "scale" and isinstance(v, Scale))
        faults = ScriptedFaults(
            self.seed, ints("refuse-launch-call"), ints("never-joins-instance"), ints("restart-at-tick")
        )
        return replace(self, changes=changes, faults=faults)


def generate_services(seed: int) -> ServiceCase:
    rng = random.Random(f"services:{seed}")
    gpu = rng.random() < 0.4
    names = ["m5.large", "m5.xlarge", "c5.large"] + (["g4dn.xlarge"] if gpu else [])
    types = tuple(TypePolicy(n, reserve=rng.choice((0, 0, 1)), overhead=Resources()) for n in names)
    min_i = rng.choice((0, 0, 1))
    policy = Policy(
        allowed_types=types,
        min_instances=min_i,
        max_instances=min_i + sum(t.reserve for t in types) + rng.randint(1, 5),
        max_start_time=300.0,
        drain_delay=rng.choice((20.0, 60.0)),
        termination_delay=rng.choice((30.0, 120.0)),
        node_down_timeout=120.0,
        max_launch_per_tick=rng.choice((0, 0, 2)),
    )
    shapes = SHAPES if gpu else SHAPES[:5]
    changes: list[Scale] = []
    for i in range(rng.randint(1, 5)):
        cpus, ram, gpus, constraints = rng.choice(shapes)
        spec = ServiceSpec(f"svc{i}", cpus, ram, gpus, constraints)
        at, duration = round(rng.uniform(0, 900), 1), round(rng.uniform(60, 900), 1)
        changes.append(Scale(at, spec, rng.randint(1, 4), duration))
        if rng.random() < 0.4:  # scaled midway, then ends with the first row's duration unless later
            changes.append(Scale(round(at + rng.uniform(10, duration), 1), spec, rng.randint(0, 5), 300.0))
    faults = ScriptedFaults(
        seed,
        frozenset(n for n in range(1, 40) if rng.random() < 0.15),
        frozenset(n for n in range(1, 40) if rng.random() < 0.1),
        frozenset(n for n in range(1, 400) if rng.random() < 0.02),
    )
    return ServiceCase(seed, policy, tuple(sorted(changes, key=lambda c: c.at_s)), faults)


def check_services(case: ServiceCase, planner: Planner = plan) -> list[str]:
    """Run the case; return every violated invariant (empty when safe)."""
    policy = case.policy
    options = Options(tick_s=TICK_S, knobs=KNOBS, deadline_s=3600.0, linger_s=policy.node_down_timeout + 120)
    problems: list[str] = []

    def after_tick(run: ServiceRun, result: TickResult) -> None:
        problems.extend(_tick_problems(run, result))

    run = asyncio.run(
        simulate_services(
            case.changes, policy, priced_catalogue(policy), options, case.faults, after_tick, planner=planner
        )
    )
    problems += [f"t={v.time_s:.0f}s: busy disruption: {v.what}" for v in run.world.violations]
    return problems + _final_problems(run)


def _tick_problems(run: ServiceRun, result: TickResult) -> list[str]:
    t = result.snapshot.now - EPOCH
    out = []
    alive = len(run.world.alive())
    if alive > run.policy.max_instances:
        out.append(f"t={t:.0f}s: {alive} live instances > max {run.policy.max_instances}")
    snap = result.snapshot
    busy = {w.hostname for w in snap.workers if w.processing}
    working = {w.address for w in snap.workers if w.processing}
    host_of_node = {n.id: n.hostname for n in snap.nodes}
    host_of_instance = {i.id: i.hostname for i in snap.instances}
    for action in result.plan.actions:
        hosts: list[str] = []
        if isinstance(action, DrainNode | RemoveNode):
            hosts = [action.hostname]
        elif isinstance(action, Terminate | Stop):
            hosts = [host_of_instance.get(i, "") for i in action.instance_ids]
            hosts += [host_of_node.get(n, "") for n in action.node_ids]
        elif isinstance(action, RetireWorkers) and working & set(action.addresses):
            out.append(f"t={t:.0f}s: plan retires busy worker(s) {sorted(working & set(action.addresses))}")
        out += [f"t={t:.0f}s: plan {type(action).__name__} on busy {h}" for h in hosts if h in busy]
    return out


def _final_problems(run: ServiceRun) -> list[str]:
    world, policy = run.world, run.policy
    out = []
    if not run.finished:
        out.append(f"never settled: {len(world.alive())} live instances at the deadline")
    stuck = sorted(t.id for t in world.tasks.values() if t.state == "pending" and t.id not in run.unplaceable)
    if stuck:
        out.append(f"{len(stuck)} placeable task(s) still pending at the end: {stuck[:3]}")
    alive = world.alive()
    if len(alive) != settled_fleet(policy):
        out.append(
            f"fleet ended at {len(alive)} live instances, expected min + reserve {settled_fleet(policy)}"
        )
    nodes = {n.instance_id: n for n in world.nodes.values()}
    for inst in alive:
        node = nodes.get(inst.id)
        if node is None or node.status != "ready":
            out.append(f"leaked instance {inst.id} ({inst.type_name}): no ready node")
    alive_ids = {i.id for i in alive}
    out += [
        f"leaked node {n.hostname}: its instance is gone"
        for n in world.nodes.values()
        if n.instance_id not in alive_ids
    ]
    return out


def describe_services(case: ServiceCase, problems: Sequence[str]) -> str:
    lines = [
        f"seed {case.seed} (dynamic mode): {len(problems)} violation(s), e.g. {problems[0]}",
        f"  policy: {case.policy}",
    ]
    for kind, value in case.events():
        if isinstance(value, Scale):
            s = value.spec
            lines.append(
                f"  service {s.name} at {value.at_s}s: {value.replicas} replica(s) for {value.duration_s}s,"
                f" cpus={s.cpus:g} ram={s.ram_gib:g}GiB gpus={s.gpus} constraints={list(s.constraints)}"
            )
        else:
            lines.append(f"  {kind} {value}")
    return "\n".join(lines)


def hunt_one(seed: int, planner: Planner = plan) -> list[str]:
    """Check the seed's dynamic-mode case; on failure, the description of its shrunk case."""
    from swarm_autoscaler_lab.sim.hunt import shrink

    case = generate_services(seed)
    if not check_services(case, planner):
        return []
    small = shrink(case, lambda c: bool(check_services(c, planner)))
    return [describe_services(small, check_services(small, planner))]
