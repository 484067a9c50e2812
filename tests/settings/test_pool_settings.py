"""Per-type base ("min") and warm pool ("warm_pool") in AUTOSCALER_EC2_ALLOWED_TYPES: parsed into the
policy, and refused at start-up with one line naming the variable when they cannot fit the maximum."""

from __future__ import annotations

import json

import pytest
from tests.settings.conftest import SetEnv

from swarm_autoscaler.config.policy import policy_from_settings
from swarm_autoscaler.config.settings import InvalidSettingsError, load_settings
from swarm_autoscaler.core.catalogue import CATALOGUE


def _types(**specs: dict[str, int]) -> str:
    return json.dumps({name.replace("_", "."): {"ami_id": "ami-12345678", **s} for name, s in specs.items()})


def _problems(set_env: SetEnv, **env: str) -> list[str]:
    set_env(**env)
    with pytest.raises(InvalidSettingsError) as caught:
        load_settings()
    return list(caught.value.problems)


def test_pool_and_base_reach_the_policy(set_env: SetEnv) -> None:
    set_env(
        AUTOSCALER_EC2_ALLOWED_TYPES=_types(g4dn_xlarge={"min": 1, "warm_pool": 3}, m5_large={}),
        AUTOSCALER_EC2_MAX_INSTANCES="6",
    )
    policy = policy_from_settings(load_settings(), CATALOGUE)
    gpu, cpu = policy.allowed_types
    assert (gpu.name, gpu.minimum, gpu.warm_pool) == ("g4dn.xlarge", 1, 3)
    assert (cpu.minimum, cpu.warm_pool) == (0, 0)


def test_bases_and_reserves_above_the_maximum(set_env: SetEnv) -> None:
    assert _problems(
        set_env,
        AUTOSCALER_EC2_ALLOWED_TYPES=_types(m5_large={"min": 2, "reserve": 1}, c5_large={"min": 1}),
        AUTOSCALER_EC2_MAX_INSTANCES="3",
    ) == [
        'AUTOSCALER_EC2_MAX_INSTANCES: must be at least the sum of the "min" and "reserve" of every type in '
        "AUTOSCALER_EC2_ALLOWED_TYPES (4), got '3'"
    ]


def test_pools_above_the_maximum(set_env: SetEnv) -> None:
    assert _problems(
        set_env,
        AUTOSCALER_EC2_ALLOWED_TYPES=_types(m5_large={"warm_pool": 2}, c5_large={"warm_pool": 2}),
        AUTOSCALER_EC2_MAX_INSTANCES="3",
    ) == [
        'AUTOSCALER_EC2_MAX_INSTANCES: must be at least the sum of the "warm_pool" of every type in '
        "AUTOSCALER_EC2_ALLOWED_TYPES (4): a started pool machine counts toward it, got '3'"
    ]


def test_pools_and_bases_equal_to_the_maximum_are_fine(set_env: SetEnv) -> None:
    set_env(
        AUTOSCALER_EC2_ALLOWED_TYPES=_types(m5_large={"warm_pool": 3, "min": 3}),
        AUTOSCALER_EC2_MAX_INSTANCES="3",
    )
    assert load_settings().ec2.allowed_types["m5.large"].warm_pool == 3


def test_a_negative_pool_names_the_variable(set_env: SetEnv) -> None:
    found = _problems(set_env, AUTOSCALER_EC2_ALLOWED_TYPES=_types(m5_large={"warm_pool": -1}))
    assert len(found) == 1
    assert found[0].startswith("AUTOSCALER_EC2_ALLOWED_TYPES: m5.large.warm_pool: ")


def test_spot_first_with_a_spot_price_is_what_the_cheapest_fit_pays(set_env: SetEnv) -> None:
    spot = {"capacity": ["spot", "on-demand"], "spot_price_per_hour": 0.2}
    set_env(
        AUTOSCALER_EC2_ALLOWED_TYPES=json.dumps(
            {
                "g4dn.xlarge": {"ami_id": "ami-12345678", **spot},
                "m5.large": {"ami_id": "ami-12345678", "spot_price_per_hour": 0.03},  # on-demand only
            }
        )
    )
    settings = load_settings()
    assert settings.ec2.allowed_types["m5.large"].capacity == ["on-demand"]  # the default: nothing changes
    gpu, cpu = policy_from_settings(settings, CATALOGUE).allowed_types
    assert (gpu.price_per_hour, cpu.price_per_hour) == (0.2, None)


@pytest.mark.parametrize("capacity", ["[]", '["spot", "spot"]', '["reserved"]'])
def test_a_capacity_list_that_is_empty_repeats_or_names_no_capacity_is_refused(
    set_env: SetEnv, capacity: str
) -> None:
    types = '{"m5.large": {"ami_id": "ami-12345678", "capacity": ' + capacity + "}}"
    [problem] = _problems(set_env, AUTOSCALER_EC2_ALLOWED_TYPES=types)
    assert problem.startswith("AUTOSCALER_EC2_ALLOWED_TYPES") and "capacity" in problem
