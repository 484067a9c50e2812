"""A bundled catalogue of the EC2 instance types the daemon knows without asking EC2.

Capacities (vCPUs, memory in MiB, GPUs) are EC2's `DescribeInstanceTypes` figures; the t3, m5, c5, r5
and g4dn rows match the instance-type data bundled with moto 5.2.5 (a test cross-checks them over
HTTP). moto no longer ships the p3 family, so those rows come from AWS's published P3 specifications.

Prices are APPROXIMATE public on-demand prices for Linux in us-east-1, in USD per hour, as listed by
AWS at the time of writing. They are for ranking types against each other, not for billing; a
`TypePolicy.price_per_hour` overrides them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from swarm_autoscaler.core.model import InstanceType, Resources

MIB = 1024**2

# name, vCPUs, memory MiB, GPUs, approximate on-demand USD/hour (us-east-1, Linux)
_ROWS: tuple[tuple[str, int, int, int, float], ...] = (
    # t3: burstable general purpose
    ("t3.nano", 2, 512, 0, 0.0052),
    ("t3.micro", 2, 1024, 0, 0.0104),
    ("t3.small", 2, 2048, 0, 0.0208),
    ("t3.medium", 2, 4096, 0, 0.0416),
    ("t3.large", 2, 8192, 0, 0.0832),
    ("t3.xlarge", 4, 16384, 0, 0.1664),
    ("t3.2xlarge", 8, 32768, 0, 0.3328),
    # m5: general purpose
    ("m5.large", 2, 8192, 0, 0.096),
    ("m5.xlarge", 4, 16384, 0, 0.192),
    ("m5.2xlarge", 8, 32768, 0, 0.384),
    ("m5.4xlarge", 16, 65536, 0, 0.768),
    ("m5.8xlarge", 32, 131072, 0, 1.536),
    ("m5.12xlarge", 48, 196608, 0, 2.304),
    ("m5.16xlarge", 64, 262144, 0, 3.072),
    ("m5.24xlarge", 96, 393216, 0, 4.608),
    ("m5.metal", 96, 393216, 0, 4.608),
    # c5: compute optimised
    ("c5.large", 2, 4096, 0, 0.085),
    ("c5.xlarge", 4, 8192, 0, 0.17),
    ("c5.2xlarge", 8, 16384, 0, 0.34),
    ("c5.4xlarge", 16, 32768, 0, 0.68),
    ("c5.9xlarge", 36, 73728, 0, 1.53),
    ("c5.12xlarge", 48, 98304, 0, 2.04),
    ("c5.18xlarge", 72, 147456, 0, 3.06),
    ("c5.24xlarge", 96, 196608, 0, 4.08),
    ("c5.metal", 96, 196608, 0, 4.08),
    # r5: memory optimised
    ("r5.large", 2, 16384, 0, 0.126),
    ("r5.xlarge", 4, 32768, 0, 0.252),
    ("r5.2xlarge", 8, 65536, 0, 0.504),
    ("r5.4xlarge", 16, 131072, 0, 1.008),
    ("r5.8xlarge", 32, 262144, 0, 2.016),
    ("r5.12xlarge", 48, 393216, 0, 3.024),
    ("r5.16xlarge", 64, 524288, 0, 4.032),
    ("r5.24xlarge", 96, 786432, 0, 6.048),
    ("r5.metal", 96, 786432, 0, 6.048),
    # g4dn: NVIDIA T4 GPUs
    ("g4dn.xlarge", 4, 16384, 1, 0.526),
    ("g4dn.2xlarge", 8, 32768, 1, 0.752),
    ("g4dn.4xlarge", 16, 65536, 1, 1.204),
    ("g4dn.8xlarge", 32, 131072, 1, 2.176),
    ("g4dn.12xlarge", 48, 196608, 4, 3.912),
    ("g4dn.16xlarge", 64, 262144, 1, 4.352),
    ("g4dn.metal", 96, 393216, 8, 7.824),
    # p3: NVIDIA V100 GPUs (61 GiB per GPU on p3; not in moto's data, so not launchable on moto)
    ("p3.2xlarge", 8, 62464, 1, 3.06),
    ("p3.8xlarge", 32, 249856, 4, 12.24),
    ("p3.16xlarge", 64, 499712, 8, 24.48),
    ("p3dn.24xlarge", 96, 786432, 8, 31.212),
)

CATALOGUE: Mapping[str, InstanceType] = MappingProxyType(
    {
        name: InstanceType(name, Resources(cpus=float(vcpus), ram=mib * MIB, gpus=gpus), price)
        for name, vcpus, mib, gpus, price in _ROWS
    }
)


def known_type(name: str) -> bool:
    """True when `name` is in the bundled catalogue."""
    return name in CATALOGUE
