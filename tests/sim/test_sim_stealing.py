"""Work stealing pinned to what distributed 2026.8 did live.

Probes (in-process Scheduler, Client and Workers; tasks `resources={"CPU": 1}` sleeping, submitted before
any worker exists; workers `resources={"CPU": 2}`, `nthreads=2`, joining at a fixed interval; the
scheduler's `processing` per worker sampled every 0.5 s, in join order):

- 40 x 8 s, 4 workers 1.5 s apart: after each join 40 | 30 10 | 23 10 7 | 18 10 7 5 (each newcomer
  stole its share within a second, executing 2 tasks; no task had finished, no estimate existed).
- 80 x 90 s, 8 workers 6 s apart (the issue's probe): after the eighth joined 15 15 14 10 8 7 6 5.
"""

from __future__ import annotations

from swarm_autoscaler.core.model import Resources
from swarm_autoscaler_lab.sim.scheduler import EventQueue, Scheduler, SimWorker
from swarm_autoscaler_lab.sim.trace import Job


def probe(tasks: int, seconds: float, workers: int, gap: float) -> list[list[int]]:
    """Replay a probe in the simulated scheduler: processing per worker just before each next join."""
    jobs = {j.key: j for j in (Job(i, 0.0, seconds, 1, 0, 0) for i in range(tasks))}
    events = EventQueue()
    s = Scheduler(jobs, events)
    for key in jobs:
        s.submit(key, 0.0)

    def until(t: float) -> None:
        while (due := events.next_time()) is not None and due <= t:
            time, kind, payload = events.pop()
            if kind == "done":
                s.finish(*payload)
            else:
                s.balance(time)

    out = []
    cap = Resources(2, 0, 0)
    for k in range(workers):
        joined = 0.54 + k * gap  # the live joins' phase against the 1 s stealing period
        until(joined)
        s.add_worker(SimWorker(f"w{k}", f"w{k}", f"w{k}", "x", cap, cap), joined)
        until(joined + gap - 0.01)
        out.append([w.nprocessing for w in s.workers.values()])
        assert all(len(w.running) == 2 for w in s.workers.values())  # every worker executes 2 tasks
    assert not s.completed_at and s.estimates == {}  # all of it before any task finished
    return out


def test_each_newcomer_steals_its_share_of_a_burst_without_an_estimate() -> None:
    assert probe(40, 8.0, 4, 1.5) == [[40], [30, 10], [23, 10, 7], [18, 10, 7, 5]]  # live: the same


def test_the_issue_probe_ends_spread_as_live() -> None:
    last = probe(80, 90.0, 8, 6.0)[-1]
    live = [15, 15, 14, 10, 8, 7, 6, 5]
    assert sum(last) == 80 and max(abs(a - b) for a, b in zip(last, live, strict=True)) <= 1, last


def test_a_newcomer_steals_only_tasks_it_may_run() -> None:
    """Restrictions are checked against the thief's total resources (`valid_workers`), not its free
    ones: a 2-CPU worker takes none of a burst of 4-CPU tasks; a 4-CPU one (4 threads) steals while it
    has fewer tasks than threads and `thief + d <= victim - d / 2`: half of it."""
    jobs = {j.key: j for j in (Job(i, 0.0, 50.0, 4, 0, 0) for i in range(6))}
    events = EventQueue()
    s = Scheduler(jobs, events)
    big = Resources(4, 0, 0)
    s.add_worker(SimWorker("a", "a", "a", "x", big, big), 0.0)
    for key in jobs:
        s.submit(key, 0.0)
    small = Resources(2, 0, 0)
    s.add_worker(SimWorker("b", "b", "b", "x", small, small), 0.2)
    assert events.pop() == (1.0, "balance", None) and s.balance(1.0) == 0
    s.add_worker(SimWorker("c", "c", "c", "x", big, big), 1.5)
    assert events.pop() == (2.0, "balance", None) and s.balance(2.0) == 3
    assert [w.nprocessing for w in s.workers.values()] == [3, 0, 3]
