"""The safety hunt's dynamic-mode worlds: random swarm service workloads with faults on, invariants checked
after every tick, 0 busy disruptions; a planted bug found and shrunk; and the hunt drawing these worlds
for a share of its seeds."""

from __future__ import annotations

import pytest

from swarm_autoscaler.core.actions import DrainNode, Plan
from swarm_autoscaler.core.model import Policy, Snapshot
from swarm_autoscaler.core.plan import plan as real_plan
from swarm_autoscaler_lab.sim import hunt
from swarm_autoscaler_lab.sim.hunt_services import check_services, generate_services, hunt_one

SEEDS = range(300)


@pytest.fixture(scope="module")
def results() -> dict[int, list[str]]:
    return {seed: check_services(generate_services(seed)) for seed in SEEDS}


def test_the_cases_cover_pins_gpus_unplaceable_constraints_scale_changes_and_faults() -> None:
    cases = [generate_services(s) for s in SEEDS]
    constraints = [c.spec.constraints for case in cases for c in case.changes]
    assert sum(any("instance-type==" in x for x in cs) for cs in constraints) > 100
    assert sum(any("zone==onprem" in x for x in cs) for cs in constraints) > 50
    assert sum(any(c.spec.gpus for c in case.changes) for case in cases) > 50
    assert sum(len({c.spec.name for c in case.changes}) < len(case.changes) for case in cases) > 100
    assert sum(bool(c.faults.refused_calls) for c in cases) > 200
    assert sum(bool(c.faults.never_join) for c in cases) > 150
    assert sum(bool(c.faults.restarts) for c in cases) > 150


@pytest.mark.timeout(300)
def test_no_busy_disruption_never_above_max_and_every_run_settles(results: dict[int, list[str]]) -> None:
    failing = [s for s, problems in results.items() if problems]
    assert not failing, f"{len(failing)} of {len(SEEDS)} seeds fail; shortest reproduction:\n" + "\n".join(
        hunt_one(failing[0])
    )


def drains_busy_nodes(snapshot: Snapshot, policy: Policy) -> Plan:
    """A planted bug: the real planner, plus draining every node that holds a service task."""
    base = real_plan(snapshot, policy)
    busy = {w.hostname for w in snapshot.workers if w.processing}
    extra = tuple(DrainNode(n.id, n.hostname, "bug") for n in snapshot.nodes if n.hostname in busy)
    return Plan(base.actions + extra, base.unplaceable, base.pending, base.placed)


def test_the_hunt_finds_a_planted_bug_and_shrinks_it_to_one_service() -> None:
    seed = next(s for s in SEEDS if any(not c.spec.constraints for c in generate_services(s).changes))
    problems = check_services(generate_services(seed), drains_busy_nodes)
    assert any("plan DrainNode on busy" in p for p in problems)
    assert any("busy disruption: drain set" in p for p in problems)  # the world lost a task
    (report,) = hunt_one(seed, drains_busy_nodes)
    assert report.startswith(f"seed {seed} (dynamic mode): ")
    assert sum(line.startswith("  service ") for line in report.splitlines()) == 1
    assert not any(line.startswith(("  refuse", "  never", "  restart")) for line in report.splitlines())


def test_the_hunt_draws_dynamic_mode_worlds_for_a_share_of_its_seeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seeds = range(200)
    dynamic = [s for s in seeds if hunt.is_dynamic(s)]
    print(f"{len(dynamic)} of {len(seeds)} hunt seeds draw dynamic-mode worlds")
    assert 30 < len(dynamic) < 70
    assert hunt.hunt(dynamic[:20]) == []  # the real planner: the dynamic cases, all safe
    assert hunt.main(["8", str(dynamic[0])]) == 0
    out = capsys.readouterr().out
    assert (
        f"8 seeds ({sum(hunt.is_dynamic(s) for s in range(dynamic[0], dynamic[0] + 8))} of them dynamic"
        in out
    )
