"""`open_daemon` wires the join endpoint with `AUTOSCALER_EC2_JOIN_URL`: TLS on a listener of its own
(`AUTOSCALER_EC2_JOIN_PORT`), served once the start-up checks passed with the key of swarm's join token,
absent without it; refused at start when the join port is the HTTP port. `auto` names every manager's
address at the join port (refused in one line when swarm names none); off, the start warns that the join
token goes into user data.

The real daemon is built by `open_daemon` (as `swarm-autoscaler run` does) on the in-memory local cloud
(moto for EC2, the in-memory swarm for swarm); the endpoint is asked over TCP from 127.0.0.1, which is no
machine of the daemon's (its VPC is 10.0.0.0/16): a well-formed ticket gets the same 403 as any other
refusal. The client checks the served key as a machine's boot does: its pin must be the join token's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from structlog.testing import capture_logs
from tests.daemon.join_tls_helpers import served_pin

from swarm_autoscaler.adapters.join_tls import join_pin
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.localcloud.redis_server import free_port

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
async def lc() -> AsyncIterator[LocalCloud]:
    async with LocalCloud(LocalCloudOptions(fast=True, cluster_name="join-startup")) as cloud:
        yield cloud


async def _post(port: int, expected_pin: str) -> int:
    """POST a well-formed ticket to the join endpoint at `port`, whose key must have `expected_pin`;
    the status."""
    assert await asyncio.to_thread(served_pin, port) == expected_pin
    url = f"https://127.0.0.1:{port}/v1/join"
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json={"ticket": "ab" * 32}, ssl=False) as reply,
    ):
        return reply.status


async def test_the_join_port_must_differ_from_the_http_port(lc: LocalCloud) -> None:
    port = str(free_port())
    extra = {
        "AUTOSCALER_HTTP_PORT": port,
        "AUTOSCALER_EC2_JOIN_PORT": port,
        "AUTOSCALER_EC2_JOIN_URL": "auto",
    }
    with pytest.raises(ConfigurationError, match="AUTOSCALER_EC2_JOIN_PORT is AUTOSCALER_HTTP_PORT"):
        async with lc.daemon(extra):
            pass


async def test_the_started_daemon_serves_the_join_endpoint_over_tls_only_with_a_join_url(
    lc: LocalCloud,
) -> None:
    assert isinstance(lc.orchestrator, MemorySwarm)
    pin = join_pin(lc.orchestrator.join_token)
    http_port, join_port = free_port(), free_port()
    extra = {
        "AUTOSCALER_HTTP_PORT": str(http_port),
        "AUTOSCALER_HTTP_HOST": "127.0.0.1",
        "AUTOSCALER_EC2_JOIN_PORT": str(join_port),
        "AUTOSCALER_EC2_JOIN_URL": f"https://127.0.0.1:{join_port}/v1/join",
    }
    async with lc.daemon(extra), aiohttp.ClientSession() as http:
        assert await _post(join_port, pin) == 403
        # the HTTP port serves health and metrics, not the join endpoint
        reply = await http.post(f"http://127.0.0.1:{http_port}/v1/join", json={"ticket": "ab" * 32})
        assert reply.status == 404
    del extra["AUTOSCALER_EC2_JOIN_URL"]
    async with lc.daemon(extra), aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectorError):  # nothing listens at the join port
            await http.post(f"https://127.0.0.1:{join_port}/v1/join", json={"ticket": "ab" * 32}, ssl=False)


async def test_auto_serves_the_join_endpoint_without_an_http_port(lc: LocalCloud) -> None:
    """`auto` on the in-memory swarm (our Orchestrator port's fake), whose one manager advertises
    127.0.0.1: the start line names that manager's https URL at the join port, which the endpoint
    answers; health and metrics may be off (AUTOSCALER_HTTP_PORT=0): the join endpoint is its own."""
    assert isinstance(lc.orchestrator, MemorySwarm)
    port = free_port()
    extra = {
        "AUTOSCALER_HTTP_PORT": "0",
        "AUTOSCALER_HTTP_HOST": "127.0.0.1",
        "AUTOSCALER_EC2_JOIN_PORT": str(port),
    }
    with capture_logs() as logs:
        async with lc.daemon({**extra, "AUTOSCALER_EC2_JOIN_URL": "auto"}):
            url = f"https://127.0.0.1:{port}/v1/join"
            assert await _post(port, join_pin(lc.orchestrator.join_token)) == 403
    [on] = [e for e in logs if e["event"].startswith("join tickets on")]
    assert on["join_urls"] == [url]
    assert not [e for e in logs if e["event"].startswith("join tickets are off")]


async def test_auto_with_no_manager_address_is_refused_at_start_in_one_line(lc: LocalCloud) -> None:
    assert isinstance(lc.orchestrator, MemorySwarm)
    saved = lc.orchestrator.managers
    lc.orchestrator.managers = ("0.0.0.0:2377",)  # a swarm that names no address a worker can reach
    try:
        extra = {"AUTOSCALER_EC2_JOIN_PORT": str(free_port()), "AUTOSCALER_EC2_JOIN_URL": "auto"}
        with pytest.raises(ConfigurationError) as caught:
            async with lc.daemon({**extra, "AUTOSCALER_HTTP_HOST": "127.0.0.1"}):
                pass
    finally:
        lc.orchestrator.managers = saved
    message = str(caught.value)
    assert "\n" not in message and message.startswith("AUTOSCALER_EC2_JOIN_URL=auto: swarm names no")


async def test_without_join_tickets_the_start_warns_that_the_token_is_in_user_data(lc: LocalCloud) -> None:
    with capture_logs() as logs:
        async with lc.daemon({"AUTOSCALER_HTTP_PORT": "0"}):
            pass
    [warning] = [e for e in logs if e["event"].startswith("join tickets are off")]
    assert warning["log_level"] == "warning"
    assert "the swarm join token goes into every machine's user data" in warning["event"]
