"""The planner in a world where some of the last tick's actions took effect and some did not (the
deadline left them, or they failed): plan, carry out a random subset of the plan, plan again. The second
plan keeps every invariant, asks for no mark or label the node already carries (the node updates that
did take effect are not sent again), never exceeds the maximum, and retires no working worker."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.core.randomized import apply, policies, worlds

from swarm_autoscaler.core.actions import Launch, NodeUpdate, Plan, RetireWorkers
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Node, Policy, Snapshot
from swarm_autoscaler.core.plan import plan

FAST = settings(
    max_examples=min(80, settings.default.max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _carry_out_some(snapshot: Snapshot, first: Plan, took: list[bool]) -> Snapshot:
    """The snapshot after the actions flagged in `took` took effect (the others did not)."""
    done = Plan(tuple(a for a, yes in zip(first.actions, took, strict=False) if yes))
    after = apply(snapshot, done)
    labels = {a.node_id: dict(a.labels) for a in done.actions if isinstance(a, NodeUpdate) and a.labels}

    def labelled(node: Node) -> Node:
        if node.id not in labels:
            return node
        merged = {**node.labels, **labels[node.id]}
        # (a NodeUpdate carrying the ownership label makes its node ours, as the adapters read it)
        return dataclasses.replace(node, labels=merged, ours=node.ours or OWNERSHIP_LABEL in labels[node.id])

    return dataclasses.replace(after, nodes=tuple(labelled(n) for n in after.nodes))


@FAST
@given(worlds(), policies(), st.lists(st.booleans(), max_size=60))
def test_after_a_partly_carried_out_plan_nothing_already_true_is_asked_again(
    snapshot: Snapshot, policy: Policy, took: list[bool]
) -> None:
    first = plan(snapshot, policy)
    world = _carry_out_some(snapshot, first, took)
    second = plan(world, policy)
    nodes = {n.id: n for n in world.nodes}
    for action in second.actions:
        match action:
            case NodeUpdate(node_id=node_id, marks=marks, labels=labels):
                assert nodes[node_id].marks != marks, f"a mark the node already carries: {action}"
                held = {k for k, v in labels if nodes[node_id].labels.get(k) == v}
                assert not held, f"labels the node already carries: {action}"
    alive = sum(1 for i in world.instances if i.alive)
    launched = sum(a.count for a in second.actions if isinstance(a, Launch))
    if launched:
        assert alive + launched <= policy.max_instances
    working = {w.address for w in world.workers if w.processing}
    for action in second.actions:
        if isinstance(action, RetireWorkers):
            assert not working & set(action.addresses), action
