"""Serving an aiohttp application: the daemon's and the keeper's HTTP starter."""

from __future__ import annotations

import ssl

from aiohttp import web


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
