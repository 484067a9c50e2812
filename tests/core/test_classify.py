"""classify(): one bucket per machine, the reserve, matching by hostname, and the transition table."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.builders import (
    NOW,
    assemble,
    machine,
    make_instance,
    make_node,
    make_policy,
    make_snapshot,
    make_task,
    unlabelled,
)

from swarm_autoscaler.core.cluster import OBSERVED, TRANSITIONS, TYPE_LABEL, Bucket, allowed, classify
from swarm_autoscaler.core.model import Availability, InstanceState, NodeMarks, NodeStatus, TypePolicy

POLICY = make_policy(max_start_time=600)


DRAIN = Availability.DRAIN


@pytest.mark.parametrize(
    ("parts", "bucket"),
    [
        ((make_instance(1, age=30), None, None), Bucket.LAUNCHED),
        ((make_instance(1, age=700), None, None), Bucket.BROKEN),
        ((make_instance(1, state=InstanceState.STOPPED), None, None), Bucket.BROKEN),
        ((make_instance(1, state=InstanceState.SHUTTING_DOWN), None, None), Bucket.TERMINATING),
        (machine(1, worker=False, marks=NodeMarks(), age=30), Bucket.JOINING),
        (machine(1, status=NodeStatus.UNKNOWN, marks=NodeMarks(), age=30), Bucket.JOINING),
        (machine(1, worker=False, marks=NodeMarks(), age=700), Bucket.BROKEN),
        (machine(1, marks=NodeMarks()), Bucket.ACTIVE),  # worker connected: accepted (planner marks it)
        (machine(1), Bucket.ACTIVE),
        (machine(1, worker=False), Bucket.ACTIVE),  # accepted before, worker gone: drained after a delay
        (machine(1, retiring=True), Bucket.RETIRING),
        (machine(1, availability=DRAIN, worker=False), Bucket.DRAINED),
        (machine(1, availability=Availability.PAUSE), Bucket.DRAINED),
        (machine(1, marks=NodeMarks(True, termination_started=NOW - 5)), Bucket.TERMINATING),
        (machine(1, status=NodeStatus.DOWN), Bucket.DISCONNECTED),
        (machine(1, status=NodeStatus.DISCONNECTED, availability=DRAIN), Bucket.DISCONNECTED),
        (machine(1, manager=True), Bucket.MANAGER),  # an owned instance never becomes a manager to scale
        ((None, make_node(1, manager=True), None), Bucket.MANAGER),
        ((None, make_node(1, marks=NodeMarks(), ours=False), None), Bucket.UNOWNED),
        # the plain instance-type label and the lifecycle marks prove no ownership, even on a down node
        (
            (None, make_node(1, status=NodeStatus.DOWN, labels={TYPE_LABEL: "m5.large"}, ours=False), None),
            Bucket.UNOWNED,
        ),
        ((None, make_node(1, marks=NodeMarks(), ours=True), None), Bucket.DISCONNECTED),  # our label
        ((None, make_node(1, status=NodeStatus.DOWN), None), Bucket.DISCONNECTED),
        # matched by hostname to an owned instance: the instance's, labelled or not
        (unlabelled(machine(1, worker=False, status=NodeStatus.DOWN)), Bucket.DISCONNECTED),
    ],
)
def test_each_machine_lands_in_one_bucket(parts: tuple[object, ...], bucket: Bucket) -> None:
    cluster = classify(assemble(parts), POLICY)  # type: ignore[arg-type]
    assert cluster.counts() == {b.value: int(b == bucket) for b in OBSERVED}


def test_reserve_keeps_the_newest_drained_nodes_per_type() -> None:
    snapshot = assemble(
        machine(1, availability=DRAIN, worker=False, age=900),
        machine(2, availability=DRAIN, worker=False, age=100),
        machine(3, availability=DRAIN, worker=False, age=500),
        machine(4, "m5.xlarge", availability=DRAIN, worker=False, age=50),
    )
    policy = make_policy(types=[TypePolicy("m5.large", reserve=2), TypePolicy("m5.xlarge")])
    cluster = classify(snapshot, policy)
    assert [m.key for m in cluster.reserve] == ["i-0002", "i-0003"]
    assert [m.key for m in cluster.drained] == ["i-0004", "i-0001"]
    assert cluster.counts_by_type() == {
        ("drained", "m5.large"): 1,
        ("drained", "m5.xlarge"): 1,
        ("reserve", "m5.large"): 2,
    }


def test_workers_and_nodes_are_matched_by_hostname_and_stale_node_entries_are_disconnected() -> None:
    inst, node, worker = machine(1, processing=[make_task("a")])
    stale = make_node(9, status=NodeStatus.DOWN, host=inst.hostname)
    cluster = classify(make_snapshot([inst], [stale, node], [worker]), POLICY)  # type: ignore[list-item]
    (active,) = cluster.active
    assert (active.node, active.workers, active.busy) == (node, (worker,), True)
    assert [m.node for m in cluster.disconnected] == [stale]


def test_the_transition_table_covers_every_bucket_and_is_closed() -> None:
    assert set(TRANSITIONS) == set(Bucket)
    for before, targets in TRANSITIONS.items():
        assert targets <= set(Bucket)
        assert Bucket.NEW not in targets
        assert allowed(before, before)
    assert not allowed(Bucket.ACTIVE, Bucket.LAUNCHED)
    assert not allowed(Bucket.GONE, Bucket.ACTIVE)
    assert not allowed(Bucket.UNOWNED, Bucket.TERMINATING)


def test_a_terminated_instance_counts_only_while_a_node_of_its_lingers() -> None:
    """EC2 lists terminated instances for about an hour. One whose machine joined as it was terminated
    keeps its node ours (terminating: removed once down); one without a node, or whose hostname a live
    instance took over, is left out."""
    gone = make_instance(1, state=InstanceState.TERMINATED)
    lingering = make_instance(2, state=InstanceState.TERMINATED)
    down = make_node(2, status=NodeStatus.DOWN, marks=NodeMarks(), ours=False)  # joined, never labelled
    reused_old = make_instance(3, state=InstanceState.TERMINATED)
    reused_new = replace(make_instance(4), hostname=reused_old.hostname)
    new_node = make_node(4, host=reused_old.hostname)
    snapshot = make_snapshot([gone, lingering, reused_old, reused_new], [down, new_node])
    cluster = classify(snapshot, POLICY)
    buckets = cluster.bucket_of()
    assert buckets == {"i-0002": Bucket.TERMINATING, "i-0004": Bucket.ACTIVE}
    assert [m.node for m in cluster.terminating] == [down]


def test_the_lingering_node_of_a_terminated_machine_is_labelled_ours_and_removed_once_down() -> None:
    from swarm_autoscaler.core.actions import NodeUpdate, RemoveNode
    from swarm_autoscaler.core.model import OWNERSHIP_LABEL
    from swarm_autoscaler.core.plan import plan

    labels = {OWNERSHIP_LABEL: "c", TYPE_LABEL: "m5.large"}
    inst = replace(make_instance(2, state=InstanceState.TERMINATED), labels=labels)
    down = make_node(2, status=NodeStatus.DOWN, marks=NodeMarks(), ours=False)
    actions = plan(make_snapshot([inst], [down]), POLICY).actions
    assert [type(a) for a in actions] == [NodeUpdate, RemoveNode], actions
    assert dict(actions[0].labels)[OWNERSHIP_LABEL] == "c"  # type: ignore[union-attr]
