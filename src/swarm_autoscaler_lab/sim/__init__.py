"""The simulator: replay a workload trace against the real planner (or a baseline) on a virtual clock.

Modules: `trace` (the CSV format), `workloads` (synthetic traces with fixed seeds), `scheduler` (a
dask-like scheduler), `world` (simulated EC2 and swarm, and the daemon's ports onto them), `faults`
(random or scripted), `engine` (the discrete-event loop around `tick.run_tick`), `baselines` (queue
rule, Adaptive-like, static), `report` (metrics and lower bounds), `config` (the settings subset it
reads), `runner` (strategy by name), `cli` (`swarm-autoscaler simulate`), `plot` (timeline PNG),
`hunt` (safety hunting with shrinking) and `table` (the comparison table of docs/lab/results.md).
"""
