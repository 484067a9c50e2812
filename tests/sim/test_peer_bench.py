"""`python -m bench peer`'s pure parts: the issue's workloads, the alternation, medians, ratios, table."""

from __future__ import annotations

from bench.peer_bench import WAVE_GAP_S, markdown, order, summarize, workloads


def test_the_three_workloads_are_the_issues() -> None:
    shapes = {
        w.name: (len(w.jobs), {d for _, d, _ in w.jobs}, {c for _, _, c in w.jobs}, w.boot_s, w.max_instances)
        for w in workloads()
    }
    assert shapes == {
        "burst100": (100, {2.0}, {1}, 5.0, 10),
        "burst500": (500, {10.0}, {1}, 10.0, 40),
        "waves200": (400, {5.0}, {1}, 10.0, 20),
    }
    waves = next(w for w in workloads() if w.name == "waves200")
    assert sorted({at for at, _, _ in waves.jobs}) == [0.0, WAVE_GAP_S]
    assert sum(1 for at, _, _ in waves.jobs if at == 0.0) == 200
    assert all(w.jitter_s == 0.0 for w in workloads())  # the same boot time on both sides


def test_sides_alternate_which_runs_first() -> None:
    assert [order(rep) for rep in range(3)] == [
        ("ours", "adaptive"),
        ("adaptive", "ours"),
        ("ours", "adaptive"),
    ]


def test_medians_ratios_and_targets() -> None:
    def run(seconds: float, makespan: float) -> dict[str, float]:
        return {"instance_seconds": seconds, "makespan_s": makespan, "wait_p50_s": 1.0, "wait_p95_s": 2.0,
                "tail_s": 3.0, "machines": 4, "left_running": 0}  # fmt: skip

    row = summarize(
        {
            "ours": [run(100, 21), run(300, 20), run(110, 30)],  # medians 110 s and 21 s
            "adaptive": [run(100, 20), run(120, 20), run(90, 20)],  # medians 100 s and 20 s
        }
    )
    assert row["ours"]["figures"]["instance_seconds"] == {"median": 110, "min": 100, "max": 300}
    assert row["ratios"] == {"instance_seconds": 1.1, "makespan_s": 1.05}
    assert row["met"] == {"instance_seconds": False, "makespan_s": True}  # at most 1.05x is met
    lines = markdown({"burst100": row}).splitlines()
    assert lines[2] == "| burst100 | instance_seconds | 110 (100-300) | 100 (90-120) | 1.10 | <= 1: missed |"
    assert lines[3] == "| burst100 | makespan_s | 21 (20-30) | 20 (20-20) | 1.05 | <= 1.05: met |"
