"""starting_soon: playing a busy worker's queue forward with the scheduler's duration estimates."""

from __future__ import annotations

from swarm_autoscaler.core.model import GIB, Resources, Task, Worker
from swarm_autoscaler.core.starts import starting_soon

NOW = 1000.0
M5_LARGE = Resources(2.0, 8 * GIB)


def soon(running: list[Task], waiting: list[Task], within: float) -> int:
    """starting_soon on an m5.large worker processing `running`, then `waiting` queued behind them."""
    worker = Worker("tcp://w:1", "w", "w", M5_LARGE, processing=(*running, *waiting))
    return starting_soon(worker, waiting, NOW, within)


def running(key: str, cpus: float, started: float | None, expected: float | None) -> Task:
    return Task(key, Resources(cpus, GIB), executing=True, started=started, expected=expected)


def waiting(key: str, cpus: float, expected: float | None = 100.0) -> Task:
    return Task(key, Resources(cpus, GIB), expected=expected)


def test_a_task_behind_one_that_ends_within_the_tolerated_wait_starts_soon() -> None:
    busy = [running("r", 2, started=NOW - 50, expected=100)]  # ends in 50 s
    assert soon(busy, [waiting("w", 2)], within=120) == 1
    assert soon(busy, [waiting("w", 2)], within=40) == 0


def test_without_an_estimate_nothing_starts_soon() -> None:
    unknown = [running("r", 2, started=NOW - 50, expected=None)]
    assert soon(unknown, [waiting("w", 2)], within=1e9) == 0
    not_started = [running("r", 2, started=None, expected=100)]
    assert soon(not_started, [waiting("w", 2)], within=1e9) == 0


def test_a_task_running_past_its_estimate_frees_nothing() -> None:
    overdue = [running("r", 2, started=NOW - 150, expected=100)]
    assert soon(overdue, [waiting("w", 2)], within=1e9) == 0


def test_the_queue_is_played_in_order_and_each_started_task_ends_later() -> None:
    busy = [running("r", 2, started=NOW - 90, expected=100)]  # ends in 10 s
    queue = [waiting("w1", 2, expected=100), waiting("w2", 2, expected=100), waiting("w3", 2)]
    # w1 starts at +10, w2 at +110 (when w1 ends), w3 at +210
    assert soon(busy, queue, within=10) == 1
    assert soon(busy, queue, within=109) == 1
    assert soon(busy, queue, within=110) == 2
    assert soon(busy, queue, within=210) == 3


def test_the_head_of_the_queue_blocks_the_rest() -> None:
    # one CPU free at +10; the head needs two, so the one-CPU task behind it waits too (FIFO)
    busy = [running("a", 1, started=NOW - 90, expected=100), running("b", 1, started=NOW, expected=100)]
    queue = [waiting("big", 2), waiting("small", 1)]
    assert soon(busy, queue, within=50) == 0
    assert soon(busy, queue, within=100) == 1  # b ends at +100: big starts
    assert soon(busy, queue, within=200) == 2  # big ends at +200: small starts


def test_a_waiting_task_without_an_estimate_never_ends() -> None:
    busy = [running("r", 2, started=NOW - 90, expected=100)]
    queue = [waiting("w1", 2, expected=None), waiting("w2", 2)]
    assert soon(busy, queue, within=1e9) == 1


def test_generic_resources_stop_the_reckoning_and_zero_turns_it_off() -> None:
    busy = [running("r", 2, started=NOW - 90, expected=100)]
    gpu_like = Task("g", Resources.of(2.0, GIB, 0, licence=1.0), expected=100)
    assert soon(busy, [gpu_like], within=1e9) == 0
    assert soon(busy, [waiting("w", 2)], within=0) == 0
