"""The settings the simulator reads: the same `AUTOSCALER_*` variables (and env file) as the daemon, but
only the ones a simulation uses.

The daemon's `Settings` requires things a simulation has no use for (the dask scheduler URL, the cluster
name, an AMI id per type). This loader reads just:

- the timing group, unchanged (`swarm_autoscaler.settings.TimingSettings`: poll interval, start time,
  drain and termination delays, node-down timeout, capacity back-off);
- from the EC2 group, `AUTOSCALER_EC2_ALLOWED_TYPES` (only `reserve`, `price_per_hour` and `overhead` of
  each type are read; `ami_id`, `boot_script` and anything else are ignored), `..._MIN_INSTANCES`,
  `..._MAX_INSTANCES` and `..._MAX_LAUNCH_PER_TICK`.

Every problem is reported at once, one line per variable, through `InvalidSettingsError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from ..catalogue import CATALOGUE
from ..model import GIB, InstanceType, Policy, Resources, TypePolicy
from ..settings import PREFIX, InvalidSettingsError, TimingSettings
from ..settings_types import Overhead


def _json_object(value: object) -> object:
    import json

    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f'expected a JSON object like {{"m5.large": {{}}}} ({exc.msg})') from None
    return value


class SimType(BaseModel):
    """The part of an allowed type's settings that a simulation uses."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    reserve: int = Field(default=0, ge=0)
    price_per_hour: float | None = Field(default=None, gt=0)
    overhead: Overhead = Field(default_factory=Overhead)


class SimEc2Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=f"{PREFIX}EC2_", extra="ignore", enable_decoding=False, env_ignore_empty=True
    )

    allowed_types: Annotated[dict[str, SimType], BeforeValidator(_json_object)]
    min_instances: int = Field(0, ge=0)
    max_instances: int = Field(10, ge=0)
    max_launch_per_tick: int = Field(0, ge=0)

    @field_validator("allowed_types")
    @classmethod
    def _known(cls, types: dict[str, SimType]) -> dict[str, SimType]:
        if not types:
            raise ValueError("expected at least one allowed instance type")
        unknown = [n for n in types if n not in CATALOGUE]
        if unknown:
            raise ValueError(f"unknown EC2 instance type(s) {', '.join(unknown)}")
        return types

    @field_validator("max_instances")
    @classmethod
    def _order(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min_instances", 0)
        if value < low:
            raise ValueError(f"must be at least AUTOSCALER_EC2_MIN_INSTANCES ({low})")
        return value


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
    if env_file is not None and not os.path.isfile(env_file):
        raise InvalidSettingsError([f"env file {os.fspath(env_file)!r} not found"])
    problems: list[str] = []
    timing = ec2 = None
    try:
        timing = TimingSettings(_env_file=env_file)  # type: ignore[call-arg]
    except (ValidationError, SettingsError) as exc:
        problems.extend(_lines(exc, PREFIX))
    try:
        ec2 = SimEc2Settings(_env_file=env_file)  # type: ignore[call-arg]
    except (ValidationError, SettingsError) as exc:
        problems.extend(_lines(exc, f"{PREFIX}EC2_"))
    if problems or timing is None or ec2 is None:
        raise InvalidSettingsError(problems)
    return build_sim_settings(timing, ec2)


def _lines(exc: ValidationError | SettingsError, prefix: str) -> list[str]:
    if isinstance(exc, SettingsError):
        return [f"{prefix}*: {exc}"]
    out = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        name = f"{prefix}{loc[0].upper()}" if loc else f"{prefix}*"
        path = ".".join(loc[1:])
        message = str(error["msg"]).removeprefix("Value error, ")
        out.append(f"{name}: {path + ': ' if path else ''}{message}")
    return out


def overhead_resources(overhead: Overhead) -> Resources:
    return Resources(overhead.cpus, round(overhead.ram_gib * GIB), overhead.gpus)


def build_sim_settings(timing: TimingSettings, ec2: SimEc2Settings) -> SimSettings:
    types = tuple(
        TypePolicy(name, t.reserve, overhead_resources(t.overhead), t.price_per_hour)
        for name, t in ec2.allowed_types.items()
    )
    policy = Policy(
        allowed_types=types,
        min_instances=ec2.min_instances,
        max_instances=ec2.max_instances,
        max_start_time=timing.max_start_time,
        drain_delay=timing.drain_delay,
        termination_delay=timing.termination_delay,
        node_down_timeout=timing.node_down_timeout,
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
