"""A local cloud for tests and the demo: moto's EC2 in-process, with capacity refusals on demand."""

from .ec2_faults import FaultInjector, Refusal
from .moto_server import LocalNetwork, MotoServer, enable_instance_type_validation, provision_network

__all__ = [
    "FaultInjector",
    "LocalNetwork",
    "MotoServer",
    "Refusal",
    "enable_instance_type_validation",
    "provision_network",
]
