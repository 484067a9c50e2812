"""swarm-autoscaler: keeps a docker swarm of EC2 machines running dask workers right-sized."""

__version__ = "0.1.0"
