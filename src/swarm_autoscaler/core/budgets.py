"""Disruption budgets and do-not-disrupt: the one gate every voluntary disruption passes. Pure.

plan() hands each step's disruptive actions to `gate` with their reason: "empty" (scale-down of idle
machines: retire, drain, terminate or stop), "consolidation" (cordons of under-used workers), "drift"
and "expiry" (replacements of outdated or old machines). Which actions are disruptive is the table of
kinds' say (`core.kinds`, shared with act). Interruptions (EC2 takes the machine anyway) and repairs
(machines that never joined, nodes long down or gone) are exempt and never pass here.

- **do-not-disrupt.** A machine whose node carries the label `swarm-autoscaler.do-not-disrupt=true`,
  or whose worker runs or queues a task annotated `do_not_disrupt` (dask: `with
  dask.annotate(do_not_disrupt=True)`), is never retired, drained, cordoned, stopped or terminated for
  any of these reasons; for a task, until it finishes.
- **Budgets.** For each reason, the active budgets that name it (`Policy.budgets`, in their time
  window) bound how many machines are in disruption at once: the smallest of their `nodes`, or
  `share` of our nodes rounded up. As in Karpenter, machines in disruption count whatever their
  reason: those retiring, drained beyond the reserve, terminating with their node still ready, or
  cordoned, plus those this plan already started for another reason. A plan starts at most the
  difference; each machine beyond it keeps every action of its disruption (and the marks they would
  write) held back, in plan order. Continuing a disruption already counted (terminating a drained
  machine, draining a cordoned one) is never held by a budget.

Held machines are reported in `Plan.held` (the daemon exposes `autoscaler_disruptions_held`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from swarm_autoscaler.core.actions import (
    Action,
    Cordon,
    DrainNode,
    Held,
    RemoveNode,
    RetireWorkers,
    Stop,
    Terminate,
)
from swarm_autoscaler.core.cluster import OBSERVED, Member
from swarm_autoscaler.core.kinds import kind_of
from swarm_autoscaler.core.model import Budget, NodeStatus, Policy
from swarm_autoscaler.core.safety import unready
from swarm_autoscaler.core.steps import Facts, Step

REASONS = ("empty", "consolidation", "drift", "expiry")
DO_NOT_DISRUPT_LABEL = "swarm-autoscaler.do-not-disrupt"
DO_NOT_DISRUPT_ANNOTATION = "do_not_disrupt"


def protected(member: Member) -> str:
    """Why `member` may not be disrupted ("" when it may)."""
    node = member.node
    if node is not None and node.labels.get(DO_NOT_DISRUPT_LABEL, "").lower() == "true":
        return f"its node carries {DO_NOT_DISRUPT_LABEL}=true"
    keys = [t.key for w in member.workers for t in w.processing if t.do_not_disrupt]
    if keys:
        return f"it runs {len(keys)} task(s) annotated {DO_NOT_DISRUPT_ANNOTATION} ({', '.join(keys[:3])})"
    return ""


def in_window(budget: Budget, now: float) -> bool:
    """Whether `budget` applies at `now` (epoch seconds, read in UTC)."""
    day = math.floor(now / 86400)
    weekday = (day + 3) % 7  # 1970-01-01 was a Thursday (Monday is 0)
    if budget.days and weekday not in budget.days:
        return False
    return budget.start <= now - day * 86400 < budget.end


def allowed(policy: Policy, reason: str, fleet: int, now: float) -> int | None:
    """Machines that may be in disruption for `reason` at once (None: no active budget bounds it)."""
    limits = []
    for budget in policy.budgets:
        if reason not in budget.reasons or not in_window(budget, now):
            continue
        if budget.nodes is not None:
            limits.append(budget.nodes)
        if budget.share is not None:
            limits.append(math.ceil(budget.share * fleet - 1e-9))
    return min(limits) if limits else None


def in_flight(facts: Facts) -> int:
    """Machines already in disruption, whatever the reason (see the module docstring)."""
    cluster = facts.cluster
    ending = [m for m in cluster.terminating if m.node is not None and m.node.status == NodeStatus.READY]
    cordoned = [m for m in cluster.active if m.node is not None and m.node.marks.cordoned_since is not None]
    return len(cluster.retiring) + len(cluster.drained) + len(ending) + len(cordoned)


class _Hosts:
    """The host each action of a plan disrupts, and the member there."""

    def __init__(self, facts: Facts) -> None:
        snapshot = facts.snapshot
        self.of_instance = {i.id: i.hostname for i in snapshot.instances}
        self.of_worker = {w.address: w.hostname for w in snapshot.workers}
        self.members: Mapping[str, Member] = {
            m.hostname: m for b in OBSERVED for m in facts.cluster.bucket(b)
        }

    def host(self, action: Action) -> str:
        match action:
            case RetireWorkers(addresses=addresses):
                return next((self.of_worker[a] for a in addresses if a in self.of_worker), "")
            case DrainNode(hostname=h) | Cordon(hostname=h) | RemoveNode(hostname=h):
                return h
            case Terminate(instance_ids=ids) | Stop(instance_ids=ids):
                return next((self.of_instance[i] for i in ids if i in self.of_instance), "")
        return ""


def _starts(action: Action, member: Member | None) -> bool:
    """Whether `action` begins a machine's disruption (rather than continue one already counted)."""
    if isinstance(action, Cordon):
        return True
    continuing = (
        member is not None and member.node is not None and member.node.marks.cordoned_since is not None
    )
    return isinstance(action, RetireWorkers | DrainNode) and not continuing


def gate(facts: Facts, reason: str, step: Step, begun: int = 0) -> tuple[Step, tuple[Held, ...], int]:
    """`step` (planned for `reason`) without the disruptions of protected machines and of those beyond
    the reason's budget, the machines held, and how many disruptions the plan has started with these
    (`begun`: those it started for other reasons before). A held machine's marks are held with its
    actions."""
    hosts = _Hosts(facts)
    disruptive = [(a, hosts.host(a)) for a in step.actions if kind_of(a).disruptive]
    limit = allowed(facts.policy, reason, unready(facts.cluster)[1], facts.now)  # share of our nodes
    room = None if limit is None else max(0, limit - in_flight(facts) - begun)
    held: dict[str, Held] = {}
    started: list[str] = []
    for action, host in disruptive:
        member = hosts.members.get(host)
        if host in held or host in started:
            continue
        why = protected(member) if member is not None else ""
        if why:
            held[host] = Held(host, reason, "do-not-disrupt", why)
        elif _starts(action, member):
            if limit is not None and room is not None and len(started) >= room:
                already = limit - room + len(started)
                why = f"the {reason} budget allows {limit} machine(s) in disruption at once; {already} already are"
                held[host] = Held(host, reason, "budget", why)
            else:
                started.append(host)
    count = begun + len(started)
    if not held:
        return step, (), count
    keep = tuple(a for a in step.actions if not (kind_of(a).disruptive and hosts.host(a) in held))
    nodes = _held_nodes(hosts, held)
    marks = tuple(m for m in step.marks if m.node_id not in nodes)
    return Step(keep, marks, step.removed - nodes), tuple(held.values()), count


def _held_nodes(hosts: _Hosts, held: Iterable[str]) -> frozenset[str]:
    out = set()
    for host in held:
        member = hosts.members.get(host)
        if member is not None and member.node is not None:
            out.add(member.node.id)
    return frozenset(out)


def gate_actions(
    facts: Facts, reason: str, actions: Sequence[Action], begun: int = 0
) -> tuple[tuple[Action, ...], tuple[Held, ...]]:
    """`gate` for a step that is only actions (consolidation's cordons)."""
    gated, held, _ = gate(facts, reason, Step(tuple(actions)), begun)
    return gated.actions, held
