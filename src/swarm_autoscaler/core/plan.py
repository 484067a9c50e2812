"""plan(snapshot, policy) -> Plan: the only decision maker. Pure and deterministic.

No clock (only `snapshot.now`), no randomness, no I/O, no logging; the inputs are never mutated, and the
same snapshot always gives an equal Plan. Under a launch hold (`Snapshot.launch_hold`, `held`) the
maximum is the machines alive now. The recipe:

1. classify the machines into buckets (cluster.py) and estimate the pending work (demand.py):
   unrunnable tasks plus each worker's estimated queue; a queued task dask's duration estimates say its
   worker starts within `tolerated_wait` (starts.py) may only take free room on active and cordoned
   workers;
2. set aside tasks no allowed type can ever run (`Plan.unplaceable`);
3. scale up: place pending tasks virtually on free capacity of active workers, then of cordoned
   workers (which get uncordoned), then drained and reserve nodes (which get activated), then joining nodes, then launched instances (in-flight capacity always
   counts, so a task never causes two launches), then new instances of the cheapest fitting type, within
   `max_instances`, except for a type with a queue threshold (`surge_above`, surge.py) while one of its
   workers is up and at most that many tasks would go on its new machines; top up to `min_instances`; when nothing is pending, launch what each type's reserve
   lacks (a reserve is only warm if the machines exist: they join, idle, and are drained into it);
3b. the warm pool and the per-type bases (pool.py): stopped pool machines are a scale-up tier after
   in-flight capacity (started: `Start`), each type is topped up to its base, scale-down stops a
   drained surplus machine into a short pool instead of terminating it, and a short pool is refilled
   (`Launch(pool=True)`) when nothing is pending;
3c. machines EC2 gave notice it takes back (interrupt.py): no capacity, their tasks pending (so their
   replacement launches now), their workers retired whatever they hold, then drained and terminated;
4. repair, even while work is pending: terminate broken instances, remove our nodes whose instance is
   gone or being terminated once they are down, terminate (with its node) a machine whose node stayed
   down past `node_down_timeout`, retry terminations that did not take;
5. scale down when no placeable task is pending, or when pending work cannot get capacity (at
   `max_instances`, or its types refused) so idle machines it cannot use must make room: retire idle workers and drain nodes that stayed
   empty for `drain_delay`, then terminate drained nodes beyond the reserve after `termination_delay`,
   never below `min_instances` and never a type launched in the same plan;
6. consolidate when nothing is pending, or under load (`consolidate_under_load`) when every pending task
   was placed on existing capacity (and no cordon is being undone, nothing launched): cordon under-used
   workers (no new tasks reach them) while others of their type, or (nothing pending) cheaper machines,
   have room for their tasks, so that they empty and step 5 drains them (under load, step 5 drains only
   cordoned workers); a cordoned worker is uncordoned when pending work fits it or a task waits on it;
7. keep the lifecycle marks (node labels) up to date so the timing survives a restart, and give every
   node of ours the labels its instance was launched with (the ownership label among them); with
   `join_paused`, take in the nodes that joined paused (set them active, re-checked); a mark
   stamped in the future (by a clock ahead of the cloud's) is restamped now (clockmarks.py).

Drift and expiry (drift.py): each outdated machine is cordoned and replaced first, in one plan. Every
voluntary disruption (scale-down, consolidation, drift, expiry) passes budgets.py's gate: disruption
budgets and do-not-disrupt (`Plan.held`).

The safety stop (safety.py): while more than `max_unready_share` of our nodes are down or unreachable,
steps 5 and 6 and the termination of long-down machines, and of broken ones whose node is down (step 4),
halt; scale-up goes on (`Plan.halted`).

A machine whose worker runs or queues a task, or holds unique data, is never drained, retired or
terminated, unless EC2 gave notice it takes it back (interrupt.py: its worker is retired whatever it
holds, so that dask moves its results and runs its tasks elsewhere before EC2 comes). Every disruptive action targets one machine and carries in `expect` what it was planned on
(shrink.py and consolidate.py list them), for `act` to re-check right before it runs. Actions come in
the order they should run: node updates (one per node: its marks and labels, `core.updates`), repairs,
uncordons, activations, starts, launches, cordons, then scale-down (retirements before drains, then
terminations and stops); `core.kinds` says in which phase act runs each kind. A drained node's marks
ride in its DrainNode, a cordoned node's in its Cordon or Uncordon: act computes no mark.

Each step is a function of the frozen `Facts` and of what earlier steps decided, passed explicitly
(`received`, the launched types); each only adds actions: none rewrites another's output or sees its
side effects (a type's queue threshold is applied inside scale-up, the warm pool's stops inside
scale-down). The load is decided once, as `idle`, `short` and `settled`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from swarm_autoscaler.core.actions import Action, Cordon, DrainNode, Held, Launch, Plan, Start
from swarm_autoscaler.core.budgets import gate, gate_actions
from swarm_autoscaler.core.clockmarks import restamps
from swarm_autoscaler.core.cluster import classify
from swarm_autoscaler.core.consolidate import choose_cordons
from swarm_autoscaler.core.demand import Group, estimate_demand
from swarm_autoscaler.core.drift import SPEC_LABEL, Roll, roll, spec_labels, staying
from swarm_autoscaler.core.interrupt import let_go, pending_view, replacements
from swarm_autoscaler.core.launches import LaunchBook, plan_launches
from swarm_autoscaler.core.marks import accept_joined, keep_cordons, keep_marks, label_nodes
from swarm_autoscaler.core.model import Policy, Snapshot
from swarm_autoscaler.core.placement import NewBins, Unplaced, rank_types, type_capacity
from swarm_autoscaler.core.pool import refill, repair_pool, reserve_starts, started
from swarm_autoscaler.core.safety import halt_reason
from swarm_autoscaler.core.scaleup import NEW, OWN_WORKER, TIERS, Placement, scale_up
from swarm_autoscaler.core.shrink import base_keys, repair, scale_down
from swarm_autoscaler.core.steps import Facts, Step
from swarm_autoscaler.core.surge import BELOW_SURGE
from swarm_autoscaler.core.updates import node_updates
from swarm_autoscaler.core.vectors import Space, Vec

__all__ = ["BELOW_SURGE", "NEW", "OWN_WORKER", "TIERS", "Trace", "plan", "plan_traced"]


def plan(snapshot: Snapshot, policy: Policy) -> Plan:
    """Decide one tick (see the module docstring for the rules)."""
    return _decide(snapshot, policy, None)[0]


def held(snapshot: Snapshot, policy: Policy) -> Policy:
    """The policy under a launch hold (`Snapshot.launch_hold`): at most the machines alive now, so
    nothing is launched or started from the warm pool; nothing is removed for it either (scale-down
    goes on by its usual rules only)."""
    if not snapshot.launch_hold:
        return policy
    alive = sum(1 for i in snapshot.instances if i.alive)
    return dataclasses.replace(
        policy, max_instances=min(policy.max_instances, alive), min_instances=min(policy.min_instances, alive)
    )


@dataclass(frozen=True, slots=True)
class Trace:
    """How a plan placed the pending work, for tests and an explain view.

    `bins` maps each existing bin (worker address, or instance id of a drained, joining or launched
    machine) to its type and free capacity before placement; `placements` lists (bin key, group index,
    tasks) onto existing bins; `new` the fill patterns of new instances; vectors are in `space`.
    """

    groups: tuple[Group, ...]
    bins: Mapping[str, tuple[str, Vec]]
    placements: tuple[tuple[str, int, int], ...]
    new: tuple[NewBins, ...]
    capacity: Mapping[str, Vec]
    space: Space


def plan_traced(snapshot: Snapshot, policy: Policy) -> tuple[Plan, Trace]:
    """`plan()` plus the Trace of its placements (slower: records every placement)."""
    result, trace = _decide(snapshot, policy, [])
    assert trace is not None
    return result, trace


def _decide(
    snapshot: Snapshot, policy: Policy, ledger: list[tuple[str, int, int]] | None
) -> tuple[Plan, Trace | None]:
    policy = held(snapshot, policy)
    space, demand = estimate_demand(pending_view(snapshot), policy)
    facts = Facts(snapshot, policy, classify(snapshot, policy), demand)
    options = rank_types(snapshot, policy, space)
    unplaced = Unplaced(demand.groups, ledger)
    unplaceable = unplaced.drop_unplaceable(options, policy)
    idle = unplaced.left == 0  # no placeable task pending
    capacity = type_capacity(snapshot, options, space)
    budget = LaunchBook.of(snapshot, policy).budget
    up = scale_up(facts, unplaced, options, capacity, budget, tracing=ledger is not None)
    for_reserve: tuple[Start, ...] = ()
    if idle:  # an empty reserve is filled from the warm pool before any launch (pool.reserve_starts)
        taken = {i for s in up.start for i in s.instance_ids}
        for_reserve = reserve_starts(facts, up.received, taken, budget - started(up.start).total())
        up = dataclasses.replace(up, start=(*up.start, *for_reserve))
    starting = started(up.start)
    launches = plan_launches(
        snapshot,
        policy,
        facts.cluster,
        up.new_bins,
        up.received,
        options,
        fill_reserve=idle,
        started=starting,
        reserve_started=started(for_reserve),
        replace=replacements(facts),
    )
    # The load, decided once: `idle` (nothing pending), `short` (pending work left without capacity:
    # max_instances reached, or its types refused) or neither (every pending task placed). Idle
    # machines are scaled down when idle, and when short too: placement put nothing on them, so they
    # cannot serve that work, and keeping them would block the launches it needs forever. With every
    # pending task placed, only cordoned workers (which take no new task) are drained, and only under
    # `consolidate_under_load`: consolidation under load empties them. Consolidation itself runs when
    # `settled`.
    short = unplaced.left > 0
    # The safety stop (safety.py): while too many of our nodes are down, nothing is scaled down.
    halted = halt_reason(facts.cluster, policy.max_unready_share)
    settled = (idle or (not short and policy.consolidate_under_load)) and not halted
    # Drift and expiry (drift.py): outdated machines cordoned, each replaced first, within the budget.
    rolled: Roll = roll(facts, launches.left, 0) if not halted else ((), (), (), 0)
    cordoned_out, replacing, held_roll, begun = rolled
    replaced = sum(r.count for r in replacing)
    shrink = Step()
    if (short or settled) and not halted:
        launching = set(launches.by_type) | set(starting) | {r.type_name for r in replacing}
        shrink = scale_down(
            facts,
            up.received,
            launching,
            launches.total + starting.total() + replaced,
            cordoned_only=not idle and not short,
        )
    shrink, held_back, begun = gate(facts, "empty", shrink, begun)  # budgets, do-not-disrupt (budgets.py)
    refills = refill(facts, shrink, launches.left - replaced) if idle else ()
    # The cost-aware pass runs only when nothing is pending: under load it took room the arriving tasks
    # needed while the expensive machine's long tasks ran on (measured: dearer and slower on a
    # heavy-tailed mix). Prices: the policy's of each allowed type, the catalogue's of a type no longer
    # allowed.
    prices: dict[str, float | None] = {}
    if idle:
        prices = {t.name: t.price_per_hour for t in snapshot.instance_types} | {
            o.name: o.price for o in options
        }
    actions, held_cordons = _assemble(
        facts,
        up,
        (launches, (*replacing, *refills)),
        (shrink, begun, cordoned_out),
        (settled, bool(halted)),
        (capacity, space, prices),
    )
    held_all = (*held_roll, *held_back, *held_cordons)
    result = Plan(_with_spec(actions, policy), unplaceable, demand.pending, up.placed, halted, held_all)
    if ledger is None:
        return result, None
    return result, Trace(demand.groups, up.bins, tuple(ledger), up.new_bins, capacity, space)


def _assemble(
    facts: Facts,
    up: Placement,
    launching: tuple[LaunchBook, tuple[Launch, ...]],
    shrinking: tuple[Step, int, tuple[Cordon, ...]],
    load: tuple[bool, bool],
    room: tuple[Mapping[str, Vec], Space, Mapping[str, float | None]],
) -> tuple[tuple[Action, ...], tuple[Held, ...]]:
    """The bookkeeping and repair steps, consolidation when it may run (`settled`: nothing is pending,
    or every pending task was placed on existing capacity), and every action in order. `halted`: the
    safety stop holds the termination of long-down machines too."""
    launches, refills = launching
    # (`begun`: the disruptions started, for the budgets; `rolling`: cordons of outdated machines)
    shrink, begun, rolling = shrinking
    settled, halted = load
    fixed = repair(facts, halted)
    pooled = repair_pool(facts)
    fixed = Step((*fixed.actions, *pooled.actions), fixed.marks, fixed.removed | pooled.removed)
    leaving = let_go(facts)
    marks = keep_marks(facts, up.received)
    rolled = {m.node.id for m in facts.cluster.active if m.node and not staying(m, facts.policy, facts.now)}
    stale, uncordon = keep_cordons(facts.cluster, {u.node_id for u in up.uncordon}, rolled)
    cordons: tuple[Action, ...] = ()
    held: tuple[Held, ...] = ()
    # Not while this plan undoes a cordon (a task waits on a cordoned worker) or brings a drained node
    # back for pending work (capacity is short there): one change at a time.
    quiet = settled and not launches and not refills and not up.uncordon and not uncordon and not up.activate
    if quiet and facts.policy.consolidate_below > 0:
        cordons, held = gate_actions(facts, "consolidation", _consolidate(facts, up, shrink, *room), begun)
    # First: any later decision on the same node overrides a restamp.
    changes = (
        *restamps(facts.snapshot),
        *up.marks,
        *fixed.marks,
        *marks,
        *stale,
        *shrink.marks,
        *leaving.marks,
    )
    steps: tuple[Action, ...] = (
        *accept_joined(facts.cluster, facts.policy.join_paused),
        *fixed.actions,
        *up.uncordon,
        *uncordon,
        *up.activate,
        *up.start,
        *launches.actions(),
        *refills,
        *rolling,
        *cordons,
        *leaving.actions,
        *shrink.actions,
    )
    updates, actions = node_updates(facts.snapshot, changes, label_nodes(facts.cluster), fixed.removed, steps)
    return (*updates, *actions), held


def _with_spec(actions: tuple[Action, ...], policy: Policy) -> tuple[Action, ...]:
    """Every launch labelled with its type's launch spec, so that drift can be told later (drift.py)."""
    specs = spec_labels(policy)
    return tuple(
        dataclasses.replace(a, labels=((SPEC_LABEL, specs[a.type_name]),))
        if isinstance(a, Launch) and a.type_name in specs
        else a
        for a in actions
    )


def _consolidate(
    facts: Facts,
    up: Placement,
    shrink: Step,
    capacity: Mapping[str, Vec],
    space: Space,
    prices: Mapping[str, float | None],
) -> tuple[Cordon, ...]:
    """Cordon under-used workers (see consolidate.py): never one that received pending tasks (whose
    room, given to that work, counts for no other either) or that this plan drains."""
    draining = {a.node_id for a in shrink.actions if isinstance(a, DrainNode)}
    base = base_keys(facts)  # the always-on base takes work: never cordoned
    candidates = [
        m
        for m in facts.cluster.active
        if m.workers
        and not m.cordoned
        and m.key not in up.received
        and m.node is not None
        and m.node.id not in draining
        and m.key not in base
    ]
    return tuple(
        choose_cordons(
            candidates,
            facts.demand.free,
            capacity,
            facts.policy.consolidate_below,
            space,
            prices,
            facts.now + facts.policy.tolerated_wait,
        )
    )
