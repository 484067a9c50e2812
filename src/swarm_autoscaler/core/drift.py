"""Drift and expiry: outdated machines replaced, replacement first. Pure; used by plan().

A machine is **drifted** when the launch spec it carries (the label `swarm-autoscaler.spec`, written at
launch from `TypePolicy.spec`: a hash of its type's AMI, boot script and capacity, the subnets and the
security groups) is not its type's current one: an operator changed the AMI for a security patch, say.
A machine launched before specs were written carries none and is not drifted (it cannot be told);
`max_machine_age` replaces it in time. A machine is **expired** when it is older than
`Policy.max_machine_age` (Karpenter's expireAfter).

Each outdated active machine whose workers run tasks, with no cordon yet, is rolled in ONE plan,
replacement first (an idle one is left to scale-down; replacing it would launch a machine nobody needs):
its workers are cordoned (no new task; running ones finish undisturbed) and one machine of its type is
launched for it, counted like any launch within `max_instances` (a machine the launch budget cannot
replace now waits for a later plan, uncordoned). The cordon is never undone for pending work (scale-up
places nothing on it, and a task waiting there is not a reason to uncordon it), so it empties and
scale-down drains and terminates it by its usual rules, never while it holds work. Every roll passes
the disruption gate (budgets.py) with its reason, "drift" or "expiry": the budgets bound how many roll
at once, and do-not-disrupt holds a machine as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

from swarm_autoscaler.core.actions import Cordon, Held, Launch, NodeOurs, NothingWaits
from swarm_autoscaler.core.budgets import gate
from swarm_autoscaler.core.cluster import Member
from swarm_autoscaler.core.model import Policy
from swarm_autoscaler.core.steps import Facts, Step

SPEC_LABEL = "swarm-autoscaler.spec"


def outdated(member: Member, policy: Policy, now: float) -> tuple[str, str]:
    """(reason, why) when `member`'s machine is drifted ("drift") or expired ("expiry"), else ("", "")."""
    inst = member.instance
    if inst is None:
        return "", ""
    tp = policy.type_policy(inst.type_name)
    carried = inst.labels.get(SPEC_LABEL)
    if tp is not None and tp.spec and carried is not None and carried != tp.spec:
        return "drift", f"{inst.id} was launched with spec {carried}; {inst.type_name}'s is now {tp.spec}"
    age = now - inst.launched_at
    if policy.max_machine_age > 0 and age > policy.max_machine_age:
        return "expiry", f"{inst.id} is {age:.0f}s old (max_machine_age {policy.max_machine_age:g}s)"
    return "", ""


def staying(member: Member, policy: Policy, now: float) -> bool:
    """False for an outdated machine already cordoned for its roll: its cordon is never undone."""
    cordoned = member.node is not None and member.node.marks.cordoned_since is not None
    return not (cordoned and outdated(member, policy, now)[0])


Roll = tuple[tuple[Cordon, ...], tuple[Launch, ...], tuple[Held, ...], int]


def roll(facts: Facts, room: int, begun: int) -> Roll:
    """(cordons, replacement launches, machines held, disruptions begun) for the outdated machines;
    at most `room` replacements (what the launch budget leaves)."""
    cordons: list[Cordon] = []
    held: list[Held] = []
    for reason in ("drift", "expiry"):
        candidates = [m for m in facts.cluster.active if _rollable(m, facts, reason)]
        planned = tuple(_cordon(m, facts, reason) for m in candidates)
        gated, held_now, begun = gate(facts, reason, Step(planned), begun)
        held += held_now
        cordons += [a for a in gated.actions if isinstance(a, Cordon)]
    cordons = cordons[: max(0, room)]
    by_type: dict[str, list[str]] = {}
    types = {m.node.id: m for m in facts.cluster.active if m.node is not None}
    for cordon in cordons:
        member = types[cordon.node_id]
        by_type.setdefault(member.type_name, []).append(member.key)
    launches = tuple(
        Launch(type_name, len(keys), f"{len(keys)} to replace {', '.join(keys)} first (drifted or expired)")
        for type_name, keys in by_type.items()
    )
    return tuple(cordons), launches, tuple(held), begun


def _rollable(member: Member, facts: Facts, reason: str) -> bool:
    """An outdated active machine whose workers run tasks (nothing waiting), not cordoned yet. An idle
    one is not replaced: scale-down removes it by its usual rules, or, kept by the minimum or a base,
    it is rolled once it works (replacing it idle would launch a machine nobody needs)."""
    node = member.node
    if node is None or not member.working or member.cordoned or node.marks.cordoned_since is not None:
        return False
    waiting = any(not t.executing for w in member.workers for t in w.processing)
    return not waiting and outdated(member, facts.policy, facts.now)[0] == reason


def _cordon(member: Member, facts: Facts, reason: str) -> Cordon:
    node = member.node
    assert node is not None
    why = outdated(member, facts.policy, facts.now)[1]
    expect = (NothingWaits(member.hostname), NodeOurs(node.id))
    return Cordon(
        node.id, node.hostname, tuple(w.address for w in member.workers), f"{reason}: {why}", expect
    )


def spec_labels(policy: Policy) -> Mapping[str, str]:
    """Type -> the spec a new machine of it is launched with (types that track one)."""
    return {tp.name: tp.spec for tp in policy.allowed_types if tp.spec}
