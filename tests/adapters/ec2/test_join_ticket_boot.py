"""The boot's side of the join ticket, run: the exact user data RunInstances sent (decoded as EC2 does)
runs under bash, asks the metadata service for its private IP, posts its ticket from that address to the
daemon's join endpoint over TLS, with the real curl checking the endpoint's key against the pin in the
user data (the first join URL is dead: the next is tried), joins with what it answered, then confirms
its node id the same way (the desk labels that node as the instance's; a node never confirmed fails the
boot). An impostor
on the VPC path (a listener with another key) is sent nothing: not even the ticket.

Stands in for: a machine's first boot. bash runs the script here (not in a dockerd node: the dockerd e2e
test `tests/e2e/test_join_ticket_e2e.py` does that); `docker`, `sleep` and `shutdown` are stubs on PATH
that record what they were asked (docker reports a node not in a swarm until it joins); the instance
metadata service is a stub answering IMDSv2's token and `local-ipv4` (the address moto gave the
instance, or another in the refused case), at the address AWS SDKs read from
`AWS_EC2_METADATA_SERVICE_ENDPOINT`. EC2 and the endpoint as in `test_join_ticket.py` (the daemon's
TLS listener, `daemon.join.serve_join`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs
from tests.adapters.ec2.ec2_helpers import MANAGER, TOKEN, CloudFactory
from tests.adapters.ec2.test_join_ticket import Endpoint, loopback_vpc, open_endpoint

from swarm_autoscaler.adapters.boot_scripts import BOOT_FAILED_LINE
from swarm_autoscaler.core.cluster import IDENTITY_LABEL
from swarm_autoscaler.runtime.http import start_http
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork
from swarm_autoscaler_lab.localcloud.moto_user_data import as_ec2_decodes

__all__ = ["loopback_vpc"]  # the module-scoped fixture, shared

NODE_ID = "bootednode0000000000000001"  # what `docker info` reports once joined (swarm's ids: [0-9a-z])
# the failed boot's reason, as operators read it on the console
TICKET_FAILED = "the join ticket was refused, docker swarm join failed or its node was not confirmed"
DOCKER = f"""#!/bin/sh
# a node not in a swarm until `docker swarm join` succeeds; then its node id is {NODE_ID}
case "$1 ${{2:-}}" in
  "info --format")
    case "$3" in
      *NodeID*) [ -f "$STUBS/joined" ] && echo {NODE_ID} ;;
      *) cat "$STUBS/state" 2>/dev/null || echo inactive ;;
    esac ;;
  "info ") ;;
  "swarm join") echo "$*" > "$STUBS/joined"; echo {NODE_ID} > "$STUBS/node-id"; echo active > "$STUBS/state" ;;
  *) ;;
esac
exit 0
"""


@pytest.fixture
async def endpoint(make_cloud: CloudFactory, loopback_vpc: LocalNetwork) -> AsyncIterator[Endpoint]:
    ep, close = await open_endpoint(
        make_cloud,
        loopback_vpc,
        ["https://127.0.0.1:1/v1/join"],  # nothing listens there: the boot moves on to the next URL
        allowed_types={"m5.large": (loopback_vpc.ami_id, 'echo "boot script ran"')},
    )
    yield ep
    await close()


async def _metadata(answer: str) -> tuple[str, aiohttp.web.AppRunner]:
    """A stand-in for the instance metadata service (IMDSv2: PUT a token, then GET with it)."""

    async def token(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="imds-session-token")

    async def local_ipv4(request: aiohttp.web.Request) -> aiohttp.web.Response:
        if request.headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
            return aiohttp.web.Response(status=401)
        return aiohttp.web.Response(text=answer)

    app = aiohttp.web.Application()
    app.router.add_put("/latest/api/token", token)
    app.router.add_get("/latest/meta-data/local-ipv4", local_ipv4)
    runner = await start_http(app, "127.0.0.1", 0)
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner


async def _boot(tmp_path: Path, user_data: str, local_ipv4: str) -> tuple[int, str]:
    """Run `user_data` under bash with the stubs, its metadata service answering `local_ipv4`: (exit
    status, output)."""
    metadata, runner = await _metadata(local_ipv4)
    try:
        return await _run_boot(tmp_path, user_data, metadata)
    finally:
        await runner.cleanup()


async def _run_boot(tmp_path: Path, user_data: str, metadata: str) -> tuple[int, str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "docker").write_text(DOCKER)
    (stubs / "sleep").write_text("#!/bin/sh\nexit 0\n")  # the retries' pauses, skipped
    (stubs / "shutdown").write_text('#!/bin/sh\necho "$*" > "$STUBS/shutdown-asked"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    script = tmp_path / "user-data"
    script.write_text(user_data)
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "STUBS": str(stubs),
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": metadata,
        "HOME": str(tmp_path),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    proc = await asyncio.create_subprocess_exec(
        "bash", str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(errors="replace")


async def _launched(ep: Endpoint, faults: FaultInjector, tmp_path: Path) -> tuple[str, str]:
    """(private IP, user data as EC2 stores it) of one launch, whose boot (its docker stub in
    `tmp_path`) the fake swarm lists as a node once it joined."""
    faults.record()
    [inst] = (await ep.cloud.launch("m5.large", 1, {})).instances
    [run] = [c for c in faults.recorded() if c.action == "RunInstances"]
    [listed] = [i for i in await ep.cloud.list_instances() if i.id == inst.id]
    ep.swarm.boots.append((tmp_path / "stubs", listed.hostname))
    return inst.private_ip, as_ec2_decodes(run.params["UserData"])


async def test_the_boot_joins_with_the_token_the_endpoint_answers(
    endpoint: Endpoint, faults: FaultInjector, tmp_path: Path
) -> None:
    ip, user_data = await _launched(endpoint, faults, tmp_path)
    code, output = await _boot(tmp_path, user_data, ip)
    assert code == 0, output
    assert "boot script ran" in output
    joined = (tmp_path / "stubs" / "joined").read_text().split()
    assert joined == ["swarm", "join", "--token", TOKEN, MANAGER]
    assert not (tmp_path / "stubs" / "shutdown-asked").exists()
    # then it confirmed its node from its own address: the manager labelled that node as the instance's
    [(node_id, labels)] = endpoint.swarm.labelled
    [inst] = [i for i in await endpoint.cloud.list_instances() if i.private_ip == ip]
    assert (node_id, labels) == (NODE_ID, {IDENTITY_LABEL: inst.id})


async def test_a_boot_whose_node_is_not_confirmed_fails_and_stops(
    endpoint: Endpoint, faults: FaultInjector, tmp_path: Path
) -> None:
    """The node joined but the desk never confirms it (here: swarm does not list it, as when the node
    named is not the one swarm has): every confirmation is refused, and the boot fails as any failed
    boot, saying so, and stops; the join itself ran once (a joined node skips the fetch and the join
    on the next attempts)."""
    ip, user_data = await _launched(endpoint, faults, tmp_path)
    endpoint.swarm.boots.clear()  # swarm never lists the node the machine names
    with capture_logs() as logs:
        code, output = await _boot(tmp_path, user_data, ip)
    assert code != 0
    assert f"{BOOT_FAILED_LINE} the join ticket was refused" in output
    assert (tmp_path / "stubs" / "shutdown-asked").exists()
    granted = [e for e in logs if e["event"] == "join granted"]
    confirms = [e for e in logs if e["event"] == "join refused" and "no such worker node" in e["reason"]]
    assert (len(granted), len(confirms)) == (1, 5), logs
    assert endpoint.swarm.labelled == []


async def test_a_boot_refused_reports_a_failed_boot_and_stops(
    endpoint: Endpoint, faults: FaultInjector, tmp_path: Path
) -> None:
    """The same user data run where the metadata service gives another address (the ticket carried to
    another machine): every attempt is refused, the console gets the failed-boot line, the machine asks
    to shut down (it stops: the daemon backs its type off and replaces it), and nothing joined."""
    ip, user_data = await _launched(endpoint, faults, tmp_path)
    other = ip.rsplit(".", 1)[0] + (".250" if not ip.endswith(".250") else ".251")
    code, output = await _boot(tmp_path, user_data, other)
    assert code != 0
    assert f"{BOOT_FAILED_LINE} {TICKET_FAILED} 5 times" in output
    assert (tmp_path / "stubs" / "shutdown-asked").exists()
    assert not (tmp_path / "stubs" / "joined").exists()


async def test_an_impostor_with_another_key_is_sent_nothing_and_the_boot_fails(
    make_cloud: CloudFactory, loopback_vpc: LocalNetwork, faults: FaultInjector, tmp_path: Path
) -> None:
    """The join URL reaches an impostor on the VPC path: here a join endpoint that would even grant
    (the real desk, with swarm's token, the machine's address and nonce) but serves a key derived from
    something other than the join token, as anyone without the token must. The boot's curl checks the
    key against the pin before sending: the endpoint receives no request (it logs every one it gets),
    every attempt fails, the boot says so and stops, and nothing joined."""
    ep, close = await open_endpoint(
        make_cloud,
        loopback_vpc,
        allowed_types={"m5.large": (loopback_vpc.ami_id, 'echo "boot script ran"')},
        impostor_key="SWMTKN-1-not-the-join-token",
    )
    try:
        ip, user_data = await _launched(ep, faults, tmp_path)
        assert f"sha256//{ep.desk.tls.pin}" not in user_data  # the impostor's key is not the one pinned
        with capture_logs() as logs:
            code, output = await _boot(tmp_path, user_data, ip)
    finally:
        await close()
    assert code != 0
    assert f"{BOOT_FAILED_LINE} {TICKET_FAILED} 5 times" in output
    assert not [e for e in logs if e["event"] in ("join granted", "join refused")], logs
    assert not (tmp_path / "stubs" / "joined").exists()
