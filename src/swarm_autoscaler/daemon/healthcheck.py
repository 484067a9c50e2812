"""`swarm-autoscaler healthcheck`: the image's HEALTHCHECK, asking the daemon's own /healthz.

Contract: reads only AUTOSCALER_HTTP_HOST/PORT from the environment (the container's, as the stack file
set it), asks `http://HOST:PORT/healthz` (a wildcard host is asked on loopback), prints one line and
returns 0 when it answers 200, 1 otherwise. Port 0 (HTTP off) has nothing to ask: 0. For the keeper
(`--keeper`), the port is AUTOSCALER_KEEPER_HTTP_PORT's instead, asked over HTTPS (the keeper's default)
unless AUTOSCALER_KEEPER_PLAIN_HTTP is true. The keeper's certificate is not verified here: the check
asks its own container's process on loopback, sends no token, and reads only the status.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

from pydantic import Field
from pydantic_settings import BaseSettings

from swarm_autoscaler.config.keeper import KEEPER_HTTP_PORT
from swarm_autoscaler.config.settings import HttpSettings, group_config


class KeeperPort(BaseSettings):
    """AUTOSCALER_KEEPER_HTTP_PORT alone (the keeper's other settings, its token above all, stay unread)."""

    model_config = group_config("AUTOSCALER_KEEPER_")

    http_port: int = Field(default=KEEPER_HTTP_PORT, ge=1, le=65535)
    plain_http: bool = False


_WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def healthz_url(http: HttpSettings, scheme: str = "http") -> str:
    host = _WILDCARD.get(http.host, http.host)
    where = f"[{host}]" if ":" in host else host
    return f"{scheme}://{where}:{http.port}/healthz"


def check(timeout: float = 4.0, *, keeper: bool = False) -> tuple[int, str]:
    """(exit status, one line) for the daemon (or the keeper) whose HTTP settings are in the environment."""
    http = HttpSettings()
    tls: ssl.SSLContext | None = None
    if keeper:
        port = KeeperPort()
        http = HttpSettings(port=port.http_port)
        if not port.plain_http:
            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE  # its own process on loopback; no token is sent
    if http.port == 0:
        return 0, "AUTOSCALER_HTTP_PORT=0: the HTTP endpoint is off, nothing to check"
    url = healthz_url(http, "http" if tls is None else "https")
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=tls) as reply:
            return 0, f"healthy: {url} answered {reply.status}"
    except urllib.error.HTTPError as exc:
        return 1, f"unhealthy: {url} answered {exc.code}: {exc.read(200).decode(errors='replace')}"
    except (OSError, ValueError) as exc:
        return 1, f"unhealthy: {url}: {exc}"
