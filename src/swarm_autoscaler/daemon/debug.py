"""Remote debugging of `swarm-autoscaler run` with debugpy (the `[debug]` extra).

Contract: off unless `AUTOSCALER_DEBUGPY_PORT` is set (in the environment or the `--env-file`); then
debugpy listens on `AUTOSCALER_DEBUGPY_HOST` (loopback by default: publish or tunnel deliberately) and,
with `AUTOSCALER_DEBUGPY_WAIT`, blocks until a debugger attaches, before the first tick. debugpy is
imported only then, so the runtime never loads it otherwise.
"""

from __future__ import annotations

import os

import structlog

from swarm_autoscaler.config.settings import DebugSettings
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler.extras import missing_extras

log = structlog.get_logger("swarm_autoscaler.daemon.debug")


def start_debugpy(settings: DebugSettings) -> bool:
    """Listen for a debugger when a port is set (and wait for it when asked); True when listening.

    Raises `ConfigurationError` (one line) when the port is set but debugpy is not installed, or when
    debugpy cannot listen on the address."""
    if settings.port is None:
        return False
    if missing_extras("debug"):
        raise ConfigurationError(
            "AUTOSCALER_DEBUGPY_PORT is set but debugpy is not installed: "
            "pip install 'swarm-autoscaler[debug]' (or build the image with --build-arg DEBUG=1)"
        )
    # pydevd prints a plain-text warning about frozen modules at start: keep the log JSON lines.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import debugpy

    try:
        debugpy.listen((settings.host, settings.port))
    except (OSError, RuntimeError) as exc:
        raise ConfigurationError(
            f"AUTOSCALER_DEBUGPY_HOST/PORT {settings.host}:{settings.port}: debugpy cannot listen: {exc}"
        ) from None
    log.warning("debugpy listening", host=settings.host, port=settings.port, waiting=settings.wait)
    if settings.wait:
        debugpy.wait_for_client()
        log.info("debugger attached")
    return True
