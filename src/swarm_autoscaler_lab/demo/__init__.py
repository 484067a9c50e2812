"""`swarm-autoscaler demo`: the real daemon on the local cloud, with a workload and a live dashboard."""
