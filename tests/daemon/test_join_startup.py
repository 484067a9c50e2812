"""`open_daemon` wires the join endpoint with `AUTOSCALER_EC2_JOIN_URL`: refused at start without an HTTP
port (every machine would fail its boot), served once the start-up checks passed, absent without it.
`auto` names every manager's address at the HTTP port (refused in one line when swarm names none); off,
the start warns that the join token goes into user data.

The real daemon is built by `open_daemon` (as `swarm-autoscaler run` does) on the in-memory local cloud
(moto for EC2); the endpoint is asked over TCP from 127.0.0.1, which is no machine of the daemon's (its
VPC is 10.0.0.0/16): a well-formed ticket gets the same 403 as any other refusal."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from structlog.testing import capture_logs

from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
async def lc() -> AsyncIterator[LocalCloud]:
    async with LocalCloud(LocalCloudOptions(fast=True, cluster_name="join-startup")) as cloud:
        yield cloud


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_join_url_without_an_http_port_is_refused_at_start(lc: LocalCloud) -> None:
    extra = {"AUTOSCALER_HTTP_PORT": "0", "AUTOSCALER_EC2_JOIN_URL": "http://10.0.0.10:8000/v1/join"}
    with pytest.raises(
        ConfigurationError, match="AUTOSCALER_EC2_JOIN_URL is set but AUTOSCALER_HTTP_PORT is 0"
    ):
        async with lc.daemon(extra):
            pass


async def test_the_started_daemon_serves_the_join_endpoint_only_with_a_join_url(lc: LocalCloud) -> None:
    for join_url, expected in ((True, 403), (False, 404)):
        port = _free_port()
        extra = {"AUTOSCALER_HTTP_PORT": str(port), "AUTOSCALER_HTTP_HOST": "127.0.0.1"}
        if join_url:
            extra["AUTOSCALER_EC2_JOIN_URL"] = f"http://127.0.0.1:{port}/v1/join"
        async with lc.daemon(extra), aiohttp.ClientSession() as http:
            reply = await http.post(f"http://127.0.0.1:{port}/v1/join", json={"ticket": "ab" * 32})
            assert reply.status == expected, await reply.text()


async def test_auto_without_an_http_port_is_refused_at_start(lc: LocalCloud) -> None:
    extra = {"AUTOSCALER_HTTP_PORT": "0", "AUTOSCALER_EC2_JOIN_URL": "auto"}
    with pytest.raises(ConfigurationError, match="AUTOSCALER_HTTP_PORT is 0"):
        async with lc.daemon(extra):
            pass


async def test_auto_serves_the_join_endpoint_at_the_managers_address(lc: LocalCloud) -> None:
    """`auto` on the in-memory swarm (our Orchestrator port's fake), whose one manager advertises
    127.0.0.1: the start line names that manager's URL at the HTTP port, which the endpoint answers."""
    port = _free_port()
    extra = {"AUTOSCALER_HTTP_PORT": str(port), "AUTOSCALER_HTTP_HOST": "127.0.0.1"}
    with capture_logs() as logs:
        async with lc.daemon({**extra, "AUTOSCALER_EC2_JOIN_URL": "auto"}), aiohttp.ClientSession() as http:
            reply = await http.post(f"http://127.0.0.1:{port}/v1/join", json={"ticket": "ab" * 32})
            assert reply.status == 403, await reply.text()
    [on] = [e for e in logs if e["event"].startswith("join tickets on")]
    assert on["join_urls"] == [f"http://127.0.0.1:{port}/v1/join"]
    assert not [e for e in logs if e["event"].startswith("join tickets are off")]


async def test_auto_with_no_manager_address_is_refused_at_start_in_one_line(lc: LocalCloud) -> None:
    assert isinstance(lc.orchestrator, MemorySwarm)
    saved = lc.orchestrator.managers
    lc.orchestrator.managers = ("0.0.0.0:2377",)  # a swarm that names no address a worker can reach
    try:
        extra = {"AUTOSCALER_HTTP_PORT": str(_free_port()), "AUTOSCALER_EC2_JOIN_URL": "auto"}
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
