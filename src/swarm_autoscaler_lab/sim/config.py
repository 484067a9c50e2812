"""The settings the simulator reads: the same `AUTOSCALER_*` variables (and env file) as the daemon, but
only the ones a simulation uses.

The daemon's `Settings` requires things a simulation has no use for (the dask scheduler URL, the cluster
name, an AMI id per type). This loader reads just:

- the timing group, unchanged (`swarm_autoscaler.config.settings.TimingSettings`: poll interval, start time,
  drain and termination delays, node-down timeout, capacity back-off);
- from the EC2 group, `AUTOSCALER_EC2_ALLOWED_TYPES` (validated as the daemon's `AllowedType` except that
  `ami_id` may be left out and unknown keys are ignored; only `reserve`, `price_per_hour` and `overhead`
  are used), `..._MIN_INSTANCES`, `..._MAX_INSTANCES` and `..._MAX_LAUNCH_PER_TICK`, with the daemon's
  checks (known types, min <= max, reserves within max, overheads that leave room for work).

Every problem is reported at once, one line per variable as the daemon words it, through
`InvalidSettingsError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings

from swarm_autoscaler.config.policy import build_policy
from swarm_autoscaler.config.settings import (
    PREFIX,
    Ec2Settings,
    InvalidSettingsError,
    TimingSettings,
    env_path,
    group_config,
    read_group,
)
from swarm_autoscaler.config.types import AllowedType, json_value, known_types
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import InstanceType, Policy
from swarm_autoscaler.errors import ConfigurationError


class SimType(AllowedType):
    """An allowed type as the simulator reads it: the daemon's `AllowedType`, but nothing is booted, so
    `ami_id` may be left out, and keys the daemon would reject are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ami_id: str = ""  # unused by a simulation


SimTypes = Annotated[
    dict[str, SimType],
    BeforeValidator(json_value('a JSON object like {"m5.large": {}}')),
    AfterValidator(known_types),
]


class SimEc2Settings(BaseSettings):
    model_config = group_config(f"{PREFIX}EC2_")

    allowed_types: SimTypes
    min_instances: int = Field(0, ge=0)
    max_instances: int = Field(10, ge=0)
    max_launch_per_tick: int = Field(0, ge=0)

    @field_validator("max_instances")
    @classmethod
    def _limits(cls, value: int, info: ValidationInfo) -> int:
        return Ec2Settings._limits(value, info)  # at least the minimum and the sum of the reserves


@dataclass(frozen=True, slots=True)
class SimSettings:
    """What a simulation runs with: the policy the planner follows, the catalogue with price overrides
    applied, the tick interval and the capacity back-off."""

    policy: Policy
    catalogue: Mapping[str, InstanceType]
    poll_interval: float
    backoff_initial: float
    backoff_max: float


def load_sim_settings(env_file: str | os.PathLike[str] | None = None) -> SimSettings:
    """Read the subset described in the module docstring from the environment and `env_file`."""
    path = env_path(env_file)
    timing, timing_problems = read_group(TimingSettings, path)
    ec2, ec2_problems = read_group(SimEc2Settings, path)
    if timing is None or ec2 is None:
        raise InvalidSettingsError(timing_problems + ec2_problems)
    try:
        return build_sim_settings(timing, ec2)
    except ConfigurationError as exc:
        raise InvalidSettingsError([str(exc)]) from None


def build_sim_settings(timing: TimingSettings, ec2: SimEc2Settings) -> SimSettings:
    """Raises `ConfigurationError` when a type's overhead leaves no room for work (as the daemon does)."""
    policy = build_policy(
        timing,
        ec2.allowed_types,
        CATALOGUE,
        min_instances=ec2.min_instances,
        max_instances=ec2.max_instances,
        max_launch_per_tick=ec2.max_launch_per_tick,
    )
    return SimSettings(
        policy=policy,
        catalogue=priced_catalogue(policy),
        poll_interval=timing.poll_interval,
        backoff_initial=timing.capacity_backoff_initial,
        backoff_max=timing.capacity_backoff_max,
    )


def priced_catalogue(policy: Policy) -> Mapping[str, InstanceType]:
    """The allowed types' catalogue entries, with the policy's price overrides applied."""
    out = {}
    for tp in policy.allowed_types:
        base = CATALOGUE[tp.name]
        price = tp.price_per_hour if tp.price_per_hour is not None else base.price_per_hour
        out[tp.name] = InstanceType(base.name, base.resources, price)
    return MappingProxyType(out)
