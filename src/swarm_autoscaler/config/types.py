"""Value types of the settings: durations, id lists, URLs, tags and the allowed instance types.

Each type validates a raw environment string (or an already typed value) and raises a
`PydanticCustomError` whose message says what is expected; the settings loader adds the variable's name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr
from pydantic_core import PydanticCustomError

from swarm_autoscaler.config.durations import EXPECTED as DURATION_EXPECTED
from swarm_autoscaler.config.durations import parse_duration
from swarm_autoscaler.core.catalogue import known_type

# ------------------------------------------------------------------------------------------ value types


class DurationMark:
    """Marks a field as a duration, so that documentation shows `5m` rather than `300.0`."""


def _duration(value: object) -> float:
    if not isinstance(value, str | int | float):
        raise PydanticCustomError("duration", DURATION_EXPECTED)
    try:
        return parse_duration(value)
    except ValueError:
        raise PydanticCustomError("duration", DURATION_EXPECTED) from None


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
    def check(value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in schemes or not (parts.netloc or parts.path):
            raise PydanticCustomError("url", f"expected a URL like {example}")
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


class AllowedType(BaseModel):
    """How one allowed instance type is launched and used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ami_id: AmiId = Field(description="AMI to boot new machines of this type from.")
    reserve: int = Field(default=0, ge=0, description="Drained machines of this type kept warm.")
    price_per_hour: float | None = Field(
        default=None, gt=0, description="USD per hour; overrides the catalogue."
    )
    overhead: Overhead = Field(default_factory=Overhead, description="Resources kept back per machine.")
    boot_script: str = Field(
        default="", description="Shell commands run at boot before joining; empty = none."
    )


def known_types(types: dict[str, AllowedType]) -> dict[str, AllowedType]:
    if not types:
        raise PydanticCustomError("no_types", "expected at least one allowed instance type")
    unknown = [name for name in types if not known_type(name)]
    if unknown:
        raise PydanticCustomError(
            "unknown_type",
            "unknown EC2 instance type(s) {names}: use types from the bundled catalogue",
            {"names": ", ".join(unknown)},
        )
    return types


AllowedTypes = Annotated[
    dict[str, AllowedType],
    BeforeValidator(json_value('a JSON object like {"m5.large": {"ami_id": "ami-..."}}')),
    AfterValidator(known_types),
]


def _tags(tags: dict[str, str]) -> dict[str, str]:
    for key, value in tags.items():
        if not key or len(key) > 128 or key.lower().startswith("aws:") or len(value) > 256:
            raise PydanticCustomError(
                "tag", "tag keys are 1-128 characters not starting with 'aws:', values at most 256"
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
