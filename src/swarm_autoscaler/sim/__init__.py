"""The simulator: replay a workload trace against the real planner (or a baseline) on a virtual clock.

    trace.py      the CSV trace format             workloads.py  synthetic traces with fixed seeds
    scheduler.py  a dask-like scheduler            world.py      simulated EC2 + swarm + the ports onto them
    faults.py     random or scripted faults        engine.py     the discrete-event loop around run_tick
    baselines.py  queue rule, Adaptive-like, static               report.py  metrics and lower bounds
    config.py     the settings subset it reads     runner.py     strategy by name, sync entry point
    cli.py        `swarm-autoscaler simulate`      plot.py       timeline PNG
    hunt.py       safety hunting with shrinking    table.py      the README's comparison table
"""
