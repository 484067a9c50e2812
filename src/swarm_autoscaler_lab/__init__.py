"""The lab: what proves swarm-autoscaler, apart from the product an operator deploys.

- `localcloud`: moto's EC2 server, in-memory and dockerd swarms and the machine emulator;
- `sim`: the simulator, its baselines and the safety hunt;
- `demo`: the demos and their dashboards.

The lab imports the product; the product never imports the lab (tests/test_layers.py). Its commands
(`demo`, `simulate`) reach `swarm-autoscaler` through the `swarm_autoscaler.commands` entry points.
"""
