"""Start-up mistakes that used to be accepted, or to end in a traceback: each is refused at start with one
line naming the variable (or the env file), exit 2, before the daemon logs anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.startup import startup_events

from swarm_autoscaler.adapters import ec2, ec2_support
from swarm_autoscaler.config import types
from swarm_autoscaler.config.settings import InvalidSettingsError, load_settings

SetEnv = Callable[..., None]
SCRIPT = Path(sys.executable).parent / "swarm-autoscaler"

VALID = {
    "AUTOSCALER_CLUSTER_NAME": "analytics",
    "AUTOSCALER_DASK_SCHEDULER_URL": "tcp://scheduler:8786",
    "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps({"m5.large": {"ami_id": "ami-12345678"}}),
}


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUTOSCALER_")}
    return subprocess.run(
        [str(SCRIPT), *args], env={**base, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def one_configuration_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line of a refused start (its event: the default log format is json): exit 2, nothing
    on stdout, no traceback, no log line."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == ""
    lines = startup_events(result.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("configuration error: "), lines
    return lines[0].removeprefix("configuration error: ")


def allowed(**spec: object) -> str:
    return json.dumps({"m5.large": {"ami_id": "ami-12345678", **spec}})


# Each mistake: the variables, then the start of the one line that must name it.
MISTAKES = {
    "huge max instances": (
        {"AUTOSCALER_EC2_MAX_INSTANCES": "1" + "0" * 40},
        "AUTOSCALER_EC2_MAX_INSTANCES: expected less than or equal to 10000",
    ),
    "huge reserve": (
        {"AUTOSCALER_EC2_ALLOWED_TYPES": allowed(reserve=10**40)},
        "AUTOSCALER_EC2_ALLOWED_TYPES: m5.large.reserve: expected less than or equal to 10000",
    ),
    "huge duration": (
        {"AUTOSCALER_DRAIN_DELAY": "1" + "0" * 40},
        "AUTOSCALER_DRAIN_DELAY: expected a duration of at most 365d",
    ),
    "overhead larger than the machine": (
        {"AUTOSCALER_EC2_ALLOWED_TYPES": allowed(overhead={"cpus": 4})},
        "AUTOSCALER_EC2_ALLOWED_TYPES: the overhead of m5.large (4 CPUs, 0 GiB RAM, 0 GPUs) leaves no room "
        "for work on its machine (2 CPUs, 8 GiB RAM, 0 GPUs); lower it",
    ),
    "overhead taking all the RAM": (
        {"AUTOSCALER_EC2_ALLOWED_TYPES": allowed(overhead={"ram_gib": 8})},
        "AUTOSCALER_EC2_ALLOWED_TYPES: the overhead of m5.large (0 CPUs, 8 GiB RAM, 0 GPUs) leaves no room",
    ),
    "boot script over EC2's user data limit": (
        {"AUTOSCALER_EC2_ALLOWED_TYPES": allowed(boot_script="echo hello\n" * 1500)},
        "AUTOSCALER_EC2_ALLOWED_TYPES: m5.large.boot_script: expected at most 14336 bytes (EC2's 16 KiB of "
        "user data, less room for the swarm join appended to it), got 16500 bytes",
    ),
    "lock TTL shorter than two polls": (
        {
            "AUTOSCALER_REDIS_URL": "redis://redis:6379/0",
            "AUTOSCALER_POLL_INTERVAL": "10s",
            "AUTOSCALER_REDIS_LOCK_TTL": "15s",
        },
        "AUTOSCALER_REDIS_LOCK_TTL: must be at least twice AUTOSCALER_POLL_INTERVAL (20s) so the leader "
        "keeps the lock between two ticks, got 15s",
    ),
    "scheduler port 99999": (
        {"AUTOSCALER_DASK_SCHEDULER_URL": "tcp://scheduler:99999"},
        "AUTOSCALER_DASK_SCHEDULER_URL: expected a URL like tcp://scheduler:8786 with a port from 1 to 65535",
    ),
    "redis port not a number": (
        {"AUTOSCALER_REDIS_URL": "redis://:hunter2@redis:sixthree/0"},
        "AUTOSCALER_REDIS_URL: expected a URL like redis://host:6379/0 with a port from 1 to 65535",
    ),
    "docker port 0": (
        {"AUTOSCALER_DOCKER_URL": "tcp://manager:0"},
        "AUTOSCALER_DOCKER_URL: expected a URL like unix:///var/run/docker.sock with a port from 1 to 65535",
    ),
    "reserved custom tag": (
        {"AUTOSCALER_EC2_CUSTOM_TAGS": json.dumps({"team": "data", "managed-by": "me"})},
        "AUTOSCALER_EC2_CUSTOM_TAGS: tag key 'managed-by' is reserved for the autoscaler's own tags",
    ),
    "custom tag in the label namespace": (
        {"AUTOSCALER_EC2_CUSTOM_TAGS": json.dumps({"swarm-autoscaler/label/x": "1"})},
        "AUTOSCALER_EC2_CUSTOM_TAGS: tag key 'swarm-autoscaler/label/x' is reserved",
    ),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_each_mistake_is_refused_in_one_line_naming_the_variable(name: str) -> None:
    values, expected = MISTAKES[name]
    line = one_configuration_line(run_cli("run", **{**VALID, **values}))
    assert line.startswith(expected), line
    assert "hunter2" not in line


def test_the_limits_are_not_in_the_way_of_real_values(set_env: SetEnv) -> None:
    set_env(
        **{
            "AUTOSCALER_EC2_MAX_INSTANCES": "10000",
            "AUTOSCALER_EC2_ALLOWED_TYPES": allowed(
                overhead={"cpus": 1.5, "ram_gib": 7.5}, boot_script="x" * types.BOOT_SCRIPT_LIMIT
            ),
            "AUTOSCALER_REDIS_URL": "redis://redis:6379/0",
            "AUTOSCALER_POLL_INTERVAL": "10s",
            "AUTOSCALER_REDIS_LOCK_TTL": "20s",
            "AUTOSCALER_DRAIN_DELAY": "365d",
            "AUTOSCALER_EC2_CUSTOM_TAGS": json.dumps({"team": "data", "Names": "x"}),
        }
    )
    settings = load_settings()
    assert settings.ec2.max_instances == 10000 and settings.redis.lock_ttl == 20.0


def test_a_short_ttl_is_fine_without_redis(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_POLL_INTERVAL="1m")
    assert load_settings().redis.lock_ttl == 30.0  # the default TTL, unused by a single replica


def test_the_boot_script_limit_leaves_room_for_the_longest_join() -> None:
    # A real worker token is 85 characters; an IPv6 manager address with its port at most 47.
    token, address = "SWMTKN-1-" + "a" * 50 + "-" + "b" * 25, "[" + "f" * 39 + "]:2377"
    rendered = ec2_support.render_user_data("x" * types.BOOT_SCRIPT_LIMIT, token, address)
    assert len(rendered.encode()) <= ec2_support.USER_DATA_LIMIT == types.USER_DATA_LIMIT


def test_the_reserved_tag_keys_are_the_ones_the_ec2_adapter_writes() -> None:
    assert set(types.RESERVED_TAG_KEYS) == {ec2.OWNER_TAG, ec2.CLUSTER_TAG, ec2.NAME_TAG}
    assert ec2_support.LABEL_TAG_PREFIX.startswith(types.RESERVED_TAG_PREFIXES)
    assert "aws:" in types.RESERVED_TAG_PREFIXES


def test_an_env_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    env = tmp_path / "latin1.env"
    env.write_bytes(b"AUTOSCALER_CLUSTER_NAME=analytics\nAUTOSCALER_EC2_KEY_NAME=caf\xe9\n")
    line = one_configuration_line(run_cli("run", "--env-file", str(env)))
    assert line == f"env file {str(env)!r}: line 2 is not UTF-8 text; save it as UTF-8"


def test_an_env_file_with_an_unterminated_quote_is_one_line_naming_the_line(tmp_path: Path) -> None:
    env = tmp_path / "quote.env"
    lines = [f"{k}='{v}'" for k, v in VALID.items()]
    lines.insert(1, 'AUTOSCALER_EC2_REGION="eu-west-1')  # never closed: the parser would skip the rest
    env.write_text("\n".join(lines) + "\n")
    result = run_cli("status", "--env-file", str(env))
    line = one_configuration_line(result)
    assert (
        line == f"env file {str(env)!r}: line 2 cannot be parsed (an unterminated quote?); fix or remove it"
    )
    assert "python-dotenv" not in result.stderr and "required but not set" not in result.stderr


def test_a_missing_env_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidSettingsError) as caught:
        load_settings(tmp_path / "nope.env")
    assert caught.value.problems == (f"env file {str(tmp_path / 'nope.env')!r} not found",)
