"""Placement details: the estimated queue with generic resources, and fitting arithmetic."""

from __future__ import annotations

from tests.builders import make_policy, make_snapshot

from swarm_autoscaler.core.demand import estimate_demand
from swarm_autoscaler.core.model import GIB, Resources, Task, Worker
from swarm_autoscaler.core.placement import Unplaced, rank_types
from swarm_autoscaler.core.vectors import Space, fit_count


def licensed(key: str) -> Task:
    return Task(key, Resources.of(0.5, GIB, licence=1))


def test_generic_resources_limit_the_queue_and_make_tasks_unplaceable() -> None:
    worker = Worker(
        "tcp://w:1", "w", "w", Resources.of(4, 8 * GIB, licence=1), (licensed("a"), licensed("b"))
    )
    snapshot = make_snapshot(workers=[worker])
    policy = make_policy()
    space, demand = estimate_demand(snapshot, policy)
    assert space.names == ("licence",)
    assert demand.queued == {"tcp://w:1": 1}
    assert demand.free["tcp://w:1"] == (3.5, 7 * GIB, 0.0, 0.0)
    assert [g.keys for g in demand.groups] == [("b",)]
    unplaced = Unplaced(demand.groups)
    (unplaceable,) = unplaced.drop_unplaceable(rank_types(snapshot, policy, space), policy)
    assert unplaceable.task_key == "b" and "more than any allowed instance type" in unplaceable.reason
    assert unplaced.left == 0


def test_fit_count_is_exact_on_fractional_cpus_and_unbounded_for_zero_needs() -> None:
    space = Space(())
    assert fit_count(space.vec(Resources(0.1, 0)), space.vec(Resources(0.3, 0))) == 3
    assert fit_count(space.vec(Resources(1, GIB)), space.vec(Resources(8, 3 * GIB))) == 3
    assert fit_count(space.vec(Resources(2, 0)), space.vec(Resources(1, GIB))) == 0
    assert fit_count(space.zero, space.vec(Resources(1, GIB))) > 10**9


def test_identical_bins_split_when_a_group_runs_out() -> None:
    space = Space(())
    snapshot = make_snapshot(unrunnable=[Task(f"t{i}", Resources(1, GIB)) for i in range(5)])
    _, demand = estimate_demand(snapshot, make_policy())
    unplaced = Unplaced(demand.groups)
    got = unplaced.fill([(f"b{i}", "m5.large", space.vec(Resources(2, 8 * GIB))) for i in range(4)])
    assert got == {"b0": 2, "b1": 2, "b2": 1} and unplaced.left == 0


M5_2XLARGE = Resources(8, 32 * GIB)


def test_executing_tasks_are_fitted_first_whatever_the_order_dask_lists_them_in() -> None:
    # dask lists a worker's processing tasks in set order: here a waiting 8-CPU task comes before the
    # four 1-CPU tasks running beside it. Only the big task waits; the small ones hold their CPUs.
    small = [Task(f"s{i}", Resources(1, GIB), executing=True, started=990.0, expected=3.0) for i in range(4)]
    big = Task("big", Resources(8, GIB), expected=5.0)
    for order in ((big, *small), (*small, big), (small[0], big, *small[1:])):
        worker = Worker("tcp://w:1", "w", "w", M5_2XLARGE, order)
        _, demand = estimate_demand(make_snapshot(workers=[worker]), make_policy())
        assert demand.queued == {"tcp://w:1": 1}
        assert [g.keys for g in demand.groups] == [("big",)]
        assert demand.free["tcp://w:1"][:2] == (4.0, 28 * GIB)


def test_waiting_tasks_keep_their_listed_order_behind_the_executing_ones() -> None:
    running = Task("r", Resources(6, GIB), executing=True, started=990.0, expected=30.0)
    first, second = Task("a", Resources(2, GIB)), Task("b", Resources(2, GIB))
    worker = Worker("tcp://w:1", "w", "w", M5_2XLARGE, (first, running, second))
    _, demand = estimate_demand(make_snapshot(workers=[worker]), make_policy())
    assert demand.queued == {"tcp://w:1": 1}  # "a" fits in the 2 CPUs left; "b", listed after it, waits
    assert [g.keys for g in demand.groups] == [("b",)]
