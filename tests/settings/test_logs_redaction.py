"""Logging: JSON lines or console output, level filtering, and redaction of secrets."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog
from pydantic import SecretStr

from swarm_autoscaler.runtime.logs import REDACTED, configure_logging, redact_secrets, redact_text

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("redis://:pass@host:6379/0", f"redis://{REDACTED}@host:6379/0"),
        ("redis://user:pass@host", f"redis://user:{REDACTED}@host"),
        (
            "see https://ghp_token@github.com/x and tcp://h:1",
            f"see https://{REDACTED}@github.com/x and tcp://h:1",
        ),
        ("no url here: a@b", "no url here: a@b"),
        ("tcp://scheduler:8786", "tcp://scheduler:8786"),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_processor_masks_keys_secretstr_and_urls_at_any_depth() -> None:
    event = {
        "event": "connect to redis://:pw@h",
        "password": "p",
        "aws_secret_access_key": "s",
        "join_token": "SWMTKN-1",
        "Authorization": "Bearer x",
        "api_token": None,
        "count": 3,
        "nested": {"db_password": "p2", "list": [SecretStr("inner"), "rediss://:pw2@h"], "ok": "fine"},
    }
    out = redact_secrets(None, "info", event)
    assert out == {
        "event": f"connect to redis://{REDACTED}@h",
        "password": REDACTED,
        "aws_secret_access_key": REDACTED,
        "join_token": REDACTED,
        "Authorization": REDACTED,
        "api_token": None,
        "count": 3,
        "nested": {"db_password": REDACTED, "list": [REDACTED, f"rediss://{REDACTED}@h"], "ok": "fine"},
    }


def test_json_lines_are_redacted_and_filtered_by_level() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    log = structlog.get_logger()
    log.debug("not shown")
    log.info("started", url="redis://:hunter2@redis", secret_access_key=SecretStr("hunter2"), workers=2)
    try:
        raise RuntimeError("cannot reach redis://:hunter2@redis")
    except RuntimeError:
        log.exception("tick failed")
    logging.getLogger("distributed.scheduler").warning("vendor %s", "redis://:hunter2@redis")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "hunter2" not in out.getvalue()
    assert [(line["level"], line["event"]) for line in lines] == [
        ("info", "started"),
        ("error", "tick failed"),
        ("warning", f"vendor redis://{REDACTED}@redis"),
    ]
    assert lines[0]["url"] == f"redis://{REDACTED}@redis" and lines[0]["workers"] == 2
    assert lines[0]["secret_access_key"] == REDACTED and "timestamp" in lines[0]
    assert "RuntimeError: cannot reach redis://" in lines[1]["exception"]
    assert lines[2]["logger"] == "distributed.scheduler"


def test_console_format_is_not_json_and_still_redacted() -> None:
    out = io.StringIO()
    configure_logging("debug", "console", stream=out)
    structlog.get_logger().debug("hello", password="hunter2")
    text = out.getvalue()
    assert "hello" in text and f"password={REDACTED}" in text and "hunter2" not in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_reconfiguring_replaces_only_our_handler() -> None:
    foreign = logging.NullHandler()
    logging.getLogger().addHandler(foreign)
    configure_logging("INFO", "json", stream=io.StringIO())
    configure_logging("INFO", "json", stream=io.StringIO())
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_swarm_autoscaler_handler", False)]
    assert len(ours) == 1 and foreign in logging.getLogger().handlers


def test_distributed_imported_before_logging_is_configured_logs_in_the_format_redacted() -> None:
    """The keeper imports distributed before it configures logging; distributed's import then gives its
    loggers a stderr handler of their own and stops them propagating, so their lines (comm errors that
    carry URLs among them) skipped the JSON format and the redaction. Imported first here on purpose,
    whatever ran before in this process."""
    import distributed  # noqa: F401  (its import configures its loggers)

    vendor = logging.getLogger("distributed.comm")
    stray = logging.StreamHandler(io.StringIO())
    logging.getLogger("distributed").addHandler(stray)
    logging.getLogger("distributed").propagate = False
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    vendor.warning("cannot reach %s", "tls://:hunter2@scheduler:8786")
    assert stray not in logging.getLogger("distributed").handlers
    [line] = [json.loads(text) for text in out.getvalue().splitlines()]
    assert line["logger"] == "distributed.comm" and line["level"] == "warning"
    assert line["event"] == f"cannot reach tls://{REDACTED}@scheduler:8786"
    assert "hunter2" not in out.getvalue()
