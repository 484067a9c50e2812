"""A real dockerd node joins through a join ticket: the daemon (in-process, `AUTOSCALER_EC2_JOIN_URL=auto`
as the README deploys it, listening on its swarm manager's own address as the stack's host-mode port
does) launches a machine whose user data carries a ticket and no join token, and names the join URL
`auto` read from the real swarm (its manager's advertised address, `ManagerStatus.Addr`, at the join
port, TLS); the machine's boot reads its private IP from its metadata service, posts the ticket from that
address to that URL with the real curl checking the endpoint's key against the pin in its user data, and
joins the swarm with the token it answered, then confirms its node id the same way; the daemon labels
that node with the instance's id (`IDENTITY_LABEL`, a manager's write) and adopts it, as it adopts only
nodes so confirmed with join tickets on (`Policy.adopt_by_identity`); its worker (the worker service's
task) runs work; the fleet goes back to zero. Then the ticket, read from user data as a read-only principal would, is
replayed from the machine's own address (its node joined) and from another: both get nothing. And an
impostor holding the worker join token joins a dockerd node under the machine's hostname (its full DNS
form, which the daemon reads as the same machine): it is never confirmed, never labelled ours, never
drained or removed, not even once the machine is terminated and its own node removed, and the machine's
node stays ours meanwhile (by hostname alone the daemon could have taken either).

What stands in for AWS: moto for EC2 with a VPC carved from loopback (the session's cloud,
`LocalCloudOptions.vpc_prefix`), so the machine's PrivateIpAddress is the loopback address its dockerd
node advertises and its boot's `curl --interface` sends from; the instance metadata service is
`localcloud.metadata` (each machine's own prefix, its private IP from its hostname); the source/
destination check of a VPC is the kernel refusing to send from an address that is not local (any
loopback address is local here, so the attacker's choice of source is the test's).
"""

from __future__ import annotations

import asyncio
import base64
import re
import socket
import time

import aiohttp
import pytest
from distributed import Client
from tests.e2e.helpers import REAL_BOOT, ec2_client, hostname_of, owned_instances, start, wait_for

from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG
from swarm_autoscaler.adapters.join_tls import join_pin
from swarm_autoscaler.core.cluster import IDENTITY_LABEL
from swarm_autoscaler.core.model import GIB, Availability, Node
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud

pytestmark = [*REAL_BOOT, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _post(url: str, source: str, body: dict[str, str]) -> int:
    """POST from `source` (the TCP source address, as the boot's curl --interface); the HTTP status.
    The endpoint's key is not checked: this is the attacker's client."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True, ssl=False)
    async with aiohttp.ClientSession(connector=connector) as session, session.post(url, json=body) as reply:
        return reply.status


async def test_a_machine_joins_through_its_ticket_and_the_ticket_is_worthless_after(
    cloud: LocalCloud,
) -> None:
    lc = cloud
    assert lc.scheduler is not None and lc.metadata is not None and lc.orchestrator is not None
    assert lc.options.vpc_prefix.startswith("127."), "the e2e cloud's VPC is carved from loopback"
    port = _free_port()
    url = f"https://{lc.join_host()}:{port}/v1/join"  # what `auto` derives from the swarm's manager
    before = set(owned_instances(lc, ("pending", "running", "shutting-down", "terminated")))
    async with lc.daemon(lc.join_ticket_env(port, auto=True)) as daemon:
        running = await start(daemon)
        impostor_id = ""
        try:
            async with Client(lc.scheduler_address, asynchronous=True) as client:
                future = client.submit(
                    time.sleep,
                    40.0,  # the machine stays busy while the impostor joins beside it
                    key="ticket-boot",
                    pure=False,
                    resources={"CPU": 2, "RAM": GIB, "instance-type:m5.large": 1},
                )
                await wait_for(lambda: bool(lc.scheduler.workers), 300, "a worker on a node joined by ticket")
                [(iid, inst)] = [(i, v) for i, v in owned_instances(lc).items() if i not in before]
                ip, host = inst["PrivateIpAddress"], hostname_of(inst)
                # its node was confirmed by the machine itself and adopted (labelled ours) on that ground:
                # the worker service runs only on nodes labelled ours
                [swarm_node] = [n for n in await lc.orchestrator.list_nodes() if n.hostname == host]
                assert swarm_node.labels.get(IDENTITY_LABEL) == iid, swarm_node.labels
                assert swarm_node.ours
                impostor_id = await _impostor_joins(lc, host)
                await asyncio.sleep(6.0)  # several ticks (2 s apart) with both nodes under one hostname
                nodes = {n.id: n for n in await lc.orchestrator.list_nodes()}
                assert nodes[swarm_node.id].ours and nodes[swarm_node.id].hostname == host
                _untouched(nodes[impostor_id], host)
                await future
            # its dockerd node advertises the machine's PrivateIpAddress, which its boot read from its
            # metadata service (and sent its ticket from: the only way it could have joined). Swarm's
            # Status.Addr is 127.0.0.1 for every local node (the kernel's source for a loopback peer).
            machine_nodes = lc.local_swarm.nodes.items()
            [node] = [
                n for name, n in machine_nodes if name.split(".")[0] == host and name != f"{host}.impostor"
            ]
            assert node.address == ip, (node.address, ip)
            assert any(asked.split(".")[0] == host for asked in lc.metadata.asked)
            # what a read-only principal reads: no token in user data or tags, a ticket
            attr = ec2_client(lc).describe_instance_attribute(InstanceId=iid, Attribute="userData")
            user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", ())}
            assert "SWMTKN" not in user_data and not [v for v in tags.values() if "SWMTKN" in v]
            assert JOIN_NONCE_TAG in tags
            assert url in user_data  # the join URL `auto` read from the real swarm
            token, _ = await lc.orchestrator.join_command()
            assert f"--pinnedpubkey sha256//{join_pin(token)} " in user_data  # the endpoint's key, pinned
            found = re.search(r'"ticket": "([0-9a-f]{64})"', user_data)
            assert found is not None
            ticket = {"ticket": found.group(1)}
            assert await _post(url, ip, ticket) == 403  # the node joined: a second use gets nothing
            other = ip.rsplit(".", 1)[0] + (".250" if not ip.endswith(".250") else ".251")
            assert await _post(url, other, ticket) == 403  # another address gets nothing
            await wait_for(lambda: not owned_instances(lc), 180, "the fleet back at its minimum (0)")
            await wait_for(lambda: not lc.scheduler.workers, 60, "every dask worker gone")
            await asyncio.sleep(6.0)  # the machine's node is removed once down; the impostor's stays
            nodes = {n.id: n for n in await lc.orchestrator.list_nodes()}
            assert swarm_node.id not in nodes
            _untouched(nodes[impostor_id], host)
        finally:
            try:  # the impostor's dockerd (also one that never came up), then its swarm entry
                for name in [h for h in lc.local_swarm.nodes if h.endswith(".impostor")]:
                    await lc.local_swarm.stop_node(name)
                if impostor_id:
                    await lc.orchestrator.remove(impostor_id)
            finally:
                await running.halt()


async def _impostor_joins(lc: LocalCloud, host: str) -> str:
    """A dockerd node named `<host>.impostor` (read as `host`: the part before the first dot, as for
    Amazon Linux's full names) joins with the worker join token, as an attacker holding it would; its
    node id."""
    # (a short folder: containerd's sockets under it must fit a unix socket path; `<host>-impostor` made
    # `.../exec/containerd/containerd.sock.ttrpc` 105 bytes for a 15-character host, and containerd never
    # started)
    node = await lc.local_swarm.add_node(f"{host}.impostor", folder="impostor")
    await node.join(lc.local_swarm.worker_token, lc.local_swarm.manager_addr)
    return (await node.docker("info", "--format", "{{.Swarm.NodeID}}")).strip()


def _untouched(node: Node, host: str) -> None:
    """Unowned, unconfirmed, with no label the daemon writes, and never drained."""
    assert node.hostname == host and not node.ours, node
    assert not [k for k in node.labels if k.startswith("swarm-autoscaler")], node.labels
    assert node.availability == Availability.ACTIVE, node
