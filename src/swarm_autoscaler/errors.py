"""The project's exceptions, one small tree. Messages are for operators: they say what to do next.

    AutoscalerError
    ├── ConfigurationError      bad or inconsistent settings; the daemon refuses to start (exit 2)
    ├── EndpointError           an endpoint (EC2, docker, dask, redis) is unreachable or refused us;
    │                           at start the daemon refuses to start (exit 3), once running the tick fails
    ├── NotFoundError           the thing an action targets no longer exists
    └── LockLostError           this replica lost leadership mid-tick; remaining actions are cancelled

Vendor exceptions never cross an adapter's boundary: adapters translate them into these.
Credentials never appear in a message.
"""

from __future__ import annotations


class AutoscalerError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigurationError(AutoscalerError):
    """Settings are missing, malformed or contradict each other."""


class EndpointError(AutoscalerError):
    """An endpoint could not be reached or answered with an error. The message names the endpoint;
    `setting` names the variable that points at it, when the daemon's start-up checks know it."""

    def __init__(self, endpoint: str, detail: str, setting: str | None = None) -> None:
        super().__init__(f"{endpoint}: {detail}")
        self.endpoint = endpoint
        self.detail = detail
        self.setting = setting


class NotFoundError(AutoscalerError):
    """The targeted instance, node or worker is gone."""


class LockLostError(AutoscalerError):
    """Leadership was lost while acting."""
