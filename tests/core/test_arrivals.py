"""What the daemon learns of the work between ticks (core/arrivals.py), fed snapshot by snapshot as the
daemon's loop and the simulator feed it (`Learner` wraps the pure planner; a stand-in planner records
what it is given)."""

from __future__ import annotations

import dataclasses

from tests.builders import NOW, assemble, machine, make_policy, make_tasks

from swarm_autoscaler.core.actions import Plan
from swarm_autoscaler.core.arrivals import ArrivalBook, Learner, expected_next, observe
from swarm_autoscaler.core.model import Arrivals, Policy, Snapshot


def at(t: float, *busy: int, idle: tuple[int, ...] = ()) -> Snapshot:
    """m5.large machines `busy` (each running a task) and `idle`, observed at NOW + t."""
    machines = [machine(n, processing=make_tasks(1, f"t{n}-")) for n in busy]
    machines += [machine(n) for n in idle]
    return dataclasses.replace(assemble(*machines), now=NOW + t)


def test_an_arrival_is_a_type_taking_work_on_one_more_machine_and_gaps_are_between_arrivals() -> None:
    book = ArrivalBook()
    steps = (
        at(0, 1),
        at(5, 1),
        at(300, idle=(1,)),
        at(600, 1),
        at(605, 1, 2),
        at(900, idle=(1, 2)),
        at(1205, 3),
    )
    for snapshot in steps:
        book = observe(book, snapshot)
    # arrivals at 0, 600 (the machine took work again), 605 (a second machine), 1205 (a new one)
    assert book.last["m5.large"] == NOW + 1205
    assert book.gaps["m5.large"] == (600.0, 5.0, 600.0)
    assert book.view()["m5.large"] == Arrivals(NOW + 1205, 600.0)


def test_the_next_arrival_is_the_typical_gap_away_or_as_long_again_as_nothing_came() -> None:
    assert expected_next(Arrivals(NOW - 300, 600.0), NOW) == 300.0
    assert expected_next(Arrivals(NOW - 900, 600.0), NOW) == 900.0  # overdue: nothing for 900 s
    assert expected_next(Arrivals(NOW - 50, 0.0), NOW) == 50.0  # one arrival seen only


def test_the_learner_plans_with_what_it_saw_and_only_with_idle_learning_on() -> None:
    given: list[Snapshot] = []

    def planner(snapshot: Snapshot, policy: Policy) -> Plan:
        given.append(snapshot)
        return Plan()

    learner = Learner(planner)
    learner(at(0, 1), make_policy())
    learner(at(600, 1, 2), make_policy())
    assert given[-1].arrivals == {"m5.large": Arrivals(NOW + 600, 600.0)}
    learner(at(605, 1, 2), dataclasses.replace(make_policy(), idle_learning=False))
    assert given[-1].arrivals == {}
