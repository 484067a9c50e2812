"""Serving an aiohttp application: the daemon's and the keeper's HTTP starter."""

from __future__ import annotations

import errno
import ssl

from aiohttp import web

from swarm_autoscaler.errors import ConfigurationError


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or later) with this certificate chain and key (PEM files)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


async def start_http(
    app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Start serving (HTTPS with `tls`); the caller stops it with `await runner.cleanup()`."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    return runner


async def listen(
    app: web.Application,
    host: str,
    port: int,
    port_setting: str,
    tls: ssl.SSLContext | None = None,
    what: str = "",
    advice: str = "choose a free port",
) -> web.AppRunner:
    """`start_http`, with a port that cannot be listened on as one `ConfigurationError` line naming the
    setting to change: `port_setting` when the port is taken or not allowed, AUTOSCALER_HTTP_HOST
    otherwise (an address not on this machine)."""
    try:
        return await start_http(app, host, port, tls)
    except OSError as exc:
        taken = exc.errno in (errno.EADDRINUSE, errno.EACCES)
        setting = port_setting if taken else "AUTOSCALER_HTTP_HOST"
        raise ConfigurationError(
            f"{setting}: cannot listen{what} on {host}:{port} ({exc.strerror or exc}); {advice}"
        ) from None
