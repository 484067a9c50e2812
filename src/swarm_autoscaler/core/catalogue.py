"""A bundled catalogue of instance types for the offline lab and demo (the simulator, `swarm-autoscaler
demo`), which never ask EC2. The daemon takes every type from EC2 itself (DescribeInstanceTypes, see
`adapters.ec2_types`): any type the region offers can be allowed, whether it is here or not.

Capacities (vCPUs, memory in MiB, GPUs) are EC2's `DescribeInstanceTypes` figures; the t3, m5, c5, r5
and g4dn rows match the instance-type data bundled with moto 5.2.5 (a test cross-checks them over
HTTP). moto no longer ships the p3 family, so those rows come from AWS's published P3 specifications.

Prices are APPROXIMATE public on-demand prices for Linux in us-east-1, in USD per hour, as listed by
AWS at the time of writing. They are for ranking types against each other in the lab, the simulator
and the demo (and the local cloud's Price List stand-in serves them), never for billing: the daemon and
the keeper price every type from the operator's `price_per_hour` or the AWS Price List alone
(`adapters.ec2_pricing`), and refuse to start without one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from swarm_autoscaler.core.model import InstanceType, Resources

MIB = 1024**2
# The GPUs' memory of a machine (bytes, all its GPUs together), as a dask resource: a task that needs
# GPU memory asks `resources={"VRAM": bytes}` and is placed on a type with that much.
VRAM = "VRAM"

# name, vCPUs, memory MiB, GPUs, approximate on-demand USD/hour (us-east-1, Linux), GPU memory MiB
_ROWS: tuple[tuple[str, int, int, int, float, int], ...] = (
    # t3: burstable general purpose
    ("t3.nano", 2, 512, 0, 0.0052, 0),
    ("t3.micro", 2, 1024, 0, 0.0104, 0),
    ("t3.small", 2, 2048, 0, 0.0208, 0),
    ("t3.medium", 2, 4096, 0, 0.0416, 0),
    ("t3.large", 2, 8192, 0, 0.0832, 0),
    ("t3.xlarge", 4, 16384, 0, 0.1664, 0),
    ("t3.2xlarge", 8, 32768, 0, 0.3328, 0),
    # m5: general purpose
    ("m5.large", 2, 8192, 0, 0.096, 0),
    ("m5.xlarge", 4, 16384, 0, 0.192, 0),
    ("m5.2xlarge", 8, 32768, 0, 0.384, 0),
    ("m5.4xlarge", 16, 65536, 0, 0.768, 0),
    ("m5.8xlarge", 32, 131072, 0, 1.536, 0),
    ("m5.12xlarge", 48, 196608, 0, 2.304, 0),
    ("m5.16xlarge", 64, 262144, 0, 3.072, 0),
    ("m5.24xlarge", 96, 393216, 0, 4.608, 0),
    ("m5.metal", 96, 393216, 0, 4.608, 0),
    # c5: compute optimised
    ("c5.large", 2, 4096, 0, 0.085, 0),
    ("c5.xlarge", 4, 8192, 0, 0.17, 0),
    ("c5.2xlarge", 8, 16384, 0, 0.34, 0),
    ("c5.4xlarge", 16, 32768, 0, 0.68, 0),
    ("c5.9xlarge", 36, 73728, 0, 1.53, 0),
    ("c5.12xlarge", 48, 98304, 0, 2.04, 0),
    ("c5.18xlarge", 72, 147456, 0, 3.06, 0),
    ("c5.24xlarge", 96, 196608, 0, 4.08, 0),
    ("c5.metal", 96, 196608, 0, 4.08, 0),
    # r5: memory optimised
    ("r5.large", 2, 16384, 0, 0.126, 0),
    ("r5.xlarge", 4, 32768, 0, 0.252, 0),
    ("r5.2xlarge", 8, 65536, 0, 0.504, 0),
    ("r5.4xlarge", 16, 131072, 0, 1.008, 0),
    ("r5.8xlarge", 32, 262144, 0, 2.016, 0),
    ("r5.12xlarge", 48, 393216, 0, 3.024, 0),
    ("r5.16xlarge", 64, 524288, 0, 4.032, 0),
    ("r5.24xlarge", 96, 786432, 0, 6.048, 0),
    ("r5.metal", 96, 786432, 0, 6.048, 0),
    # g4dn: NVIDIA T4 GPUs
    ("g4dn.xlarge", 4, 16384, 1, 0.526, 16384),
    ("g4dn.2xlarge", 8, 32768, 1, 0.752, 16384),
    ("g4dn.4xlarge", 16, 65536, 1, 1.204, 16384),
    ("g4dn.8xlarge", 32, 131072, 1, 2.176, 16384),
    ("g4dn.12xlarge", 48, 196608, 4, 3.912, 65536),
    ("g4dn.16xlarge", 64, 262144, 1, 4.352, 16384),
    ("g4dn.metal", 96, 393216, 8, 7.824, 131072),
    # p3: NVIDIA V100 GPUs (61 GiB per GPU on p3; not in moto's data, so not launchable on moto)
    ("p3.2xlarge", 8, 62464, 1, 3.06, 16384),
    ("p3.8xlarge", 32, 249856, 4, 12.24, 65536),
    ("p3.16xlarge", 64, 499712, 8, 24.48, 131072),
    ("p3dn.24xlarge", 96, 786432, 8, 31.212, 262144),
)

CATALOGUE: Mapping[str, InstanceType] = MappingProxyType(
    {
        name: InstanceType(
            name,
            Resources.of(float(vcpus), mib * MIB, gpus, **({VRAM: float(vram * MIB)} if vram else {})),
            price,
        )
        for name, vcpus, mib, gpus, price, vram in _ROWS
    }
)


def known_type(name: str) -> bool:
    """True when `name` is in the bundled catalogue."""
    return name in CATALOGUE
