"""`run_until_signal`, the shutdown rule of `run` and `keeper`, with real signals sent to this process.

Each test runs its own event loop (`asyncio.run`): the handlers it installs go when that loop closes,
so they never reach the session's loop. The processes' own SIGTERM tests are in test_cli.py
(`run` mid-act) and tests/keeper/test_keeper_process.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Coroutine
from typing import Any

import pytest
from structlog.testing import capture_logs

from swarm_autoscaler.runtime.signals import run_until_signal


def _run(main: Coroutine[Any, Any, None]) -> list[dict[str, Any]]:
    with capture_logs() as logs:
        asyncio.run(main)
    return logs


def _signal_soon(sig: signal.Signals, after: float = 0.05) -> None:
    asyncio.get_running_loop().call_later(after, signal.raise_signal, sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sets_stop_and_a_prompt_serve_ends_quietly(sig: signal.Signals) -> None:
    seen: list[str] = []

    async def serve(stop: asyncio.Event) -> None:
        _signal_soon(sig)
        await stop.wait()
        await asyncio.sleep(0.05)  # closing, well within the limit
        seen.append("closed")

    async def main() -> None:
        await run_until_signal(serve, within=5.0)

    logs = _run(main())
    assert seen == ["closed"]
    assert [e for e in logs if e["log_level"] == "warning"] == []


def test_a_serve_that_does_not_close_is_cancelled_within_the_limit() -> None:
    cancelled: list[float] = []
    signalled: list[float] = []

    async def serve(stop: asyncio.Event) -> None:
        _signal_soon(signal.SIGTERM)
        await stop.wait()
        signalled.append(time.monotonic())
        try:
            await asyncio.sleep(3600)  # an endpoint that never answers while closing
        except asyncio.CancelledError:
            cancelled.append(time.monotonic())
            raise

    async def main() -> None:
        await run_until_signal(serve, within=0.3)

    logs = _run(main())
    assert len(cancelled) == 1
    took = cancelled[0] - signalled[0]
    print(f"forced stop {took:.2f} s after the signal (limit 0.3 s)")
    assert 0.2 <= took < 5.0
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert warning["event"].startswith("stopped by force") and warning["limit_s"] == 0.3


def test_a_second_signal_does_not_extend_the_limit() -> None:
    async def serve(stop: asyncio.Event) -> None:
        _signal_soon(signal.SIGTERM, after=0.05)
        _signal_soon(signal.SIGTERM, after=0.6)  # a second `docker stop`: the first deadline holds
        await asyncio.sleep(3600)

    async def main() -> None:
        started = time.monotonic()
        await run_until_signal(serve, within=1.0)
        took = time.monotonic() - started
        print(f"two signals: stopped {took:.2f} s after start (signals at 0.05 and 0.6 s, limit 1.0 s)")
        assert 1.0 <= took < 1.5  # 0.6 + 1.0 had the second signal moved the deadline

    logs = _run(main())
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "stopped by force: closing took too long"
    ]


def test_a_timeout_of_serve_before_any_signal_is_its_own_error() -> None:
    async def serve(stop: asyncio.Event) -> None:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(3600)

    async def main() -> None:
        await run_until_signal(serve, within=5.0)

    with pytest.raises(TimeoutError):
        _run(main())
