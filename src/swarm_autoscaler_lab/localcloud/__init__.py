"""A local cloud for tests and the demo: moto's EC2 in-process, with capacity refusals on demand."""

from swarm_autoscaler_lab.localcloud.ec2_faults import FaultInjector, Refusal
from swarm_autoscaler_lab.localcloud.ec2_strict import StrictEc2
from swarm_autoscaler_lab.localcloud.moto_server import (
    LocalNetwork,
    MotoServer,
    enable_instance_type_validation,
    provision_network,
)

__all__ = [
    "FaultInjector",
    "LocalNetwork",
    "MotoServer",
    "Refusal",
    "StrictEc2",
    "enable_instance_type_validation",
    "provision_network",
]
