"""Safety hunting over 200 random seeds with faults on (refusals, never-join, restarts, arrivals at any
moment, spot interruption notices), invariants checked after every tick; and the shrinker on a planted
bug."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from swarm_autoscaler.core.actions import DrainNode, Plan
from swarm_autoscaler.core.model import Policy, Snapshot
from swarm_autoscaler.core.plan import plan as real_plan
from swarm_autoscaler_lab.sim import hunt

SEEDS = range(200)
SAFETY = ("busy", "> max", "plan retires", "plan ")


REACHED: Counter[str] = Counter()  # what the module's runs went through (hunt.check's `reached`)


@pytest.fixture(scope="module")
def results() -> dict[int, list[str]]:
    return {seed: hunt.check(hunt.generate(seed), reached=REACHED) for seed in SEEDS}


def test_the_runs_reach_queued_restricted_moves_and_spot_notices(results: dict[int, list[str]]) -> None:
    """The hunt protects these cases only if its runs go through them: queued GPU or pinned tasks that
    the packing preload moves to a machine that joined, and EC2's notices taking spot machines."""
    print(
        f"{REACHED['moved']} queued restricted tasks moved (in {REACHED['seeds_moved']} of {len(results)} "
        f"seeds), {REACHED['notices']} spot notices given (in {REACHED['seeds_noticed']} seeds)"
    )
    assert REACHED["seeds_moved"] >= 10 and REACHED["seeds_noticed"] >= 20


def _shrunk_report(seed: int) -> str:
    case = hunt.generate(seed)
    small = hunt.shrink(case, lambda c: bool(hunt.check(c)))
    return hunt.describe(small, hunt.check(small))


def test_generated_cases_inject_every_kind_of_fault() -> None:
    cases = [hunt.generate(s) for s in SEEDS]
    assert sum(bool(c.faults.refused_calls) for c in cases) > 150
    assert sum(bool(c.faults.never_join) for c in cases) > 100
    assert sum(bool(c.faults.restarts) for c in cases) > 100
    assert any(j.instance_type for c in cases for j in c.jobs) and any(j.gpus for c in cases for j in c.jobs)
    packed = sum(c.packing for c in cases)
    print(f"{packed} of {len(cases)} cases run dask with the packing preload")
    assert 60 < packed < 140
    spot = [c for c in cases if c.spot]
    print(
        f"{len(spot)} cases run spot machines, {sum(len(c.faults.interrupted) for c in spot)} notices drawn"
    )
    assert 40 < len(spot) < 100 and sum(bool(c.faults.interrupted) for c in spot) > 0.8 * len(spot)


@pytest.mark.timeout(300)
def test_never_a_busy_node_drained_or_terminated_and_never_above_max(results: dict[int, list[str]]) -> None:
    unsafe = [s for s, problems in results.items() if any(k in p for p in problems for k in SAFETY)]
    assert not unsafe, _shrunk_report(unsafe[0])


def test_every_job_completes_and_the_fleet_settles_with_nothing_leaked(results: dict[int, list[str]]) -> None:
    failing = [s for s, problems in results.items() if problems]
    assert not failing, (
        f"{len(failing)} of {len(SEEDS)} seeds fail; shortest reproduction:\n" + _shrunk_report(failing[0])
    )


class DrainsBusyNodes:
    """A planted bug: the real planner, plus draining every node whose worker runs a task."""

    name = "planted-bug"
    stops_when_done = False

    def new_planner(self) -> Any:
        def planner(snapshot: Snapshot, policy: Policy) -> Plan:
            base = real_plan(snapshot, policy)
            busy = {w.hostname for w in snapshot.workers if w.busy}
            extra = tuple(DrainNode(n.id, n.hostname, "bug") for n in snapshot.nodes if n.hostname in busy)
            return Plan(base.actions + extra, base.unplaceable, base.pending, base.placed)

        return planner


def test_hunt_finds_a_planted_bug_and_shrinks_it_to_one_job() -> None:
    reports = hunt.hunt(range(3), DrainsBusyNodes())
    assert len(reports) == 3
    first = reports[0]
    assert first.startswith("seed 0: ") and "plan DrainNode on busy" in first
    assert sum(line.startswith("  job at") for line in first.splitlines()) == 1
    assert not any(line.startswith(("  refuse", "  never", "  restart")) for line in first.splitlines())
