"""Work stealing as distributed 2026.8 does it (`distributed.stealing.WorkStealing.balance`), for tasks
without dependencies (all of a trace's): every stealable task is at cost level 0, so only occupancy
decides.

Every `BALANCE_INTERVAL` seconds (a "balance" event the scheduler schedules after any change):

- *thieves* are the running (not cordoned) workers that are unoccupied: fewer processing tasks than
  threads, or an occupancy below half their threads' share of the cluster's average occupancy per
  thread (`Scheduler.is_unoccupied`). No pass when there are none, or when every worker is one.
- *victims* are the saturated workers (more tasks than threads, and a backlog per thread above 0.4 s
  and 1.9 x the average per thread: `check_idle_saturated`), or else the ten most occupied workers
  with more tasks than threads, an occupancy above 0.2 s, and not thieves; most occupied first.
- each waiting task of a victim (executing ones refuse to move) goes to the least occupied valid thief
  (resource restrictions and pins are checked against the thief's total resources, not what it has
  free) when `thief + d <= victim - d / 2`, `d` its prefix duration; the thief stops stealing once it is
  no longer unoccupied.

No duration estimate is needed: an unknown prefix costs `unknown-task-duration` (or twice the longest
run so far), the same for every task of it, so a burst of one kind is shared by task counts. Measured
(tests/sim/test_sim_stealing.py): a worker that joins a burst of 40 on one worker steals 10 within a
second, the third 6-7, the fourth 5, long before any task finishes.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarm_autoscaler_lab.sim.scheduler import Scheduler, SimWorker
    from swarm_autoscaler_lab.sim.trace import Kind

_VICTIMS_WITHOUT_SATURATION = 10  # `topk(10, ...)`


def balance(s: Scheduler, now: float) -> int:
    """One stealing pass at `now`; returns how many tasks moved."""
    workers = list(s.workers.values())
    if not any(w.waiting for w in workers):
        return 0  # nothing can move: only tasks waiting on a worker are stolen (fast path, same result)
    durations = s.durations(now)
    occ = {w.address: w.occupancy(durations) for w in workers}
    threads = sum(w.nthreads for w in workers)
    average = sum(occ.values()) / threads  # `total_occupancy / total_nthreads`, fixed for the pass

    def unoccupied(w: SimWorker) -> bool:
        return w.nprocessing < w.nthreads or occ[w.address] < w.nthreads * average / 2

    thieves = {w.address: w for w in workers if not w.cordoned and unoccupied(w)}
    if not thieves or len(thieves) == len(workers):
        return 0
    victims = _victims(workers, occ, average, thieves)
    valid_for: dict[Kind, list[SimWorker]] = {}  # per prefix: the thieves that may run it
    moved = 0
    for victim in victims:
        for key in reversed(list(victim.waiting)):
            if not thieves:
                return moved
            kind = s.jobs[key].kind
            if kind not in valid_for:
                valid_for[kind] = [t for t in thieves.values() if s.valid(key, t)]
            valid = [t for t in valid_for[kind] if t.address in thieves]
            if not valid:
                continue
            thief = min(valid, key=lambda t: occ[t.address] / t.nthreads)
            d = durations[kind]
            if occ[thief.address] + d <= occ[victim.address] - d / 2:
                s.move(key, victim, thief, now)
                moved += 1
                occ[thief.address] += d
                occ[victim.address] -= d
                if not unoccupied(thief):
                    del thieves[thief.address]
    return moved


def _victims(
    workers: list[SimWorker], occ: dict[str, float], average: float, thieves: dict[str, SimWorker]
) -> list[SimWorker]:
    """The saturated workers, or else the ten most occupied loaded ones; most occupied first."""
    saturated = []
    for w in workers:
        p, nc = w.nprocessing, w.nthreads
        if w.cordoned or w.address in thieves or p <= nc:
            continue
        pending = occ[w.address] * (p - nc) / (p * nc)
        if pending > 0.4 and pending > 1.9 * average:
            saturated.append(w)
    if not saturated:
        top = heapq.nlargest(_VICTIMS_WITHOUT_SATURATION, workers, key=lambda w: occ[w.address])
        saturated = [
            w for w in top if occ[w.address] > 0.2 and w.nprocessing > w.nthreads and w.address not in thieves
        ]
    return sorted(saturated, key=lambda w: -occ[w.address])
