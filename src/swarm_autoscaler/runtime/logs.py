"""Logging: structlog, one JSON object per line by default or a console renderer for humans.

Every event passes through `redact_secrets` before it is rendered, so a secret that reaches a log call
by accident (a `SecretStr`, a value under a key like `password` or `join_token`, a credential inside a
URL such as `redis://:pw@host`) is masked. Records of the standard `logging` module (botocore,
distributed, ...) are rendered by the same chain. A command that cannot start (a wrong setting, an
endpoint that refuses) says why in a `startup_line`, in the same format.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal, TextIO

import structlog
from pydantic import SecretBytes, SecretStr
from structlog.typing import Processor

REDACTED = "**********"

_SECRET_KEY = re.compile(r"secret|password|passwd|token|access_key|authorization|credential", re.IGNORECASE)
# scheme://userinfo@ : userinfo is "user:password" or a bare token; either way it is a credential.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<userinfo>[^\s/@]+)@", re.IGNORECASE)
_HANDLER_MARK = "_swarm_autoscaler_handler"
_QUIET_LOGGERS = ("botocore", "aiobotocore", "urllib3", "asyncio")
# Libraries that give their loggers a handler of their own when imported before logging is configured
# (distributed's import does, for itself, bokeh and tornado): their lines would bypass the format and
# the redaction. Their levels are kept; their handlers go, and their records reach the root's handler.
_ADOPTED_LOGGERS = ("distributed", "bokeh", "tornado")


def redact_text(text: str) -> str:
    """`text` with the credentials of any URL in it masked; a username before a password is kept."""

    def mask(match: re.Match[str]) -> str:
        user, colon, _ = match.group("userinfo").partition(":")
        shown = f"{user}:{REDACTED}" if colon and user else REDACTED
        return f"{match.group('scheme')}{shown}@"

    return _URL_USERINFO.sub(mask, text)


def _redact(key: str, value: Any) -> Any:
    if _SECRET_KEY.search(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, SecretStr | SecretBytes):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: _redact(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact("", item) for item in value]
    return value


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask values under secret-like keys, `SecretStr` values and URL credentials,
    at any depth of nested mappings and sequences."""
    return {key: _redact(key, value) for key, value in event_dict.items()}


def _renderer(fmt: str, stream: TextIO) -> Processor:
    if fmt == "console":
        colors = stream.isatty()
        return structlog.dev.ConsoleRenderer(colors=colors, exception_formatter=structlog.dev.plain_traceback)
    return structlog.processors.JSONRenderer(default=str)


def configure_logging(
    level: str | int = "INFO", fmt: Literal["json", "console"] | str = "json", stream: TextIO | None = None
) -> None:
    """Configure structlog and the standard `logging` module.

    `level` is a name (`INFO`) or a number; `fmt` is `json` (one object per line) or `console`. Output
    goes to `stream` (default: standard error, so that command output on standard output stays clean).
    Safe to call again: it replaces only what an earlier call installed.
    """
    out = stream if stream is not None else sys.stderr
    number = level if isinstance(level, int) else logging.getLevelNamesMapping()[level.upper()]
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        # Tracebacks become text before redaction, so URLs inside exception messages are masked too.
        structlog.processors.format_exc_info,
        redact_secrets,
    ]
    renderer = _renderer(fmt, out)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    _configure_stdlib(number, out, shared, renderer)


def _configure_stdlib(number: int, out: TextIO, shared: list[Processor], renderer: Processor) -> None:
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared[:-1]],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, redact_secrets, renderer],
        )
    )
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(number)
    # Python warnings (say, distributed's version-mismatch warning) become log records too: every line
    # on standard error is then in the chosen format (one JSON object per line for `json`).
    logging.captureWarnings(True)
    _adopt_vendor_loggers()
    # SDK chatter (request signing, connection pools) only when debugging.
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(number if number <= logging.DEBUG else max(number, logging.WARNING))


def _adopt_vendor_loggers() -> None:
    names = [
        name
        for name in list(logging.root.manager.loggerDict)
        if any(name == vendor or name.startswith(vendor + ".") for vendor in _ADOPTED_LOGGERS)
    ]
    for name in names:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


def startup_line(text: str, fmt: str, level: Literal["error", "warning"] = "error") -> str:
    """The line a command prints on standard error when it cannot start, or warns before it starts.

    `fmt` is the log format the settings ask for: for `json`, one JSON object with the keys of every
    log line (`event`, `level`, `timestamp`), so that whoever reads the logs as JSON lines reads this one
    too; otherwise `text` as it is. One line either way (an endpoint may answer with a page of text),
    never a traceback, and URL credentials masked (`redact_text`); callers put no other secret in it.
    This does not go through the logger: its level (say `CRITICAL`) must not hide why the command
    stopped, and logging may not be configured yet (the settings that configure it may be the wrong
    ones)."""
    one = " ".join(redact_text(text).split())
    if fmt != "json":
        return one
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    return json.dumps(stamp(None, level, {"event": one, "level": level}))
