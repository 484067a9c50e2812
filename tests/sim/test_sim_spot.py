"""Spot in the simulator: machines launched spot are billed at the spot fraction, EC2 gives notices at
the drawn rate and takes each machine 120 s later; the real planner lets an interrupted machine go and
replaces it, so every job completes, none of its disruptions count as busy, and EC2 takes no machine
the daemon still had (it retires, drains and terminates within the notice)."""

from __future__ import annotations

from swarm_autoscaler.config.settings import TimingSettings
from swarm_autoscaler_lab.sim.config import SimEc2Settings, SimSettings, build_sim_settings
from swarm_autoscaler_lab.sim.faults import RandomFaults
from swarm_autoscaler_lab.sim.runner import default_options, run_trace
from swarm_autoscaler_lab.sim.trace import Job

JOBS = tuple(Job(i, 30.0 * i, 1800.0, 1.0, 2.0, 0) for i in range(24))


def settings() -> SimSettings:
    ec2 = SimEc2Settings.model_validate({"allowed_types": {"m5.large": {}}, "max_instances": 8})
    return build_sim_settings(TimingSettings(poll_interval=10.0), ec2)


def test_spot_costs_the_fraction_and_interruptions_lose_no_job() -> None:
    st = settings()
    _, on_demand = run_trace(JOBS, st, "ours", default_options(st), RandomFaults(seed=1))
    spot = default_options(st, spot_price_factor=0.3)
    _, quiet = run_trace(JOBS, st, "ours", spot, RandomFaults(seed=1))
    _, stormy = run_trace(JOBS, st, "ours", spot, RandomFaults(seed=1, interruptions_per_hour=2.0))

    assert abs(quiet["cost_usd"] - 0.3 * on_demand["cost_usd"]) < 1e-3
    assert quiet["interruptions"] == 0
    assert stormy["interruptions"] >= 3, stormy
    assert stormy["completed_jobs"] == len(JOBS) and stormy["busy_terminations"] == 0
    assert stormy["reclaimed"] == 0, stormy  # let go within the notice every time
    assert stormy["task_restarts"] >= 1 and stormy["launches"] > quiet["launches"]
