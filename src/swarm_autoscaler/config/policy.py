"""The planner's `Policy`, built from validated settings and the instance-type catalogue.

This is where operator units become the core's units: GiB to bytes, durations already in seconds.
Rules that need the catalogue (a type's overhead must leave room for work) are checked here, so a
policy the planner receives is always usable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping

from swarm_autoscaler.config.settings import Settings, TimingSettings
from swarm_autoscaler.config.types import AllowedType
from swarm_autoscaler.core.model import InstanceType, Policy, Resources, TypePolicy
from swarm_autoscaler.errors import ConfigurationError


def policy_from_settings(settings: Settings, catalogue: Mapping[str, InstanceType]) -> Policy:
    """The planner's policy for `settings`. Allowed types keep their configured order (the preference
    on price ties). Raises `ConfigurationError` when a type is missing from `catalogue` or its overhead
    takes all of a machine's CPUs or RAM."""
    ec2 = settings.ec2
    return build_policy(
        settings.timing,
        ec2.allowed_types,
        catalogue,
        min_instances=ec2.min_instances,
        max_instances=ec2.max_instances,
        max_launch_per_tick=ec2.max_launch_per_tick,
        subnets=tuple(ec2.subnet_ids),
        security_groups=tuple(ec2.security_group_ids),
        memory_overhead_percent=ec2.memory_overhead_percent,
        adopt_by_address=ec2.adopt_by_address,
        adopt_by_identity=bool(ec2.join_url),
    )


def build_policy(
    timing: TimingSettings,
    allowed_types: Mapping[str, AllowedType],
    catalogue: Mapping[str, InstanceType],
    *,
    min_instances: int,
    max_instances: int,
    max_launch_per_tick: int,
    subnets: tuple[str, ...] = (),
    security_groups: tuple[str, ...] = (),
    memory_overhead_percent: float = 0.0,
    adopt_by_address: bool = False,
    adopt_by_identity: bool = False,
) -> Policy:
    """The policy from its parts (the simulator reads only these). Same rules as `policy_from_settings`.
    Each type's `spec` hashes its settings with the subnets and security groups (drift.py). Each type's
    RAM overhead adds `memory_overhead_percent` of its memory (the daemon's setting; the simulator's
    machines publish the whole, so it passes none)."""
    return Policy(
        allowed_types=tuple(
            dataclasses.replace(
                _type_policy(name, allowed, catalogue.get(name), memory_overhead_percent),
                spec=launch_spec(allowed, subnets, security_groups),
            )
            for name, allowed in allowed_types.items()
        ),
        min_instances=min_instances,
        max_instances=max_instances,
        max_start_time=timing.max_start_time,
        drain_delay=timing.drain_delay,
        termination_delay=timing.termination_delay,
        node_down_timeout=timing.node_down_timeout,
        consolidate_below=timing.consolidate_below,
        consolidate_under_load=timing.consolidate_under_load,
        max_unready_share=timing.max_unready_share,
        max_machine_age=timing.max_machine_age,
        budgets=tuple(b.to_budget() for b in timing.disruption_budgets),
        tolerated_wait=timing.tolerated_wait,
        idle_learning=timing.idle_learning,
        idle_floor=timing.idle_floor,
        max_launch_per_tick=max_launch_per_tick,
        subnets=subnets,
        adopt_by_address=adopt_by_address,
        adopt_by_identity=adopt_by_identity,
    )


def launch_spec(allowed: AllowedType, subnets: tuple[str, ...], security_groups: tuple[str, ...]) -> str:
    """A short hash of what a machine of this type is launched with: its AMI, boot script and capacity
    (on-demand or spot), the subnets and the security groups. A change to any of them drifts the
    machines launched before it; the planner's own settings of the type (reserve, base, pool, prices,
    overhead, queue threshold) change no machine and drift none."""
    launched = allowed.model_dump(mode="json", include={"ami_id", "boot_script", "capacity"})
    text = json.dumps(
        {"type": launched, "subnets": subnets, "security_groups": security_groups}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _type_policy(name: str, allowed: AllowedType, known: InstanceType | None, percent: float) -> TypePolicy:
    if known is None:
        raise ConfigurationError(
            f"AUTOSCALER_EC2_ALLOWED_TYPES: instance type {name} is not in the catalogue; "
            "remove it, or use a type EC2 describes (the offline lab and demo know only the bundled catalogue)"
        )
    overhead = Resources.of(
        cpus=allowed.overhead.cpus,
        ram=allowed.overhead.ram_bytes(known.resources.ram, percent),
        gpus=allowed.overhead.gpus,
    )
    capacity = known.resources
    if overhead.cpus >= capacity.cpus or overhead.ram >= capacity.ram or overhead.gpus > capacity.gpus:
        raise ConfigurationError(
            f"AUTOSCALER_EC2_ALLOWED_TYPES: the overhead of {name} ({overhead}) leaves no room for work "
            f"on its {capacity}; lower the overhead"
        )
    return TypePolicy(
        name=name,
        reserve=allowed.reserve,
        overhead=overhead,
        price_per_hour=allowed.planned_price,
        minimum=allowed.min,
        warm_pool=allowed.warm_pool,
        surge_above=allowed.surge_above,
        reserve_idle_limit=allowed.reserve_idle_limit,
    )
