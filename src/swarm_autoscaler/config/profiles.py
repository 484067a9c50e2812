"""Cluster profiles of the keeper: `AUTOSCALER_KEEPER_PROFILES`, what a cluster is made of by name.

An operator names profiles, each a team's images and, when it needs them, its machines:

    AUTOSCALER_KEEPER_PROFILES='{"geo": {"worker_image": "registry.example.com/geo/worker:1.4.0",
        "scheduler_image": "registry.example.com/geo/scheduler:1.4.0",
        "worker_types": {"g4dn.xlarge": {"ami_id": "ami-0123456789abcdef0"}}, "primary_type": "m5.xlarge"}}'

and a user names one when creating a cluster (`PUT /v1/clusters/{user}/{wallet}` with
`{"profile": "geo"}`). Every field is optional: what a profile leaves out is the keeper-wide setting's
(AUTOSCALER_KEEPER_WORKER_IMAGE, _SCHEDULER_IMAGE, _WORKER_TYPES, _PRIMARY_TYPE). The profile `default`
is those settings alone; it always exists and cannot be redefined, so a keeper without profiles, and a
request naming none, behave exactly as before.

A profile's images must be pinned (a version tag or a digest, never :latest) and name their registry
(`registry.example.com/...`, `123456789012.dkr.ecr...`, `localhost/...`, or `docker.io/...` for Docker
Hub said out loud): `team/worker:1.0` would be pulled from Docker Hub, where anybody may own that name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from swarm_autoscaler.config.types import TYPE_NAME, AllowedType, AllowedTypes, json_value

if TYPE_CHECKING:  # pragma: no cover - types only (keeper.py imports this module)
    from swarm_autoscaler.config.keeper import KeeperSettings

DEFAULT_PROFILE = "default"
PROFILE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # a JSON key, an EC2 tag value
PROFILE_RULE = "1 to 63 letters, digits, '.', '-' and '_', starting with a letter or digit"


def pinned_image(value: str) -> str:
    """An image pinned by a version tag or a digest (not :latest); a pydantic error otherwise."""
    name, _, digest = value.partition("@")
    tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else ""
    if not digest and (not tag or tag == "latest"):
        raise PydanticCustomError(
            "image", "expected an image pinned by a version tag or a digest (name:1.2.3), not :latest"
        )
    return value


def qualified_image(value: str) -> str:
    """An image that names its registry: its first path component is a host (has a '.' or a ':') or
    `localhost`. docker resolves any other name on Docker Hub."""
    first, slash, _ = value.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        raise PydanticCustomError(
            "image",
            "'{image}' names no registry, so docker would pull it from Docker Hub: write the registry "
            "(registry.example.com/team/worker:1.0, localhost/..., or docker.io/... for Docker Hub)",
            {"image": value[:120]},
        )
    return value


def _image(value: str) -> str:
    return pinned_image(qualified_image(value)) if value else value


class ClusterProfile(BaseModel):
    """One profile as the operator writes it; an empty or missing field is the keeper-wide setting's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worker_image: str = Field(default="", description="The dask workers' image (a team's, pinned).")
    scheduler_image: str = Field(default="", description="The dask scheduler's image (pinned).")
    primary_type: str = Field(default="", description="Instance type of the cluster's primary.")
    worker_types: AllowedTypes | None = Field(
        default=None, description="The worker types, as AUTOSCALER_KEEPER_WORKER_TYPES."
    )

    @field_validator("worker_image", "scheduler_image")
    @classmethod
    def _images(cls, value: str) -> str:
        return _image(value)

    @field_validator("primary_type")
    @classmethod
    def _primary_type(cls, value: str) -> str:
        if value and not TYPE_NAME.match(value):
            raise PydanticCustomError("unknown_type", "expected an EC2 instance type name, like m7i.large")
        return value


def _names(value: dict[str, ClusterProfile]) -> dict[str, ClusterProfile]:
    for name in value:
        if not PROFILE_PATTERN.fullmatch(name):
            raise PydanticCustomError(
                "profile",
                "profile name '{name}' is not valid: {rule}",
                {"name": name[:80], "rule": PROFILE_RULE},
            )
        if name == DEFAULT_PROFILE:
            raise PydanticCustomError(
                "profile",
                "'default' is the keeper-wide settings (AUTOSCALER_KEEPER_WORKER_IMAGE and the others): "
                "give this profile another name",
            )
    return value


Profiles = Annotated[
    dict[str, ClusterProfile],
    BeforeValidator(json_value('a JSON object like {"geo": {"worker_image": "registry.example.com/w:1.0"}}')),
]


def check_profiles(value: dict[str, ClusterProfile], max_instances: int | None) -> dict[str, ClusterProfile]:
    """The names' rule, and each profile's worker reserves within the cluster maximum."""
    _names(value)
    for name, profile in value.items():
        reserve = sum(t.reserve for t in (profile.worker_types or {}).values())
        if max_instances is not None and reserve > max_instances:
            raise PydanticCustomError(
                "reserve",
                "profile {name}: its worker types reserve {reserve} machines, over "
                "AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER ({maximum})",
                {"name": name, "reserve": reserve, "maximum": max_instances},
            )
    return value


@dataclass(frozen=True, slots=True)
class Profile:
    """A profile with every field filled: what one cluster is made of."""

    name: str
    image: str  # the cluster's own autoscaler (and the TLS files' split): always the keeper's
    worker_image: str
    scheduler_image: str
    primary_type: str
    worker_types: Mapping[str, AllowedType]


def profiles_of(keeper: KeeperSettings) -> dict[str, Profile]:
    """Every profile by name, `default` first, each filled from the keeper-wide settings."""
    worker = keeper.worker_image or keeper.image
    scheduler = keeper.scheduler_image or keeper.image
    out = {
        DEFAULT_PROFILE: Profile(
            DEFAULT_PROFILE, keeper.image, worker, scheduler, keeper.primary_type, keeper.worker_types
        )
    }
    for name, p in keeper.profiles.items():
        out[name] = Profile(
            name,
            keeper.image,
            p.worker_image or worker,
            p.scheduler_image or scheduler,
            p.primary_type or keeper.primary_type,
            p.worker_types if p.worker_types is not None else keeper.worker_types,
        )
    return out


def launched_types(keeper: KeeperSettings) -> list[str]:
    """Every instance type the keeper's clusters may launch, primaries first, each once (what the
    keeper checks with EC2 and prices at start)."""
    profiles = profiles_of(keeper).values()
    types = [p.primary_type for p in profiles] + [name for p in profiles for name in p.worker_types]
    return list(dict.fromkeys(types))
