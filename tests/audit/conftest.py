"""The EC2 adapter tests' real moto server and factories, for the policy tests that drive the product's
own adapters and evaluate the requests that reached EC2 against the policies."""

from tests.adapters.ec2.conftest import clock, faults, make_cloud, moto_server, network, raw_ec2

__all__ = ["clock", "faults", "make_cloud", "moto_server", "network", "raw_ec2"]
