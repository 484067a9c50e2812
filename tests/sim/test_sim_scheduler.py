"""The dask-like scheduler: restrictions, unrunnable tasks, queues in `processing`, stealing, loss."""

from __future__ import annotations

from dataclasses import replace

from swarm_autoscaler.core.model import GIB, Resources, Worker
from swarm_autoscaler_lab.sim.scheduler import EventQueue, Scheduler, SimWorker, set_order
from swarm_autoscaler_lab.sim.trace import Job


def make(*jobs: Job) -> tuple[Scheduler, EventQueue]:
    events = EventQueue()
    return Scheduler({j.key: j for j in jobs}, events), events


def worker(
    name: str, type_name: str = "m5.large", cpus: float = 2, ram_gib: float = 8, gpus: int = 0
) -> SimWorker:
    cap = Resources(cpus, round(ram_gib * GIB), gpus)
    return SimWorker(f"tcp://{name}:1", name, name, type_name, cap, cap)


def job(
    i: int, cpus: float = 1, ram: float = 1, gpus: int = 0, pin: str | None = None, d: float = 100
) -> Job:
    return Job(i, 0.0, d, cpus, ram, gpus, pin)


def next_done(s: Scheduler, events: EventQueue) -> tuple[float, str, tuple[str, str, float]]:
    """Pop events up to the next completion, running the stealing passes met on the way."""
    while True:
        time, kind, payload = events.pop()
        if kind == "done":
            return time, kind, payload
        assert kind == "balance"
        s.balance(time)


def processing(s: Scheduler, address: str, now: float = 0.0) -> list[str]:
    return [t.key for w in s.view(now).workers if w.address == address for t in w.processing]


def test_task_no_worker_can_take_stays_unrunnable_until_a_fitting_worker_joins() -> None:
    gpu_job = job(0, cpus=2, ram=8, gpus=1)
    s, _ = make(gpu_job)
    s.add_worker(worker("a"), 0.0)
    s.submit(gpu_job.key, 0.0)
    assert [t.key for t in s.view(0.0).unrunnable] == [gpu_job.key]
    s.add_worker(worker("g", "g4dn.xlarge", cpus=4, ram_gib=16, gpus=1), 5.0)
    assert s.view(0.0).unrunnable == ()
    assert processing(s, "tcp://g:1") == [gpu_job.key]
    assert s.started_at[gpu_job.key] == 5.0


def test_restricted_tasks_wait_in_processing_on_a_busy_worker() -> None:
    jobs = [job(i, cpus=2) for i in range(3)]
    s, events = make(*jobs)
    s.add_worker(worker("a"), 0.0)
    for j in jobs:
        s.submit(j.key, 0.0)
    # one runs (2 CPUs), two wait on the same worker: the scheduler lists all three as processing
    assert sorted(processing(s, "tcp://a:1")) == [j.key for j in jobs]
    assert s.running_count() == 1 and s.waiting_count() == 2 and s.view(0.0).unrunnable == ()
    time, kind, (address, key, end) = next_done(s, events)
    assert (time, kind, key) == (100.0, "done", jobs[0].key)
    s.finish(address, key, end)
    assert s.completed_at == {jobs[0].key: 100.0} and s.started_at[jobs[1].key] == 100.0


def test_pinned_task_goes_only_to_its_type() -> None:
    pinned = job(0, pin="c5.large")
    s, _ = make(pinned)
    s.add_worker(worker("m"), 0.0)
    s.submit(pinned.key, 0.0)
    assert [t.key for t in s.view(0.0).unrunnable] == [pinned.key]
    assert s.view(0.0).unrunnable[0].pinned_type == "c5.large"
    s.add_worker(worker("c", "c5.large", ram_gib=4), 1.0)
    assert processing(s, "tcp://c:1") == [pinned.key]


def test_a_burst_piles_onto_the_first_worker_and_a_newcomer_steals_without_an_estimate() -> None:
    """Live (distributed 2026.8, 40 x 8 s tasks with resources={"CPU": 1}, workers CPU: 2 and 2 threads
    joining 1.5 s apart): the first worker took all 40, the second stole 10 at the next stealing pass
    (under a second after joining, no task finished, no estimate). Here: 5 tasks of 2 CPUs on 2-CPU
    workers; at b's pass the prefix costs twice the longest run so far (2 x 11 s); b steals while
    `b + d <= a - d / 2` and it is idle (fewer tasks than threads, or below half the average): 2 tasks."""
    jobs = [job(i, cpus=2, d=100) for i in range(5)]
    s, events = make(*jobs)
    for j in jobs:
        s.submit(j.key, 0.0)
    assert len(s.view(0.0).unrunnable) == 5
    s.add_worker(worker("a"), 10.0)
    assert len(processing(s, "tcp://a:1")) == 5  # the whole burst lands on the first worker
    assert events.pop() == (11.0, "balance", None)
    assert s.balance(11.0) == 0  # a alone: no thief
    s.add_worker(worker("b"), 20.3)
    assert processing(s, "tcp://b:1") == []  # nothing until the next stealing pass
    assert events.pop() == (21.0, "balance", None)
    assert s.duration(jobs[0].kind, 21.0) == 22.0 and s.estimate(jobs[0].key) is None
    assert s.balance(21.0) == 2  # stolen without an estimate
    assert len(processing(s, "tcp://b:1")) == 2 and s.running_count() == 2 and s.waiting_count() == 3


def test_a_task_running_past_twice_the_estimate_makes_it_unknown_again() -> None:
    jobs = [job(0, cpus=2, d=10), job(1, cpus=2, d=500), job(2, cpus=2, d=10), job(3, cpus=2, d=10)]
    s, events = make(*jobs)
    s.add_worker(worker("a"), 0.0)
    s.add_worker(worker("b"), 0.0)
    s.submit(jobs[0].key, 0.0)  # on a
    s.submit(jobs[1].key, 0.0)  # on b, runs 500 s
    _, _, (address, key, end) = next_done(s, events)
    s.finish(address, key, end)  # job 0 done at 10: estimate 10 s
    assert [t.expected for w in s.view(15.0).workers for t in w.processing] == [10.0]  # b's task
    for j in jobs[2:]:
        s.submit(j.key, 30.0)  # a takes one, the other queues (on the least loaded: a again)
    assert s.waiting_count() == 1
    s.add_worker(worker("c"), 31.0)  # b's task has run 31 s > 2 x 10 s: the estimate is unknown
    assert processing(s, "tcp://c:1", 31.0) == [] and s.estimate(jobs[0].key) is None
    assert {t.expected for w in s.view(31.0).workers for t in w.processing} == {None}


def test_each_kind_of_job_has_its_own_estimate() -> None:
    small, big, small2 = job(0, cpus=1, d=10), job(1, cpus=2, d=50), job(2, cpus=1, d=30)
    s, events = make(small, big, small2)
    s.add_worker(worker("a", "m5.xlarge", cpus=4, ram_gib=16), 0.0)
    for j in (small, big, small2):
        s.submit(j.key, 0.0)
    _, _, (address, key, end) = next_done(s, events)
    s.finish(address, key, end)  # the first small job: 10 s
    assert s.estimate(small2.key) == 10.0 and s.estimate(big.key) is None
    view = {t.key: t for w in s.view(end).workers for t in w.processing}
    assert view[small2.key].expected == 10.0 and view[big.key].expected is None


def test_removed_worker_releases_its_tasks_which_restart_elsewhere() -> None:
    jobs = [job(0), job(1)]
    s, _ = make(*jobs)
    s.add_worker(worker("a"), 0.0)
    for j in jobs:
        s.submit(j.key, 0.0)
    assert s.remove_worker("tcp://a:1", 50.0) == 2
    assert s.restarts == 2 and len(s.view(0.0).unrunnable) == 2 and not s.started_at
    s.add_worker(worker("b"), 60.0)
    assert s.started_at == {jobs[0].key: 60.0, jobs[1].key: 60.0}
    s.finish("tcp://a:1", jobs[0].key, 100.0)  # a stale completion from the lost worker is ignored
    assert not s.completed_at


def listed(w: SimWorker, hash_seed: int = 0) -> list[str]:
    """`w`'s processing tasks in the order dask's set of them iterates (see `set_order`)."""
    return sorted((*w.running, *w.waiting), key=lambda k: set_order(k, hash_seed))


def test_the_view_lists_processing_tasks_in_set_order_not_running_first() -> None:
    """dask keeps a worker's processing tasks in a set hashed by key, and the daemon's adapter lists
    them in that order (tests/adapters/dask: `test_processing_tasks_are_listed_in_set_order`): a task
    waiting on its worker can come before the ones running there. The view does the same, with a
    fixed order per key for a given hash seed (one per simulated run)."""
    jobs = [job(i) for i in range(8)]
    s, events = make(*jobs)
    s.add_worker(worker("a"), 0.0)
    for j in jobs:
        s.submit(j.key, 0.0)
    a = s.workers["tcp://a:1"]
    assert list(a.running) == [jobs[0].key, jobs[1].key]  # the worker runs them in priority order ...
    view = s.view(0.0).workers[0]
    assert [t.key for t in view.processing] == listed(a)  # ... but they are listed in set order
    flags = [t.executing for t in view.processing]
    assert sorted(flags) == [False] * 6 + [True] * 2 and flags != sorted(
        flags, reverse=True
    )  # not running first
    assert sorted(jobs, key=lambda j: set_order(j.key, 1)) != sorted(jobs, key=lambda j: set_order(j.key, 0))
    _, _, (address, key, end) = next_done(s, events)
    s.finish(address, key, end)  # a task that starts keeps its place: the order is the keys'
    after = [t.key for t in s.view(end).workers[0].processing]
    assert after == [k for k in listed(a) if k != key] == [k for k in listed(a, 0) if k in after]


def test_cached_view_always_equals_a_fresh_one() -> None:
    jobs = [job(i, cpus=1 + i % 2, d=10 + i) for i in range(12)]
    s, events = make(*jobs)
    for i, j in enumerate(jobs):
        s.submit(j.key, float(i))
        if i == 3:
            s.add_worker(worker("a"), 3.0)
        if i == 7:
            s.add_worker(worker("b", "m5.xlarge", cpus=4, ram_gib=16), 7.0)
        if i == 9:
            s.remove_worker("tcp://a:1", 9.0)
        assert_fresh(s, float(i))
    while s.running_count():
        _, _, (address, key, end) = next_done(s, events)
        s.finish(address, key, end)
        b = s.workers["tcp://b:1"]
        assert [t.key for t in s.view(end).workers[0].processing] == listed(b)
        assert [t.executing for t in s.view(end).workers[0].processing] == [k in b.running for k in listed(b)]
        assert_fresh(s, end)
    assert len(s.completed_at) == 12


def assert_fresh(s: Scheduler, now: float) -> None:
    """The cached view equals one built from scratch (estimate, start times and all)."""
    view = s.view(now)
    fresh = tuple(
        Worker(
            w.address,
            w.name,
            w.hostname,
            w.capacity,
            tuple(
                replace(s.tasks[k], executing=True, started=s.started_at[k], expected=s.estimate(k))
                if k in w.running
                else replace(s.tasks[k], expected=s.estimate(k))
                for k in listed(w)
            ),
            retiring=w.cordoned,
        )
        for w in s.workers.values()
    )
    assert view.workers == fresh
    assert view.unrunnable == tuple(s.tasks[k] for k in s.unrunnable)


def test_a_cordoned_worker_gets_no_new_task_and_finishes_its_running_ones() -> None:
    jobs = [job(0, d=5), *(job(i, d=10) for i in range(1, 4))]
    s, events = make(*jobs)
    s.add_worker(worker("a"), 0.0)
    s.add_worker(worker("b"), 0.0)
    s.submit(jobs[0].key, 0.0)  # both idle: goes to a (first of the least loaded)
    assert processing(s, "tcp://a:1") == [jobs[0].key]
    assert s.cordon("tcp://a:1", True, 1.0) and s.view(0.0).workers[0].retiring
    for j in jobs[1:]:
        s.submit(j.key, 1.0)
    assert processing(s, "tcp://a:1") == [jobs[0].key]  # nothing new for the cordoned worker
    assert sorted(processing(s, "tcp://b:1")) == sorted(j.key for j in jobs[1:])
    _, _, (address, key, end) = next_done(s, events)
    s.finish(address, key, end)
    assert key == jobs[0].key and processing(s, "tcp://a:1") == []  # its running task finished
    assert s.cordon("tcp://a:1", False, 6.0) and not s.view(0.0).workers[0].retiring
    assert processing(s, "tcp://a:1") == [] and events.pop() == (6.0, "balance", None)
    assert s.balance(6.0) == 1 and processing(s, "tcp://a:1") == [jobs[3].key]  # it steals b's waiting
    assert not s.cordon("tcp://gone:1", True, 12.0)
