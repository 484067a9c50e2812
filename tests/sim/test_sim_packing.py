"""The simulated scheduler with the packing preload (`Knobs.dask_packing`): the same situations as
tests/adapters/dask/test_dask_packing.py runs on a real scheduler, with the same placements expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarm_autoscaler.core.model import GIB, Resources
from swarm_autoscaler_lab.sim import cli, table
from swarm_autoscaler_lab.sim.config import load_sim_settings
from swarm_autoscaler_lab.sim.scheduler import EventQueue, Scheduler, SimWorker, advertised
from swarm_autoscaler_lab.sim.trace import Job

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def worker(name: str, cpus: float, gpus: int = 0, type_name: str = "m5.xlarge") -> SimWorker:
    cap = Resources(cpus, 8 * GIB, gpus)
    return SimWorker(f"tcp://{name}:1", name, name, type_name, cap, cap)


def submit_all(packing: bool, workers: list[SimWorker], jobs: list[Job]) -> dict[str, int]:
    """Submit `jobs` (long ones) one after another at t=0; the processing count per worker name."""
    s = Scheduler({j.key: j for j in jobs}, EventQueue(), packing=packing)
    for w in workers:
        s.add_worker(w, 0.0)
    for j in jobs:
        s.submit(j.key, 0.0)
    return {w.name: w.nprocessing for w in workers}


def cpu_jobs(n: int, cpus: float = 1, first: int = 0, gpus: int = 0) -> list[Job]:
    return [Job(i, 0.0, 1000.0, cpus, 1.0, gpus, None) for i in range(first, first + n)]


def test_small_tasks_pack_onto_the_fullest_worker_that_fits() -> None:
    placed = submit_all(True, [worker("a", 4), worker("b", 4)], cpu_jobs(5))
    assert sorted(placed.values()) == [1, 4]


def test_without_packing_the_same_tasks_spread() -> None:
    placed = submit_all(False, [worker("a", 4), worker("b", 4)], cpu_jobs(4))
    assert sorted(placed.values()) == [2, 2]


def test_the_smallest_worker_that_fits_comes_first() -> None:
    jobs = [*cpu_jobs(3), *cpu_jobs(1, cpus=2, first=3)]
    assert submit_all(True, [worker("big", 8), worker("small", 2)], jobs) == {"big": 2, "small": 2}


def test_cpu_tasks_avoid_a_gpu_worker_while_a_cpu_worker_has_room() -> None:
    gpu, cpu = worker("gpu", 4, gpus=1, type_name="g4dn.xlarge"), worker("cpu", 4)
    jobs = [*cpu_jobs(4), *cpu_jobs(1, first=4, gpus=1), *cpu_jobs(1, first=5)]
    assert submit_all(True, [gpu, cpu], jobs) == {"gpu": 2, "cpu": 4}
    assert submit_all(False, [worker("gpu", 4, 1, "g4dn.xlarge"), worker("cpu", 4)], cpu_jobs(4)) == {
        "gpu": 2,
        "cpu": 2,
    }


def test_a_task_no_worker_can_start_now_falls_back_to_dasks_choice() -> None:
    a, b = worker("a", 2), worker("b", 2)
    assert sorted(submit_all(True, [a, b], cpu_jobs(5)).values()) == [2, 3]
    a, b = worker("a", 2), worker("b", 2)
    # the sixth goes to the worker of least occupancy per thread, not to the fuller one
    assert sorted(submit_all(True, [a, b], cpu_jobs(6)).values()) == [3, 3]


def test_used_resources_count_waiting_tasks_as_dask_does() -> None:
    big = cpu_jobs(2, cpus=3)  # on a 4-CPU worker: one runs, one waits (its needs do not fit beside it)
    w = worker("a", 4)
    s = Scheduler({j.key: j for j in [*big, *cpu_jobs(1, first=2)]}, EventQueue(), packing=True)
    s.add_worker(w, 0.0)
    for j in big:
        s.submit(j.key, 0.0)
    assert len(w.running) == 1 and len(w.waiting) == 1
    assert s._rank(advertised(Resources(1, 1 * GIB)), w) == (1, 0, 0.0, 0.0)  # CPU: 3 + 3 used of 4


def test_advertised_resources_follow_the_projects_names() -> None:
    assert advertised(Resources.of(4, 16 * GIB, 1, fpga=2)) == {
        "CPU": 4,
        "RAM": float(16 * GIB),
        "GPU": 1.0,
        "fpga": 2.0,
    }
    assert "GPU" not in advertised(Resources(2, GIB))


def test_the_cli_flag_reaches_the_knob() -> None:
    parser = cli.argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    trace = str(SCENARIOS / "heavy_tailed.csv")
    args = parser.parse_args(["simulate", "--trace", trace, "--dask-packing"])
    settings = load_sim_settings(SCENARIOS / "heavy_tailed.env")
    assert cli._options(args, settings).knobs.dask_packing
    off = parser.parse_args(["simulate", "--trace", trace])
    assert not cli._options(off, settings).knobs.dask_packing


def test_table_prints_each_policy_without_and_with_packing_and_checks_ours_with_it() -> None:
    def row(p95: float, cost: float) -> dict[str, Any]:
        return {"jobs": 1, "completed_jobs": 1, "wait_p50_s": 0.0, "wait_p95_s": p95, "cost_usd": cost,
                "cost_ratio": 1.1, "makespan_ratio": 1.0, "launches": 1, "peak_instances": 1,
                "busy_terminations": 0, "max_exceeded": 0}  # fmt: skip

    results = {"burst500": {"ours": row(30, 4.0), "ours+packing": row(5, 1.0), "adaptive": row(10, 2.0),
                            "adaptive+packing": row(9, 1.5), "static": row(5, 3.0)}}  # fmt: skip
    lines = table.packing_table(results).splitlines()
    assert lines[2:] == [
        "| burst500 | ours | 4.00 | 1.00 | 30 | 5 |",
        "| burst500 | adaptive | 2.00 | 1.50 | 10 | 9 |",
    ]
    assert table.misses(results, policy="ours+packing") == []
    assert any(m.startswith("burst500: adaptive costs 2.00") for m in table.misses(results))
    assert table.TABLE_POLICIES[-1] == "ours" + table.PACKING


def queued_gpu_jobs(packing: bool) -> dict[str, float]:
    """`python -m bench queued` replayed: four GPU jobs (4 CPU, 14 GiB, 1 GPU, 6 s) on one g4dn-like
    worker, a second joining at 2 s: each job's wait and how many ran on the newcomer."""
    jobs = {j.key: j for j in (Job(i, 0.0, 6.0, 4, 14, 1) for i in range(4))}
    events = EventQueue()
    s = Scheduler(jobs, events, packing=packing)
    cap = Resources(4, 16 * GIB, 1)
    s.add_worker(SimWorker("busy", "busy", "busy", "g4dn.xlarge", cap, cap), 0.0)
    for key in jobs:
        s.submit(key, 0.0)
    joined = False
    while (due := events.next_time()) is not None:
        if not joined and due > 2.0:
            s.add_worker(SimWorker("new", "new", "new", "g4dn.xlarge", cap, cap), 2.0)
            joined = True
            continue
        time, kind, payload = events.pop()
        if kind == "done":
            s.finish(*payload)
        elif kind == "balance":
            s.balance(time)
        else:
            s.move_waiting(time)
    waits = sorted(s.started_at.values())
    assert sorted(s.completed_at) == sorted(jobs)  # every job ran, and (one start each) once
    return {"p95": waits[-1], "makespan": max(s.completed_at.values()), "moved": s.moves}


def test_queued_gpu_jobs_move_to_a_gpu_worker_that_joins_only_with_the_preload() -> None:
    # Live (bench queued, distributed 2026.8): without the preload the p95 wait was 18.0 s and the
    # makespan 24.0 s, none on the newcomer; with it 9.0 s and 15.0 s, two moved, the first 0.3-0.5 s
    # after the join, the second when the newcomer's first finished (the busy one's second still ran).
    assert queued_gpu_jobs(False) == {"p95": 18.0, "makespan": 24.0, "moved": 0}
    assert queued_gpu_jobs(True) == {"p95": 9.0, "makespan": 15.0, "moved": 2}  # the same as live
