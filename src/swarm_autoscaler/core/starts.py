"""When will a task waiting on a busy worker start there? Pure; used by `estimate_demand`.

A task the scheduler queued behind a busy worker counts as pending: a new machine could run it. But a
new machine only helps if the task would otherwise wait longer than the machine takes to serve it
(boot, join, worker start: about two minutes), and the operator may accept somewhat longer waits to
save money: `Policy.tolerated_wait` says how long. With the scheduler's duration estimates
(dask keeps one per task prefix), the worker's queue can be played forward: its running tasks end at
`started + expected`, and the waiting ones start in order (the head of the queue blocks the rest, as a
dask worker's constrained queue does) as soon as the freed resources fit them.

Unknown estimates are never guessed: a running task with no estimate, or running past it, frees nothing
in this reckoning, and a waiting task with no estimate never ends. So without estimates nothing counts
as starting soon, and the planner behaves as if this module did not exist.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from swarm_autoscaler.core.model import Resources, Task, Worker
from swarm_autoscaler.core.vectors import EPS

INF = float("inf")


def starting_soon(worker: Worker, waiting: Sequence[Task], now: float, within: float) -> int:
    """How many of `waiting` (the worker's processing tasks that do not fit at once, in queue order)
    are expected to start on `worker` within `within` seconds of `now`. Always a prefix of `waiting`."""
    if within <= 0.0 or not waiting:
        return 0
    waits = {id(t) for t in waiting}
    running = [t for t in worker.processing if id(t) not in waits]
    capacity = worker.resources
    cpus, ram, gpus = capacity.cpus, capacity.ram, capacity.gpus
    ends: list[tuple[float, int]] = []  # (end time, index into needs)
    needs: list[Resources] = []
    for task in running:
        n = task.needs
        cpus, ram, gpus = cpus - n.cpus, ram - n.ram, gpus - n.gpus
        end = _end(task.started, task.expected, now)
        if end < INF:
            ends.append((end, len(needs)))
            needs.append(n)
    heapq.heapify(ends)
    horizon = now + within
    soon = 0
    at = now  # queue order: no task starts before the one ahead of it
    for task in waiting:
        n = task.needs
        if n.generic:  # generic resources are not tracked here: stop reckoning
            return soon
        while n.cpus > cpus + EPS or n.ram > ram + EPS or n.gpus > gpus + EPS:
            if not ends:
                return soon
            at, index = heapq.heappop(ends)
            if at > horizon:
                return soon
            freed = needs[index]
            cpus, ram, gpus = cpus + freed.cpus, ram + freed.ram, gpus + freed.gpus
        soon += 1
        cpus, ram, gpus = cpus - n.cpus, ram - n.ram, gpus - n.gpus
        if task.expected is not None:
            heapq.heappush(ends, (at + task.expected, len(needs)))
            needs.append(n)
    return soon


def _end(started: float | None, expected: float | None, now: float) -> float:
    """When a running task is expected to end; INF when unknown or already overdue."""
    if started is None or expected is None:
        return INF
    end = started + expected
    return end if end >= now else INF
