"""Stopping a long-running command on SIGTERM or SIGINT within a bounded time: the one shutdown rule
that `swarm-autoscaler run` and `swarm-autoscaler keeper` share."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("swarm_autoscaler.runtime.signals")


async def run_until_signal(serve: Callable[[asyncio.Event], Awaitable[None]], within: float) -> None:
    """Await `serve(stop)`, where SIGTERM or SIGINT set `stop`; return when `serve` returns.

    Contract: from the first signal, `serve` (its closing included) has `within` seconds; past that it
    is cancelled, one warning `stopped by force` is logged, and this returns normally, so the process
    still exits 0 within `within` of the signal (docker stop sends SIGKILL after 10 s). A TimeoutError
    raised by `serve` before any signal is its own and propagates. The handlers are installed before
    `serve` starts and stay until the event loop closes: a second signal while closing is ignored.
    Call it from the main thread (signal handlers live there).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as exit_by:

            def on_signal() -> None:
                if not stop.is_set():
                    stop.set()
                    exit_by.reschedule(loop.time() + within)

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
            await serve(stop)
    except TimeoutError:
        if not stop.is_set():
            raise
        log.warning("stopped by force: closing took too long", limit_s=within)
