"""Constants and small helpers shared by the EC2 adapter tests and their fixtures."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.adapters.ec2_transport import Ec2Transport

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


def wire(cloud: Ec2Transport, operation: str) -> list[dict[str, str]]:
    """Every `operation` request as it leaves the process (botocore's `before-send` event: the signed
    HTTP request, after serialisation), its form parameters decoded once, as EC2 reads them. What
    moto answers is not the point here: moto accepts requests AWS reads differently."""
    sent: list[dict[str, str]] = []

    def capture(request: Any, **_: Any) -> None:
        body = request.body
        text = body.decode() if isinstance(body, bytes) else str(body or "")
        sent.append({k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()})

    cloud._client.meta.events.register(f"before-send.ec2.{operation}", capture)
    return sent


def tags_in(params: Mapping[str, str], resource: str) -> dict[str, str]:
    """The tags a RunInstances request gives `resource` ("instance", "volume") in TagSpecifications."""
    out: dict[str, str] = {}
    for n in range(1, 10):
        if params.get(f"TagSpecification.{n}.ResourceType") != resource:
            continue
        for m in range(1, 60):
            key = params.get(f"TagSpecification.{n}.Tag.{m}.Key")
            if key is not None:
                out[key] = params[f"TagSpecification.{n}.Tag.{m}.Value"]
    return out


async def launch_more_like_this(raw_ec2: Any, instance_id: str) -> str:
    """What the console's "launch more like this" sends (moto has no console): a RunInstances of the
    original's image, type and subnet with every one of its tags, under a ClientToken of its own (the
    console makes one per launch). Returns the copy's id."""
    found = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    raw = found["Reservations"][0]["Instances"][0]
    made = await raw_ec2.run_instances(
        ImageId=raw["ImageId"], InstanceType=raw["InstanceType"], MinCount=1, MaxCount=1,
        SubnetId=raw["SubnetId"], ClientToken=uuid.uuid4().hex,
        TagSpecifications=[{"ResourceType": "instance", "Tags": raw["Tags"]}],
    )  # fmt: skip
    return str(made["Instances"][0]["InstanceId"])
