"""Once running, expected trouble is one log line per tick and goes away by itself: a real redis-server is
stopped under a running daemon loop (the real daemon built by `open_daemon` on the local cloud: moto EC2,
a real dask scheduler, the in-memory swarm), then started again on the same port. The rendered log has
one line per failed tick, no traceback, and the daemon leads again once redis is back."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from swarm_autoscaler.runtime.logs import configure_logging
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("restore_logging")]

PASSWORD = "transient-Secret-pw"


@pytest.fixture
async def lc() -> AsyncIterator[LocalCloud]:
    async with LocalCloud(LocalCloudOptions(fast=True, cluster_name="transient")) as cloud:
        yield cloud


class Redis:
    """A redis-server that can be stopped and started again on the same port (the localcloud helper
    picks a new port at each start)."""

    def __init__(self, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed: run scripts/ensure-services.sh"
        command = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.folder)]
        command += ["--save", "", "--appendonly", "no", "--requirepass", PASSWORD]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"redis-server did not listen on {self.port}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(10)


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[Redis]:
    server = Redis(tmp_path)
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        server.stop()


def events(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


async def wait_until(out: io.StringIO, predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    for _ in range(round(timeout / 0.1)):
        if predicate(events(out)):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_redis_down_for_a_while_is_one_line_per_tick_then_the_daemon_leads_again(
    lc: LocalCloud, redis: Redis
) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    stop = asyncio.Event()
    async with lc.daemon({"AUTOSCALER_REDIS_URL": redis.url, "AUTOSCALER_REDIS_LOCK_TTL": "3s"}) as daemon:
        loop = asyncio.create_task(daemon.run(stop))
        try:
            await wait_until(out, lambda ev: any(e["event"] == "tick" for e in ev), 30, "a first tick")
            assert daemon.leader
            redis.stop()
            failed = lambda ev: [e for e in ev if e["event"] == "tick failed"]  # noqa: E731
            await wait_until(out, lambda ev: len(failed(ev)) >= 3, 30, "three failed ticks")
            down_at = len(events(out))
            await asyncio.to_thread(redis.start)
            await wait_until(
                out,
                lambda ev: any(e["event"] == "tick" for e in ev[down_at:]),
                30,
                "a tick after redis is back",
            )
            led_again = daemon.leader  # before stopping: a stopped daemon releases the lock and leads no more
        finally:
            stop.set()
            await asyncio.wait_for(loop, 30)
    text = out.getvalue()
    assert "Traceback" not in text and "exc_info" not in text and "exception" not in text
    assert PASSWORD not in text
    lines = failed(events(out))
    endpoint = f"redis redis://**********@127.0.0.1:{redis.port}/0: ConnectionError"
    assert len(lines) >= 3 and all(
        e["level"] == "error" and str(e["error"]).startswith(endpoint) for e in lines
    ), lines
    # one line per failed tick: while redis was down, the daemon's only error or warning lines are those
    ours = [e for e in events(out) if "logger" not in e]  # records of dask's own loggers carry a name
    trouble = {str(e["event"]) for e in ours if e["level"] in ("warning", "error", "critical")}
    # the start-up warnings that the local cloud's scheduler runs without the packing preload and that
    # join tickets are off (its VPC is not on loopback) aside
    trouble = {
        t
        for t in trouble
        if "runs without the packing preload" not in t and not t.startswith("join tickets are off")
    }
    assert trouble == {"tick failed"}, trouble
    assert led_again, "the daemon did not lead again once redis was back"
