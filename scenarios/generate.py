"""Write the bundled scenarios: `NAME.csv` (the trace) and `NAME.env` (its settings) for each.

    .venv/bin/python scenarios/generate.py [OUT_DIR]

The generators and their fixed seeds live in `swarm_autoscaler_lab.sim.workloads`; running this again
rewrites identical files. Prints each scenario's lower bounds (`swarm_autoscaler_lab.sim.report`), which the
tables divide costs and makespans by.
"""

from __future__ import annotations

import sys
from pathlib import Path

from swarm_autoscaler_lab.sim.config import load_sim_settings
from swarm_autoscaler_lab.sim.report import cost_lb, makespan_lb
from swarm_autoscaler_lab.sim.trace import write_trace
from swarm_autoscaler_lab.sim.workloads import SCENARIOS


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, (generate, env) in SCENARIOS.items():
        jobs = generate()
        write_trace(out / f"{name}.csv", jobs)
        (out / f"{name}.env").write_text(env, encoding="utf-8")
        settings = load_sim_settings(out / f"{name}.env")
        print(
            f"{name}: {len(jobs)} jobs, lower bounds: cost ${cost_lb(jobs, settings.policy, settings.catalogue):.2f}"
            f" (fractional packing), makespan {makespan_lb(jobs):.0f} s"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
