"""The command line's settings error path, run as a real subprocess of the installed script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.startup import startup_events

from swarm_autoscaler.config.doc import env_template
from swarm_autoscaler.config.reference import settings_reference
from swarm_autoscaler.config.variables import variables

SCRIPT = Path(sys.executable).parent / "swarm-autoscaler"

VALID = {
    "AUTOSCALER_CLUSTER_NAME": "analytics",
    "AUTOSCALER_DASK_SCHEDULER_URL": "tcp://scheduler:8786",
    "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps({"m5.large": {"ami_id": "ami-12345678"}}),
}


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUTOSCALER_")}
    return subprocess.run(
        [str(SCRIPT), *args], env={**base, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def test_bad_values_exit_2_with_one_line_per_variable_and_no_traceback() -> None:
    result = run(
        "run",
        **VALID,
        AUTOSCALER_POLL_INTERVAL="banana",
        AUTOSCALER_EC2_MAX_INSTANCES="-1",
        AUTOSCALER_REDIS_URL="http://:hunter2@redis",
        AUTOSCALER_EC2_ACCESS_KEY_ID="AKIASECRETID",
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert "hunter2" not in result.stderr and "AKIASECRETID" not in result.stderr
    assert startup_events(result.stderr) == [
        "configuration error: AUTOSCALER_POLL_INTERVAL: expected a duration like 30, 30s, 5m or 1h30m, "
        "got 'banana'",
        "configuration error: AUTOSCALER_EC2_SECRET_ACCESS_KEY: set both AUTOSCALER_EC2_ACCESS_KEY_ID and "
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY, or neither",
        "configuration error: AUTOSCALER_EC2_MAX_INSTANCES: expected greater than or equal to 0, got '-1'",
        "configuration error: AUTOSCALER_REDIS_URL: expected a URL like redis://host:6379/0",
    ]


def test_missing_required_variables_exit_2() -> None:
    result = run("plan")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert sorted(startup_events(result.stderr)) == [
        "configuration error: AUTOSCALER_CLUSTER_NAME: required but not set",
        "configuration error: AUTOSCALER_DASK_SCHEDULER_URL: required but not set",
        "configuration error: AUTOSCALER_EC2_ALLOWED_TYPES: required but not set",
    ]


def test_unknown_variable_is_a_warning_and_env_file_is_used(tmp_path: Path) -> None:
    env_file = tmp_path / "a.env"
    env_file.write_text("".join(f"{k}='{v}'\n" for k, v in VALID.items()) + "AUTOSCALER_HTTP_PORT=nope\n")
    result = run("run", "--env-file", str(env_file), AUTOSCALER_DRAIN_DELAYY="1m")
    assert result.returncode == 2
    assert startup_events(result.stderr) == [
        "configuration warning: AUTOSCALER_DRAIN_DELAYY is not a known variable and is ignored; "
        "did you mean AUTOSCALER_DRAIN_DELAY?",
        "configuration error: AUTOSCALER_HTTP_PORT: expected a valid integer, unable to parse string as an "
        "integer, got 'nope'",
    ]


SECRETS = {
    "AUTOSCALER_REDIS_URL": "redis://:hunter2@redis:6379/0",
    "AUTOSCALER_EC2_ACCESS_KEY_ID": "AKIASECRETID",
    "AUTOSCALER_EC2_SECRET_ACCESS_KEY": "s3cr3t-KEY",
}


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_refused_start_is_one_line_in_the_log_format_asked_for(fmt: str) -> None:
    """The line of a refused start follows AUTOSCALER_LOG_FORMAT: one JSON object (the keys of every log
    line) for json, the plain line for console; no traceback and no secret either way."""
    result = run("run", **VALID, **SECRETS, AUTOSCALER_LOG_FORMAT=fmt, AUTOSCALER_DRAIN_DELAY="soon")
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    assert not any(secret in result.stderr for secret in ("hunter2", "AKIASECRETID", "s3cr3t-KEY"))
    expected = "configuration error: AUTOSCALER_DRAIN_DELAY: expected a duration like 30, 30s, 5m or 1h30m, got 'soon'"
    if fmt == "json":
        assert startup_events(result.stderr) == [expected]
    else:
        assert result.stderr.splitlines() == [expected]


def test_the_log_format_is_read_on_its_own_even_when_the_log_level_is_wrong(tmp_path: Path) -> None:
    # The format from the env file (the environment has none), the level beside it wrong: still json.
    env_file = tmp_path / "a.env"
    env_file.write_text("AUTOSCALER_LOG_FORMAT=json\nAUTOSCALER_LOG_LEVEL=chatty\n")
    result = run("keeper", "--env-file", str(env_file))
    assert result.returncode == 2
    events = startup_events(result.stderr)
    assert any(e.startswith("configuration error: AUTOSCALER_LOG_LEVEL: ") for e in events), events


def test_a_wrong_log_format_is_said_in_a_plain_line() -> None:
    # The format asked for is unknown, so the line cannot be in it: plain, naming the variable.
    result = run("plan", **VALID, AUTOSCALER_LOG_FORMAT="xml")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "configuration error: AUTOSCALER_LOG_FORMAT: expected 'json' or 'console', got 'xml'"
    ]


def test_an_unreadable_env_file_is_said_in_the_format_the_environment_asks_for() -> None:
    result = run("run", "--env-file", "/nonexistent/a.env", AUTOSCALER_LOG_FORMAT="console")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["configuration error: env file '/nonexistent/a.env' not found"]
    result = run("run", "--env-file", "/nonexistent/a.env")  # the default format: json
    assert startup_events(result.stderr) == ["configuration error: env file '/nonexistent/a.env' not found"]


@pytest.mark.parametrize("markdown", [False, True])
def test_env_template_command_prints_the_generated_text(markdown: bool) -> None:
    result = run("env-template", *(["--markdown"] if markdown else []))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (settings_reference() if markdown else env_template())
    for name, *_ in variables():
        assert name in result.stdout
