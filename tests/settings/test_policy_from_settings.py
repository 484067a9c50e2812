"""policy_from_settings: settings and a catalogue in, the planner's Policy out."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from swarm_autoscaler.config.policy import launch_spec, policy_from_settings
from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.config.types import AllowedType
from swarm_autoscaler.core.model import GIB, InstanceType, Policy, Resources, TypePolicy
from swarm_autoscaler.errors import ConfigurationError

SetEnv = Callable[..., None]

CATALOGUE = {
    "m5.large": InstanceType("m5.large", Resources.of(cpus=2, ram=8 * GIB), 0.096),
    "c5.large": InstanceType("c5.large", Resources.of(cpus=2, ram=4 * GIB), 0.085),
    "g4dn.xlarge": InstanceType("g4dn.xlarge", Resources.of(cpus=4, ram=16 * GIB, gpus=1), 0.526),
}


def test_builds_the_whole_policy(set_env: SetEnv) -> None:
    set_env(
        AUTOSCALER_EC2_ALLOWED_TYPES=json.dumps(
            {
                "g4dn.xlarge": {
                    "ami_id": "ami-12345678",
                    "overhead": {"cpus": 0.5, "ram_gib": 1.5, "gpus": 0},
                },
                "m5.large": {"ami_id": "ami-12345678", "reserve": 1, "price_per_hour": 0.05},
                "c5.large": {"ami_id": "ami-12345678"},
            }
        ),
        AUTOSCALER_EC2_MIN_INSTANCES="1",
        AUTOSCALER_EC2_MAX_INSTANCES="7",
        AUTOSCALER_EC2_MAX_LAUNCH_PER_TICK="3",
        AUTOSCALER_MAX_START_TIME="8m",
        AUTOSCALER_DRAIN_DELAY="45s",
        AUTOSCALER_TERMINATION_DELAY="3m",
        AUTOSCALER_NODE_DOWN_TIMEOUT="1h",
    )
    # one launch spec for the three: same AMI, boot script and capacity, no subnets or groups set
    spec = launch_spec(AllowedType(ami_id="ami-12345678"), (), ())
    assert policy_from_settings(load_settings(), CATALOGUE) == Policy(
        allowed_types=(
            # each type's RAM overhead: its own, plus the default 7.5% of its memory
            TypePolicy(
                "g4dn.xlarge",
                reserve=0,
                overhead=Resources.of(cpus=0.5, ram=3 * GIB // 2 + round(16 * GIB * 0.075)),
                spec=spec,
            ),
            TypePolicy(
                "m5.large",
                reserve=1,
                overhead=Resources.of(ram=round(8 * GIB * 0.075)),
                price_per_hour=0.05,
                spec=spec,
            ),
            TypePolicy("c5.large", overhead=Resources.of(ram=round(4 * GIB * 0.075)), spec=spec),
        ),
        min_instances=1,
        max_instances=7,
        max_start_time=480.0,
        drain_delay=45.0,
        termination_delay=180.0,
        node_down_timeout=3600.0,
        max_launch_per_tick=3,
    )


def test_type_missing_from_the_catalogue(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_EC2_ALLOWED_TYPES=json.dumps({"t3.micro": {"ami_id": "ami-12345678"}}))
    with pytest.raises(ConfigurationError, match=r"t3\.micro is not in the catalogue"):
        policy_from_settings(load_settings(), CATALOGUE)


@pytest.mark.parametrize("overhead", [{"cpus": 2}, {"ram_gib": 4}, {"gpus": 1}])
def test_overhead_that_leaves_no_room_is_refused(set_env: SetEnv, overhead: dict[str, float]) -> None:
    set_env(
        AUTOSCALER_EC2_ALLOWED_TYPES=json.dumps(
            {"c5.large": {"ami_id": "ami-12345678", "overhead": overhead}}
        )
    )
    with pytest.raises(ConfigurationError, match="leaves no room for work"):
        policy_from_settings(load_settings(), CATALOGUE)


def test_works_with_the_bundled_catalogue(set_env: SetEnv) -> None:
    from swarm_autoscaler.core.catalogue import CATALOGUE as BUNDLED

    set_env()
    policy = policy_from_settings(load_settings(), BUNDLED)
    assert [t.name for t in policy.allowed_types] == ["m5.large"]


def test_the_launch_spec_changes_with_what_a_machine_is_launched_with_and_only_that() -> None:
    """Drift (core/drift.py) compares it: the AMI, the boot script, the capacity, the subnets and the
    security groups change it; the planner's own settings of the type do not."""
    base = AllowedType(ami_id="ami-12345678")
    spec = launch_spec(base, ("subnet-a",), ("sg-1",))
    same = AllowedType(ami_id="ami-12345678", reserve=2, min=1, price_per_hour=0.2, surge_above=3)
    assert launch_spec(same, ("subnet-a",), ("sg-1",)) == spec
    changed = [
        launch_spec(AllowedType(ami_id="ami-87654321"), ("subnet-a",), ("sg-1",)),
        launch_spec(AllowedType(ami_id="ami-12345678", boot_script="echo patched"), ("subnet-a",), ("sg-1",)),
        launch_spec(
            AllowedType(ami_id="ami-12345678", capacity=["spot", "on-demand"]), ("subnet-a",), ("sg-1",)
        ),
        launch_spec(base, ("subnet-b",), ("sg-1",)),
        launch_spec(base, ("subnet-a",), ("sg-2",)),
    ]
    assert spec not in changed and len(set(changed)) == len(changed)


def test_workers_publish_the_ram_the_policy_counts(set_env: SetEnv) -> None:
    """The memory overhead setting: the worker env file of a type (what its machine's worker publishes
    and uses as its memory limit) carries the RAM the planner counts for that type, and 0 publishes all."""
    from swarm_autoscaler.config.worker import worker_env

    for percent, kept in (("10", round(8 * GIB * 0.10)), ("0", 0)):
        set_env(
            AUTOSCALER_EC2_ALLOWED_TYPES=json.dumps({"m5.large": {"ami_id": "ami-12345678"}}),
            AUTOSCALER_EC2_MEMORY_OVERHEAD_PERCENT=percent,
        )
        settings = load_settings()
        policy = policy_from_settings(settings, CATALOGUE)
        tp = policy.type_policy("m5.large")
        assert tp is not None and tp.overhead.ram == kept
        env = worker_env(
            CATALOGUE["m5.large"], settings.ec2.allowed_types["m5.large"], memory_percent=float(percent)
        )
        assert env["SWARM_AUTOSCALER_WORKER_MEMORY_LIMIT"] == str(8 * GIB - kept)
        assert f"RAM={8 * GIB - kept} " in env["SWARM_AUTOSCALER_WORKER_RESOURCES"]
