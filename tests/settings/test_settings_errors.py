"""Validation at start-up: each cross-field rule, and the operator-facing error lines."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from swarm_autoscaler.config.settings import InvalidSettingsError, load_settings
from swarm_autoscaler.errors import ConfigurationError

SetEnv = Callable[..., None]


def problems(set_env: SetEnv, **values: str | None) -> list[str]:
    set_env(**values)
    with pytest.raises(InvalidSettingsError) as caught:
        load_settings()
    assert isinstance(caught.value, ConfigurationError)
    return list(caught.value.problems)


def types(**reserves: int) -> str:
    return json.dumps(
        {name.replace("_", "."): {"ami_id": "ami-12345678", "reserve": r} for name, r in reserves.items()}
    )


def test_min_above_max(set_env: SetEnv) -> None:
    assert problems(set_env, AUTOSCALER_EC2_MIN_INSTANCES="5", AUTOSCALER_EC2_MAX_INSTANCES="2") == [
        "AUTOSCALER_EC2_MAX_INSTANCES: must be at least AUTOSCALER_EC2_MIN_INSTANCES (5), got '2'"
    ]


def test_min_equal_max_is_fine(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_EC2_MIN_INSTANCES="3", AUTOSCALER_EC2_MAX_INSTANCES="3")
    assert load_settings().ec2.max_instances == 3


def test_reserves_above_max(set_env: SetEnv) -> None:
    assert problems(
        set_env, AUTOSCALER_EC2_ALLOWED_TYPES=types(m5_large=2, c5_large=2), AUTOSCALER_EC2_MAX_INSTANCES="3"
    ) == [
        "AUTOSCALER_EC2_MAX_INSTANCES: must be at least the sum of the reserves in "
        "AUTOSCALER_EC2_ALLOWED_TYPES (4), got '3'"
    ]


def test_reserves_equal_to_max_are_fine(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_EC2_ALLOWED_TYPES=types(m5_large=2, c5_large=2), AUTOSCALER_EC2_MAX_INSTANCES="4")
    assert sum(t.reserve for t in load_settings().ec2.allowed_types.values()) == 4


def test_no_allowed_type(set_env: SetEnv) -> None:
    assert problems(set_env, AUTOSCALER_EC2_ALLOWED_TYPES="{}") == [
        "AUTOSCALER_EC2_ALLOWED_TYPES: expected at least one allowed instance type"
    ]


def test_a_malformed_instance_type_name(set_env: SetEnv) -> None:
    # m5.huge is a well-formed name: whether the region offers it is EC2's to say, at start
    assert problems(set_env, AUTOSCALER_EC2_ALLOWED_TYPES=types(m5_large=0, m5_huge=0, banana=0)) == [
        "AUTOSCALER_EC2_ALLOWED_TYPES: not EC2 instance type names: banana "
        "(expected a family and a size, like m7i.large)"
    ]


def test_backoff_initial_above_max(set_env: SetEnv) -> None:
    assert problems(
        set_env, AUTOSCALER_CAPACITY_BACKOFF_INITIAL="5m", AUTOSCALER_CAPACITY_BACKOFF_MAX="1m"
    ) == [
        "AUTOSCALER_CAPACITY_BACKOFF_MAX: must be at least AUTOSCALER_CAPACITY_BACKOFF_INITIAL (5m), got '1m'"
    ]


def test_credentials_come_in_pairs(set_env: SetEnv) -> None:
    lines = problems(set_env, AUTOSCALER_EC2_ACCESS_KEY_ID="AKIAONLYID")
    assert lines == [
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY: set both AUTOSCALER_EC2_ACCESS_KEY_ID and "
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY, or neither"
    ]
    assert "AKIAONLYID" not in "".join(lines)


def test_bad_duration_names_the_variable(set_env: SetEnv) -> None:
    assert problems(set_env, AUTOSCALER_POLL_INTERVAL="banana") == [
        "AUTOSCALER_POLL_INTERVAL: expected a duration like 30, 30s, 5m or 1h30m, got 'banana'"
    ]


def test_missing_required_variables_are_each_named(set_env: SetEnv) -> None:
    lines = problems(
        set_env,
        AUTOSCALER_CLUSTER_NAME=None,
        AUTOSCALER_DASK_SCHEDULER_URL=None,
        AUTOSCALER_EC2_ALLOWED_TYPES=None,
    )
    assert sorted(lines) == [
        "AUTOSCALER_CLUSTER_NAME: required but not set",
        "AUTOSCALER_DASK_SCHEDULER_URL: required but not set",
        "AUTOSCALER_EC2_ALLOWED_TYPES: required but not set",
    ]


def test_every_problem_at_once_one_line_per_variable(set_env: SetEnv) -> None:
    bad_types = json.dumps({"m5.large": {"ami_id": "nope", "reserve": -1, "colour": "red"}})
    lines = problems(
        set_env,
        AUTOSCALER_CLUSTER_NAME="bad name!",
        AUTOSCALER_POLL_INTERVAL="-5s",
        AUTOSCALER_EC2_ALLOWED_TYPES=bad_types,
        AUTOSCALER_EC2_SUBNET_IDS="[oops",
        AUTOSCALER_EC2_CUSTOM_TAGS='{"aws:owner": "me"}',
        AUTOSCALER_EC2_ENDPOINT="ftp://x",
        AUTOSCALER_DASK_SCHEDULER_URL="scheduler:8786",
        AUTOSCALER_DASK_WORKER_HOSTNAME_PATTERN="(?P<host>.+)",
        AUTOSCALER_LOG_FORMAT="xml",
        AUTOSCALER_HTTP_PORT="http",
    )
    named = [line.split(":", 1)[0] for line in lines]
    assert named == [
        "AUTOSCALER_CLUSTER_NAME",
        "AUTOSCALER_POLL_INTERVAL",
        "AUTOSCALER_EC2_ENDPOINT",  # the EC2 access fields (shared with the keeper) come first
        "AUTOSCALER_EC2_SUBNET_IDS",
        "AUTOSCALER_EC2_CUSTOM_TAGS",
        "AUTOSCALER_EC2_ALLOWED_TYPES",
        "AUTOSCALER_DASK_SCHEDULER_URL",
        "AUTOSCALER_DASK_WORKER_HOSTNAME_PATTERN",
        "AUTOSCALER_LOG_FORMAT",
        "AUTOSCALER_HTTP_PORT",
    ]
    by_name = dict(line.split(": ", 1) for line in lines)
    assert by_name["AUTOSCALER_EC2_ALLOWED_TYPES"] == (
        "m5.large.ami_id: expected an AMI id like ami-0123456789abcdef0, got 'nope'; "
        "m5.large.reserve: expected greater than or equal to 0, got -1; m5.large.colour: unknown key"
    )
    assert by_name["AUTOSCALER_DASK_WORKER_HOSTNAME_PATTERN"].startswith(
        "expected a regular expression with a group (?P<hostname>...)"
    )
    assert by_name["AUTOSCALER_LOG_FORMAT"] == "expected 'json' or 'console', got 'xml'"


@pytest.mark.parametrize(
    ("variable", "secret"),
    [
        ("AUTOSCALER_REDIS_URL", "http://:hunter2@redis:6379"),
        ("AUTOSCALER_REDIS_URL", "hunter2"),
    ],
)
def test_secrets_are_never_echoed(set_env: SetEnv, variable: str, secret: str) -> None:
    lines = problems(set_env, **{variable: secret})
    assert lines == [f"{variable}: expected a URL like redis://host:6379/0"]
    assert "hunter2" not in "".join(lines)


def test_dynamic_mode_starts_without_a_scheduler(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_MODE="dynamic", AUTOSCALER_DASK_SCHEDULER_URL=None)
    settings = load_settings()
    assert (settings.mode, settings.dask.scheduler_url) == ("dynamic", None)


def test_the_computational_mode_needs_a_scheduler(set_env: SetEnv) -> None:
    assert problems(set_env, AUTOSCALER_MODE="computational", AUTOSCALER_DASK_SCHEDULER_URL=None) == [
        "AUTOSCALER_DASK_SCHEDULER_URL: required but not set"
    ]


def test_an_unknown_mode_is_one_line(set_env: SetEnv) -> None:
    assert problems(set_env, AUTOSCALER_MODE="services") == [
        "AUTOSCALER_MODE: expected 'computational' or 'dynamic', got 'services'"
    ]
