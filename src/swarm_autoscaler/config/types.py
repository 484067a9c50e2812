"""Value types of the settings: durations, id lists, URLs, tags and the allowed instance types.

Each type validates a raw environment string (or an already typed value) and raises a
`PydanticCustomError` whose message says what is expected; the settings loader adds the variable's name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr
from pydantic_core import PydanticCustomError

from swarm_autoscaler.config.durations import EXPECTED as DURATION_EXPECTED
from swarm_autoscaler.config.durations import parse_duration
from swarm_autoscaler.core.catalogue import CATALOGUE, known_type
from swarm_autoscaler.core.model import GIB

# Bounds far above any real fleet, so that a typo (or 1e40) is refused at start rather than believed.
MAX_FLEET = 10_000  # machines
MAX_PRICE = 10_000.0  # USD per hour for one machine

# ------------------------------------------------------------------------------------------ value types


class DurationMark:
    """Marks a field as a duration, so that documentation shows `5m` rather than `300.0`."""


MAX_DURATION = 365 * 86400.0  # a year: longer is a typo, and asyncio's timers cannot take 1e40 seconds


def _duration(value: object) -> float:
    if not isinstance(value, str | int | float):
        raise PydanticCustomError("duration", DURATION_EXPECTED)
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise PydanticCustomError("duration", DURATION_EXPECTED) from None
    if seconds > MAX_DURATION:
        raise PydanticCustomError("duration", "expected a duration of at most 365d")
    return seconds


Duration = Annotated[float, BeforeValidator(_duration), DurationMark()]


def json_value(expected: str) -> Callable[[object], object]:
    """A before-validator decoding a JSON string (env values) and passing other values through."""

    def decode(value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise PydanticCustomError("json", f"expected {expected}") from None

    return decode


def _id_list(value: object) -> object:
    """A JSON list (`["a","b"]`) or comma-separated values (`a,b`); blanks are dropped."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json_value("a JSON list of strings or comma-separated values")(text)
    return [part.strip() for part in text.split(",") if part.strip()]


IdList = Annotated[list[str], BeforeValidator(_id_list)]


def url_check(schemes: tuple[str, ...], example: str) -> Callable[[str], str]:
    """A URL with one of `schemes`, and a port, when it has one, within 1-65535."""

    def check(value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in schemes or not (parts.netloc or parts.path):
            raise PydanticCustomError("url", f"expected a URL like {example}")
        try:
            bad_port = parts.port == 0  # raises ValueError for a port that is not a number or above 65535
        except ValueError:
            bad_port = True
        if bad_port:
            raise PydanticCustomError("url", f"expected a URL like {example} with a port from 1 to 65535")
        return value

    return check


def secret_url_check(schemes: tuple[str, ...], example: str) -> Callable[[SecretStr], SecretStr]:
    check = url_check(schemes, example)

    def check_secret(value: SecretStr) -> SecretStr:
        check(value.get_secret_value())
        return value

    return check_secret


_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def cluster_name(value: str) -> str:
    if not _CLUSTER_NAME.fullmatch(value):
        raise PydanticCustomError(
            "cluster_name", "expected 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit"
        )
    return value


# ------------------------------------------------------------------------------------------ instance types


def _ami_id(value: str) -> str:
    if not _AMI_ID.fullmatch(value):
        raise PydanticCustomError("ami_id", "expected an AMI id like ami-0123456789abcdef0")
    return value


_AMI_ID = re.compile(r"ami-[0-9a-f]{8}(?:[0-9a-f]{9})?")
AmiId = Annotated[str, AfterValidator(_ami_id)]


class Overhead(BaseModel):
    """Resources kept back on every machine of a type for the OS, docker and sidecars."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(default=0.0, ge=0, description="CPUs kept back (may be fractional).")
    ram_gib: float = Field(default=0.0, ge=0, description="RAM kept back, in GiB.")
    gpus: int = Field(default=0, ge=0, description="GPUs kept back.")

    def ram_bytes(self, machine_ram: int, percent: float = 0.0) -> int:
        """The RAM kept back on a machine with `machine_ram` bytes: `ram_gib`, plus `percent` of the
        machine's memory (`AUTOSCALER_EC2_MEMORY_OVERHEAD_PERCENT`, what the kernel and dockerd take)."""
        return round(self.ram_gib * GIB) + round(machine_ram * percent / 100)


# The default share of a type's memory kept back (`AUTOSCALER_EC2_MEMORY_OVERHEAD_PERCENT`): Karpenter's
# VM memory overhead (7.5%). A machine never shows the type's nominal memory to its OS (the kernel and
# firmware take some), and dockerd, containerd and the agents take more.
MEMORY_OVERHEAD_PERCENT = 7.5


# EC2 takes at most 16 KiB of user data; the adapter wraps the boot script (failure report, wait for
# dockerd, the retried swarm join: about 1.1 KiB, `adapters.boot_scripts`), so the script must leave room
# for it. The adapter checks the rendered user data of each type at start-up too (`check_user_data`).
USER_DATA_LIMIT = 16 * 1024
BOOT_SCRIPT_LIMIT = USER_DATA_LIMIT - 2048


def _boot_script(value: str) -> str:
    size = len(value.encode())
    if size > BOOT_SCRIPT_LIMIT:
        raise PydanticCustomError(
            "boot_script",
            "expected at most {limit} bytes (EC2's 16 KiB of user data, less room for the swarm join "
            "appended to it), got {size} bytes",
            {"limit": BOOT_SCRIPT_LIMIT, "size": size},
        )
    return value


Capacity = Literal["spot", "on-demand"]


def _on_demand() -> list[Capacity]:
    return ["on-demand"]


def _capacities(value: list[Capacity]) -> list[Capacity]:
    if not value or len(set(value)) != len(value):
        raise PydanticCustomError(
            "capacity", 'expected a non-empty list without repeats, like ["spot", "on-demand"]'
        )
    return value


class AllowedType(BaseModel):
    """How one allowed instance type is launched and used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ami_id: AmiId = Field(description="AMI to boot new machines of this type from.")
    reserve: int = Field(
        default=0, ge=0, le=MAX_FLEET, description="Drained machines of this type kept warm."
    )
    min: int = Field(
        default=0,
        ge=0,
        le=MAX_FLEET,
        description="Machines of this type always running (the base capacity; on top of the global minimum's count).",
    )
    reserve_idle_limit: Duration = Field(
        default=0.0,
        description="Let the reserve go once no machine of this type worked for this long; refill it "
        "when the type works again (0: keep the reserve always).",
    )
    warm_pool: int = Field(
        default=0,
        ge=0,
        le=MAX_FLEET,
        description="Stopped machines of this type kept ready to start (each pays only for its EBS volume).",
    )
    price_per_hour: float | None = Field(
        default=None,
        gt=0,
        le=MAX_PRICE,
        description="USD per hour; overrides the price list everywhere (the cheapest fit, the simulator, the keeper's usage ledger).",
    )
    overhead: Overhead = Field(default_factory=Overhead, description="Resources kept back per machine.")
    boot_script: Annotated[str, AfterValidator(_boot_script)] = Field(
        default="", description="Shell commands run at boot before joining; empty = none."
    )
    surge_above: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="While a worker of this type is up, launch more only for more than this many tasks.",
    )
    capacity: Annotated[list[Capacity], AfterValidator(_capacities)] = Field(
        default_factory=_on_demand,
        description='EC2 capacity to launch with, tried in order (["spot", "on-demand"]: spot, falling back '
        "to on-demand when EC2 refuses spot).",
    )
    spot_price_per_hour: float | None = Field(
        default=None,
        gt=0,
        le=MAX_PRICE,
        description="USD per hour of a spot machine; with spot first in `capacity`, the cheapest fit uses "
        "it (unset: the spot price EC2 quotes at start-up).",
    )

    @property
    def planned_price(self) -> float | None:
        """The price overriding the catalogue's in the cheapest-fit choice. Spot first: the spot price when
        set, else None (the daemon then prices the type at the spot price EC2 quotes at start-up)."""
        if self.capacity[0] == "spot":
            return self.spot_price_per_hour
        return self.price_per_hour


# An EC2 instance type's name: family (with generation and options), a dot, the size ("m7i.large",
# "m7i-flex.xlarge", "u-6tb1.metal", "g6e.48xlarge"). Whether the region offers it is EC2's to say, at
# start (DescribeInstanceTypes, `adapters.ec2_types`): any type it offers can be allowed.
TYPE_NAME = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")


def known_types(types: dict[str, AllowedType]) -> dict[str, AllowedType]:
    if not types:
        raise PydanticCustomError("no_types", "expected at least one allowed instance type")
    unknown = [name for name in types if not TYPE_NAME.match(name)]
    if unknown:
        raise PydanticCustomError(
            "unknown_type",
            "not EC2 instance type names: {names} (expected a family and a size, like m7i.large)",
            {"names": ", ".join(unknown)},
        )
    for name, spec in types.items():
        if known_type(name):  # a type of the bundled catalogue is checked now; any other at start
            _leaves_room(name, spec.overhead)
    return types


def _leaves_room(name: str, overhead: Overhead) -> None:
    """An overhead must leave some CPU and RAM for work on the type's machine (per the bundled catalogue;
    `config.policy` checks every type again against EC2's description at start), or every task would be
    silently unplaceable on it."""
    machine = CATALOGUE[name].resources
    if overhead.cpus >= machine.cpus or overhead.ram_gib * GIB >= machine.ram or overhead.gpus > machine.gpus:
        raise PydanticCustomError(
            "overhead",
            "the overhead of {name} ({overhead}) leaves no room for work on its machine ({machine}); lower it",
            {
                "name": name,
                "overhead": f"{overhead.cpus:g} CPUs, {overhead.ram_gib:g} GiB RAM, {overhead.gpus} GPUs",
                "machine": f"{machine.cpus:g} CPUs, {machine.ram / GIB:g} GiB RAM, {machine.gpus} GPUs",
            },
        )


AllowedTypes = Annotated[
    dict[str, AllowedType],
    BeforeValidator(json_value('a JSON object like {"m5.large": {"ami_id": "ami-..."}}')),
    AfterValidator(known_types),
]


# Tag keys the EC2 adapter writes itself (ownership, the Name, node labels): a custom tag may not take them.
# The adapter (`adapters/ec2.py`) refuses them too; a test keeps both lists in step.
RESERVED_TAG_KEYS = ("managed-by", "swarm-autoscaler/cluster", "Name")
RESERVED_TAG_PREFIXES = ("aws:", "swarm-autoscaler/")


def _tags(tags: dict[str, str]) -> dict[str, str]:
    for key, value in tags.items():
        if not key or len(key) > 128 or key.lower().startswith("aws:") or len(value) > 256:
            raise PydanticCustomError(
                "tag", "tag keys are 1-128 characters not starting with 'aws:', values at most 256"
            )
        if key in RESERVED_TAG_KEYS or key.startswith(RESERVED_TAG_PREFIXES):
            raise PydanticCustomError(
                "tag",
                "tag key '{key}' is reserved for the autoscaler's own tags ({reserved}, and keys starting "
                "with {prefixes}); rename it",
                {
                    "key": key,
                    "reserved": ", ".join(RESERVED_TAG_KEYS),
                    "prefixes": " or ".join(RESERVED_TAG_PREFIXES),
                },
            )
    return tags


Tags = Annotated[
    dict[str, str], BeforeValidator(json_value('a JSON object like {"team": "data"}')), AfterValidator(_tags)
]


ClusterName = Annotated[str, AfterValidator(cluster_name)]
Ec2Endpoint = Annotated[str, AfterValidator(url_check(("http", "https"), "http://localhost:5000"))]
SchedulerUrl = Annotated[str, AfterValidator(url_check(("tcp", "tls", "ws", "wss"), "tcp://scheduler:8786"))]
DockerUrl = Annotated[
    str, AfterValidator(url_check(("unix", "tcp", "http", "https"), "unix:///var/run/docker.sock"))
]
RedisUrl = Annotated[
    SecretStr, AfterValidator(secret_url_check(("redis", "rediss", "unix"), "redis://host:6379/0"))
]
