"""Serving an aiohttp application: the daemon's and the keeper's HTTP starter."""

from __future__ import annotations

from aiohttp import web


async def start_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving; the caller stops it with `await runner.cleanup()`."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
