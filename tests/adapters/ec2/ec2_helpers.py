"""Constants and small helpers shared by the EC2 adapter tests and their fixtures."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

from swarm_autoscaler.adapters.ec2 import Ec2Cloud

ACCESS_KEY = "AKIATESTEXAMPLE0001"
SECRET_KEY = "tEsT/SeCrEt+Key/that-must-never-leak"
TOKEN = "SWMTKN-1-testtoken-abcdef"
MANAGER = "10.0.0.2:2377"
BOOT_SCRIPT = "echo booting-the-worker > /var/log/boot-marker"
TYPES = ("t3.micro", "m5.large", "c5.large", "m5.bogus")
cluster_ids = itertools.count(1)


async def join_command() -> tuple[str, str]:
    return TOKEN, MANAGER


CloudFactory = Callable[..., Awaitable[Ec2Cloud]]
