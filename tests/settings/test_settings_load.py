"""Settings read from the environment (and env files): values, defaults, groups and key order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from swarm_autoscaler.config.settings import InvalidSettingsError, Settings, load_settings
from swarm_autoscaler.config.variables import unknown_variables

SetEnv = Callable[..., None]


def test_full_environment_gives_expected_settings(set_env: SetEnv) -> None:
    set_env(
        AUTOSCALER_POLL_INTERVAL="2s",
        AUTOSCALER_MAX_START_TIME="15m",
        AUTOSCALER_DRAIN_DELAY="90",
        AUTOSCALER_TERMINATION_DELAY="1h30m",
        AUTOSCALER_NODE_DOWN_TIMEOUT="250ms",
        AUTOSCALER_CAPACITY_BACKOFF_INITIAL="10s",
        AUTOSCALER_CAPACITY_BACKOFF_MAX="20m",
        AUTOSCALER_EC2_ENDPOINT="http://127.0.0.1:5000",
        AUTOSCALER_EC2_REGION="eu-west-1",
        AUTOSCALER_EC2_ACCESS_KEY_ID="AKIAEXAMPLE",
        AUTOSCALER_EC2_SECRET_ACCESS_KEY="s3cr3t",
        AUTOSCALER_EC2_ALLOWED_TYPES=json.dumps(
            {
                "m5.large": {
                    "ami_id": "ami-0123456789abcdef0",
                    "reserve": 2,
                    "price_per_hour": 0.1,
                    "overhead": {"cpus": 0.5, "ram_gib": 1.5},
                    "boot_script": "echo hi",
                }
            }
        ),
        AUTOSCALER_EC2_MIN_INSTANCES="1",
        AUTOSCALER_EC2_MAX_INSTANCES="20",
        AUTOSCALER_EC2_MAX_LAUNCH_PER_TICK="4",
        AUTOSCALER_EC2_SUBNET_IDS="subnet-a, subnet-b",
        AUTOSCALER_EC2_SECURITY_GROUP_IDS='["sg-1"]',
        AUTOSCALER_EC2_KEY_NAME="ops",
        AUTOSCALER_EC2_IAM_INSTANCE_PROFILE="worker-profile",
        AUTOSCALER_EC2_CUSTOM_TAGS='{"team": "data"}',
        AUTOSCALER_DASK_WORKER_HOSTNAME_PATTERN=r"^worker-(?P<hostname>[^-]+)-\d+$",
        AUTOSCALER_REDIS_URL="redis://:pw@redis:6379/0",
        AUTOSCALER_REDIS_LOCK_TTL="45s",
        AUTOSCALER_DOCKER_URL="tcp://manager:2375",
        AUTOSCALER_LOG_LEVEL="debug",
        AUTOSCALER_LOG_FORMAT="console",
        AUTOSCALER_HTTP_PORT="0",
        AUTOSCALER_HTTP_HOST="127.0.0.1",
    )
    s = load_settings()
    assert s.cluster_name == "analytics"
    assert (s.timing.poll_interval, s.timing.max_start_time, s.timing.drain_delay) == (2.0, 900.0, 90.0)
    assert (s.timing.termination_delay, s.timing.node_down_timeout) == (5400.0, 0.25)
    assert (s.timing.capacity_backoff_initial, s.timing.capacity_backoff_max) == (10.0, 1200.0)
    assert (s.ec2.endpoint, s.ec2.region) == ("http://127.0.0.1:5000", "eu-west-1")
    assert s.ec2.access_key_id is not None and s.ec2.access_key_id.get_secret_value() == "AKIAEXAMPLE"
    assert s.ec2.secret_access_key is not None and s.ec2.secret_access_key.get_secret_value() == "s3cr3t"
    large = s.ec2.allowed_types["m5.large"]
    assert (large.ami_id, large.reserve, large.price_per_hour, large.boot_script) == (
        "ami-0123456789abcdef0",
        2,
        0.1,
        "echo hi",
    )
    assert (large.overhead.cpus, large.overhead.ram_gib, large.overhead.gpus) == (0.5, 1.5, 0)
    assert (s.ec2.min_instances, s.ec2.max_instances, s.ec2.max_launch_per_tick) == (1, 20, 4)
    assert s.ec2.subnet_ids == ["subnet-a", "subnet-b"]
    assert s.ec2.security_group_ids == ["sg-1"]
    assert (s.ec2.key_name, s.ec2.iam_instance_profile, s.ec2.custom_tags) == (
        "ops",
        "worker-profile",
        {"team": "data"},
    )
    assert s.dask.scheduler_url == "tcp://scheduler:8786"
    assert s.dask.hostname_of("worker-ip-10-0-0-1-3") is None
    assert s.dask.hostname_of("worker-node7-3") == "node7"
    assert s.redis.url is not None and s.redis.url.get_secret_value() == "redis://:pw@redis:6379/0"
    assert "pw" not in repr(s) and "s3cr3t" not in repr(s)
    assert s.redis.lock_ttl == 45.0
    assert s.docker.url == "tcp://manager:2375"
    assert (s.logging.level, s.logging.format) == ("DEBUG", "console")
    assert (s.http.port, s.http.host) == (0, "127.0.0.1")


def test_defaults(set_env: SetEnv) -> None:
    set_env()
    s = load_settings()
    assert (s.timing.poll_interval, s.timing.max_start_time, s.timing.drain_delay) == (5.0, 600.0, 60.0)
    assert (s.timing.termination_delay, s.timing.node_down_timeout) == (60.0, 300.0)
    assert (s.timing.capacity_backoff_initial, s.timing.capacity_backoff_max) == (180.0, 600.0)
    assert s.ec2.endpoint is None and s.ec2.access_key_id is None and s.ec2.secret_access_key is None
    assert (s.ec2.min_instances, s.ec2.max_instances, s.ec2.subnet_ids, s.ec2.custom_tags) == (0, 10, [], {})
    assert s.ec2.allowed_types["m5.large"].reserve == 0
    assert s.dask.hostname_of("ip-10-0-0-1") == "ip-10-0-0-1"
    assert (s.redis.url, s.redis.lock_ttl) == (None, 30.0)
    assert s.docker.url == "unix:///var/run/docker.sock"
    assert (s.logging.level, s.logging.format, s.http.port, s.http.host) == ("INFO", "json", 8000, "0.0.0.0")


def test_plain_constructor_reads_every_group_from_the_environment(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_POLL_INTERVAL="7s", AUTOSCALER_HTTP_PORT="9000")
    s = Settings()  # type: ignore[call-arg]  # cluster_name comes from the environment
    assert (s.cluster_name, s.timing.poll_interval, s.http.port) == ("analytics", 7.0, 9000)
    assert s == load_settings()


def test_allowed_types_keep_their_order(set_env: SetEnv) -> None:
    names = ["t3.micro", "r5.large", "c5.xlarge", "m5.large"]  # deliberately not sorted
    set_env(AUTOSCALER_EC2_ALLOWED_TYPES=json.dumps({n: {"ami_id": "ami-12345678"} for n in names}))
    assert list(load_settings().ec2.allowed_types) == names


def test_empty_values_mean_unset(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_EC2_KEY_NAME="", AUTOSCALER_POLL_INTERVAL="", AUTOSCALER_EC2_SUBNET_IDS="")
    s = load_settings()
    assert (s.ec2.key_name, s.timing.poll_interval, s.ec2.subnet_ids) == (None, 5.0, [])


def test_env_file_is_read_and_the_environment_wins(
    set_env: SetEnv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env_file = tmp_path / "autoscaler.env"
    env_file.write_text(
        "AUTOSCALER_CLUSTER_NAME=from-file\n"
        "AUTOSCALER_DASK_SCHEDULER_URL=tcp://file:8786\n"
        """AUTOSCALER_EC2_ALLOWED_TYPES='{"c5.large": {"ami_id": "ami-12345678"}}'\n"""
        "AUTOSCALER_DRAIN_DELAY=3m\n"
        "AUTOSCALER_HTTP_PORT=1234\n"
    )
    monkeypatch.setenv("AUTOSCALER_HTTP_PORT", "4321")
    s = load_settings(env_file)
    assert (s.cluster_name, s.dask.scheduler_url, list(s.ec2.allowed_types)) == (
        "from-file",
        "tcp://file:8786",
        ["c5.large"],
    )
    assert (s.timing.drain_delay, s.http.port) == (180.0, 4321)


def test_missing_env_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidSettingsError, match="not found"):
        load_settings(tmp_path / "nope.env")


def test_unknown_variables_are_reported_with_a_suggestion(set_env: SetEnv, tmp_path: Path) -> None:
    set_env(AUTOSCALER_POLL_INTERVALL="3s")
    env_file = tmp_path / "x.env"
    env_file.write_text("AUTOSCALER_EC2_MAX_INSTANCE=3\n")
    warnings = unknown_variables(env_file)
    assert warnings == [
        "AUTOSCALER_EC2_MAX_INSTANCE is not a known variable and is ignored; "
        "did you mean AUTOSCALER_EC2_MAX_INSTANCES?",
        "AUTOSCALER_POLL_INTERVALL is not a known variable and is ignored; "
        "did you mean AUTOSCALER_POLL_INTERVAL?",
    ]
    load_settings(env_file)  # a warning, not an error
