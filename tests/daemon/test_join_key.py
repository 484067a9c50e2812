"""The join endpoint's TLS key, read at the wire: two replicas (two join desks, each on its own TLS
listener, `daemon.join.serve_join`) given the same swarm join token serve the same public key, the one
`join_tls.join_pin` names and launches pin in user data; when the token is rotated, a replica that serves
no request (a standby) follows within its refresh (`keep_key`), and the real curl pinned to the old key
then refuses it (exit 90) while the new pin is accepted.

Stands in for: swarm, a fake whose worker join token the test rotates (`docker swarm join-token --rotate
worker`); EC2 is not asked (no request carries a ticket of one of our machines: the desk answers 403).
The served key is read from the TLS handshake (Python's ssl, verification off: the key, not a CA, is
what machines check) and by curl 7.88's `--pinnedpubkey`, as the boot runs it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from tests.daemon.join_tls_helpers import served_pin

from swarm_autoscaler.adapters.ec2_join import JoiningMachine
from swarm_autoscaler.adapters.join_tls import join_pin
from swarm_autoscaler.core.model import Node
from swarm_autoscaler.daemon.join import JoinDesk, keep_key, serve_join

pytestmark = [pytest.mark.timeout(60)]


@dataclass
class Swarm:
    token: str = "SWMTKN-1-first-token"

    async def join_command(self) -> tuple[str, str]:
        return self.token, "10.0.0.5:2377"

    async def list_nodes(self) -> Sequence[Node]:
        return ()


async def _no_machines(_: str) -> Sequence[JoiningMachine]:
    return ()


def _desk(swarm: Swarm) -> JoinDesk:
    return JoinDesk(_no_machines, swarm.join_command, swarm.list_nodes, time.time, 600.0, ready=True)


async def _curl(port: int, pin: str) -> tuple[int, str]:
    """The boot's fetch (`boot_scripts.ticket_join`'s curl options): exit status and the body."""
    proc = await asyncio.create_subprocess_exec(
        *("curl", "-sS", "--max-time", "10", "-H", "Content-Type: application/json", "-k"),
        *("--pinnedpubkey", f"sha256//{pin}", "--data", json.dumps({"ticket": "ab" * 32})),
        f"https://127.0.0.1:{port}/v1/join",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_replicas_serve_one_key_from_the_token_and_follow_its_rotation() -> None:
    swarm = Swarm()
    desks = [_desk(swarm), _desk(swarm)]
    runners = [await serve_join(desk, "127.0.0.1", 0) for desk in desks]
    ports = [int(r.addresses[0][1]) for r in runners]
    standby = asyncio.create_task(keep_key(desks[1], interval=0.1))
    try:
        for desk in desks:
            await desk.refresh()
        first = join_pin(swarm.token)
        assert [await asyncio.to_thread(served_pin, p) for p in ports] == [first, first]
        assert await _curl(ports[0], first) == (0, json.dumps(_REFUSED_BODY))  # sent and answered

        swarm.token = "SWMTKN-1-rotated-token"
        second = join_pin(swarm.token)
        assert second != first
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(served_pin, ports[1]) != second:
            assert time.monotonic() < deadline, "the standby never loaded the rotated token's key"
            await asyncio.sleep(0.1)
        assert (await _curl(ports[1], first))[0] == 90  # the old pin: refused before sending
        assert (await _curl(ports[1], second))[0] == 0
    finally:
        standby.cancel()
        for runner in runners:
            await runner.cleanup()


_REFUSED_BODY = {"error": "refused: not a machine of this daemon waiting to join"}
