"""The join ticket, attacked: the swarm worker join token leaves the user data and the tags, and the
daemon's join endpoint (`daemon.join`, real aiohttp over TLS on TCP, `serve_join`) answers it only to one
of its machines booting, asking from that machine's private IP.

Stands in for: EC2, moto over HTTP (the requests captured as they arrive, user data decoded once as
EC2 does); a VPC, subnets carved from loopback (127.N.x.0/24), so that a machine's PrivateIpAddress is an
address this host can send from, and the endpoint sees it as the TCP source (on EC2 the source/
destination check keeps an instance from sending from another's address; here the test picks the
source, which is the attacker's power we grant). Swarm's token and node list: a fake the test controls.
The tests here post without checking the endpoint's key (the attacker's client); the boot's pinned fetch
is run in `test_join_ticket_boot.py`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs
from tests.adapters.ec2.ec2_helpers import MANAGER, TOKEN, CloudFactory
from tests.builders import make_policy

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, DEPLOYMENT_TAG, OWNER_TAG, OWNER_VALUE, Ec2Cloud
from swarm_autoscaler.adapters.ec2_join import JoiningMachine
from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG, new_nonce, ticket
from swarm_autoscaler.adapters.join_tls import JoinTls
from swarm_autoscaler.core.cluster import IDENTITY_LABEL, classify
from swarm_autoscaler.core.model import Availability, Node, NodeStatus, Snapshot
from swarm_autoscaler.daemon import join as join_module
from swarm_autoscaler.daemon.join import JoinDesk, serve_join
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
from swarm_autoscaler_lab.localcloud.moto_user_data import as_ec2_decodes

TICKET_IN = re.compile(r'"ticket": "([0-9a-f]{64})"')


@pytest.fixture(scope="module")
def loopback_vpc(moto_server: MotoServer) -> LocalNetwork:
    """A VPC whose subnets are loopback ranges: each machine's private IP is one this host can bind."""
    return provision_network(moto_server.endpoint, prefix=claim_loopback_prefix())


@dataclass
class FakeSwarm:
    """The managers' view: the worker join token and the nodes (a machine that joined is added), and the
    labels a manager writes (`labelled`, in order). `boots`: (folder, hostname) of boots run by
    `test_join_ticket_boot.py`, whose docker stub writes `joined` and `node-id` there: the node joins."""

    nodes: list[Node] = field(default_factory=list)
    token: str = TOKEN
    labelled: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    boots: list[tuple[Path, str]] = field(default_factory=list)

    async def join_command(self) -> tuple[str, str]:
        return self.token, MANAGER

    async def list_nodes(self) -> Sequence[Node]:
        for folder, host in self.boots:
            node_id = (folder / "node-id").read_text().strip() if (folder / "joined").exists() else ""
            if node_id and not any(n.id == node_id for n in self.nodes):
                self.nodes.append(Node(node_id, host, Availability.ACTIVE, NodeStatus.READY))
        return tuple(self.nodes)

    async def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        self.labelled.append((node_id, dict(labels)))
        self.nodes[:] = [
            replace(n, labels={**n.labels, **labels}) if n.id == node_id else n for n in self.nodes
        ]


@dataclass
class Endpoint:
    cloud: Ec2Cloud
    swarm: FakeSwarm
    desk: JoinDesk
    url: str

    async def post(self, source: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
        """POST to the join endpoint from `source` (bound as the TCP source, as the boot's curl
        --interface does)."""
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True, ssl=False)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(self.url, data=data, headers={"Content-Type": content_type}) as reply,
        ):
            return reply.status, await reply.json(content_type=None)


async def open_endpoint(
    make_cloud: CloudFactory,
    vpc: LocalNetwork,
    urls: Sequence[str] = (),
    impostor_key: str | None = None,
    **overrides: Any,
) -> tuple[Endpoint, Callable[[], Awaitable[None]]]:
    """The join endpoint served over TLS on 127.0.0.1, and a cloud launching into `vpc` whose user data
    names `urls` and then the endpoint's own URL. Returns it and its closer. `impostor_key`: the
    endpoint serves the key derived from that string instead of swarm's join token (an impostor on the
    VPC path that has everything but the key)."""
    swarm = FakeSwarm()
    clouds: list[Ec2Cloud] = []

    async def machines_at(address: str) -> Sequence[JoiningMachine]:
        return await clouds[0].machines_at(address)

    desk = JoinDesk(
        machines_at=machines_at,
        join_command=swarm.join_command,
        list_nodes=swarm.list_nodes,
        label_node=swarm.add_labels,
        clock=time.time,
        max_start_time=600.0,
        ready=True,
        tls=JoinTls(),
    )
    if impostor_key is None:
        await desk.refresh()
    else:
        desk.tls.use(impostor_key)
    runner = await serve_join(desk, "127.0.0.1", 0)
    url = f"https://127.0.0.1:{runner.addresses[0][1]}/v1/join"
    clouds.append(
        await make_cloud(
            subnet_ids=vpc.subnet_ids,
            security_group_ids=[vpc.security_group_id],
            join_urls=[*urls, url],
            clock=time.time,  # ages are measured against moto's LaunchTime, which is the host's time
            **overrides,
        )
    )
    return Endpoint(clouds[0], swarm, desk, url), runner.cleanup


@pytest.fixture
async def endpoint(make_cloud: CloudFactory, loopback_vpc: LocalNetwork) -> AsyncIterator[Endpoint]:
    ep, close = await open_endpoint(make_cloud, loopback_vpc, ["https://127.0.0.1:1/v1/join"])
    yield ep
    await close()


def _sent_texts(faults: FaultInjector) -> list[str]:
    """Every request that reached EC2 since `record()`, each parameter as it arrived, and each user data
    decoded once as EC2 does (what cloud-init, and anyone reading the attribute, sees)."""
    texts = []
    for call in faults.recorded():
        texts += [str(v) for v in call.params.values()]
        for key in ("UserData", "UserData.Value"):
            if key in call.params:
                texts.append(as_ec2_decodes(call.params[key]))
    return texts


def _ticket_of(user_data: str) -> str:
    found = TICKET_IN.search(user_data)
    assert found is not None, user_data
    return found.group(1)


async def _launch(ep: Endpoint, faults: FaultInjector) -> tuple[str, str, str]:
    """(instance id, private IP, the ticket in its user data as EC2 stores it) of one launch."""
    faults.record()
    [inst] = (await ep.cloud.launch("m5.large", 1, {})).instances
    [run] = [c for c in faults.recorded() if c.action == "RunInstances"]
    user_data = as_ec2_decodes(run.params["UserData"])
    assert inst.private_ip.startswith("127.")
    return inst.id, inst.private_ip, _ticket_of(user_data)


def _joined(hostname: str, address: str = "") -> Node:
    return Node(f"n-{hostname}", hostname, Availability.ACTIVE, NodeStatus.READY, address=address)


async def test_the_join_token_is_nowhere_in_what_reaches_ec2(
    endpoint: Endpoint, faults: FaultInjector, raw_ec2: Any
) -> None:
    """RunInstances, the hostname's CreateTags, and the warm pool's ModifyInstanceAttribute and
    CreateTags before a start: neither the token nor any part of it is sent; the user data (decoded as
    EC2 does) carries a ticket and the join URLs; the instance's tags carry only the nonce."""
    ep = endpoint
    faults.record()
    [inst] = (await ep.cloud.launch("m5.large", 1, {})).instances
    [pooled] = (await ep.cloud.launch("m5.large", 1, {}, pool=True)).instances
    await ep.cloud.stop_instances([pooled.id])
    await ep.cloud.start_instances([pooled.id])
    sent = _sent_texts(faults)
    actions = {c.action for c in faults.recorded()}
    assert {"RunInstances", "ModifyInstanceAttribute", "CreateTags", "StartInstances"} <= actions
    assert not [t for t in sent if TOKEN in t or "SWMTKN" in t]
    launch_data = as_ec2_decodes(
        next(c for c in faults.recorded() if c.action == "RunInstances").params["UserData"]
    )
    assert "https://127.0.0.1:1/v1/join" in launch_data and ep.url in launch_data
    assert f"--pinnedpubkey sha256//{ep.desk.tls.pin} " in launch_data  # the key's pin: no secret
    assert "docker swarm join" in launch_data and "--interface" in launch_data
    reply = await raw_ec2.describe_instances(InstanceIds=[inst.id, pooled.id])
    for raw in (i for r in reply["Reservations"] for i in r["Instances"]):
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", ())}
        assert not [v for v in tags.values() if TOKEN in v]
        assert re.fullmatch(r"[0-9a-f]{32}", tags[JOIN_NONCE_TAG])


async def test_only_the_machine_itself_gets_the_token_and_only_once(
    endpoint: Endpoint, faults: FaultInjector, loopback_vpc: LocalNetwork
) -> None:
    """The attacker read the ticket from user data (DescribeInstanceAttribute, or a task on another
    machine): from another address it gets nothing; the machine's own address with a wrong ticket gets
    nothing; the machine itself gets the token; once its node joined, the same ticket from the same
    address gets nothing."""
    ep = endpoint
    iid, ip, good = await _launch(ep, faults)
    elsewhere = ip.rsplit(".", 1)[0] + (".250" if not ip.endswith(".250") else ".251")
    status, body = await ep.post(elsewhere, {"ticket": good})
    assert status == 403 and TOKEN not in json.dumps(body)
    status, body = await ep.post("127.0.0.1", {"ticket": good})
    assert status == 403 and TOKEN not in json.dumps(body)
    status, _ = await ep.post(ip, {"ticket": ticket(TOKEN, new_nonce())})
    assert status == 403
    status, _ = await ep.post(ip, {"ticket": ticket("SWMTKN-1-another-swarm", new_nonce())})
    assert status == 403
    status, body = await ep.post(ip, {"ticket": good})
    assert (status, body) == (200, {"token": TOKEN, "manager": MANAGER})
    [inst] = [i for i in await ep.cloud.list_instances() if i.id == iid]
    ep.swarm.nodes.append(_joined(inst.hostname, ip))
    status, body = await ep.post(ip, {"ticket": good})
    assert status == 403 and TOKEN not in json.dumps(body)
    ep.swarm.nodes[:] = [_joined(inst.hostname)]  # a node by its hostname alone (address not known)
    assert (await ep.post(ip, {"ticket": good}))[0] == 403


async def test_a_machine_not_ours_or_of_another_deployment_gets_nothing(
    endpoint: Endpoint, raw_ec2: Any, loopback_vpc: LocalNetwork
) -> None:
    """Someone in the account launches a machine in our subnets carrying a nonce tag and the matching
    ticket they could compute if they held the token: without our ownership tags, or with another
    deployment's id, or another cluster's name, it gets nothing."""
    ep = endpoint
    ep.cloud.deployment = "our-swarm-id"
    cases = {
        "not ours": {},
        "another deployment": {
            OWNER_TAG: OWNER_VALUE,
            CLUSTER_TAG: ep.cloud.cluster_name,
            DEPLOYMENT_TAG: "theirs",
        },
        "another cluster": {OWNER_TAG: OWNER_VALUE, CLUSTER_TAG: "someone-else"},
    }
    for why, tags in cases.items():
        nonce = new_nonce()
        reply = await raw_ec2.run_instances(
            ImageId=loopback_vpc.ami_id,
            InstanceType="m5.large",
            MinCount=1,
            MaxCount=1,
            SubnetId=loopback_vpc.subnet_ids[0],
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in {**tags, JOIN_NONCE_TAG: nonce}.items()],
                }
            ],
        )
        ip = reply["Instances"][0]["PrivateIpAddress"]
        status, body = await ep.post(ip, {"ticket": ticket(TOKEN, nonce)})
        assert status == 403, why
        assert TOKEN not in json.dumps(body)


async def test_a_machine_past_its_start_time_gets_nothing(endpoint: Endpoint, faults: FaultInjector) -> None:
    """A machine launched longer than AUTOSCALER_MAX_START_TIME ago (the daemon ends it as broken) gets
    nothing, its ticket right, its address right, no node: a ticket is worth one boot's time."""
    ep = endpoint
    _, ip, good = await _launch(ep, faults)
    ep.desk.max_start_time = 0.0
    assert (await ep.post(ip, {"ticket": good}))[0] == 403
    ep.desk.max_start_time = 600.0
    assert (await ep.post(ip, {"ticket": good}))[0] == 200


async def test_a_warm_pool_start_carries_a_fresh_ticket(endpoint: Endpoint, faults: FaultInjector) -> None:
    """The pool's rewrite of user data before a start carries a new ticket (and the instance a new nonce
    tag): the machine gets the token with it, and not with the ticket of an earlier start."""
    ep = endpoint
    [inst] = (await ep.cloud.launch("m5.large", 1, {}, pool=True)).instances
    tickets = []
    for _ in range(2):  # stopped into the pool, started; twice
        await ep.cloud.stop_instances([inst.id])
        faults.record()
        await ep.cloud.start_instances([inst.id])
        [modify] = [c for c in faults.recorded() if c.action == "ModifyInstanceAttribute"]
        tickets.append(_ticket_of(as_ec2_decodes(modify.params["UserData.Value"])))
    old, current = tickets
    assert old != current
    assert (await ep.post(inst.private_ip, {"ticket": old}))[0] == 403
    status, body = await ep.post(inst.private_ip, {"ticket": current})
    assert (status, body["token"]) == (200, TOKEN)


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"ticket=abc", "application/x-www-form-urlencoded", 415),
        (b"{not json", "application/json", 400),
        (b'{"ticket": "XYZ"}', "application/json", 400),
        (b'{"ticket": 5}', "application/json", 400),
        (b'["ticket"]', "application/json", 400),
        (b'{"ticket": "' + b"a" * 64 + b'", "extra": 1}', "application/json", 400),
        (b"\xff\xfe", "application/json", 400),
        (b"[" * 5000 + b"]" * 5000, "application/json", 413),
        (b'{"ticket": "' + b"a" * 2000 + b'"}', "application/json", 413),
        (b'{"ticket": "' + b"a" * 64 + b'", "node": "Node-1"}', "application/json", 400),
        (b'{"ticket": "' + b"a" * 64 + b'", "node": 5}', "application/json", 400),
        (b'{"ticket": "' + b"a" * 64 + b'", "node": ""}', "application/json", 400),
        (b'{"ticket": "' + b"a" * 64 + b'", "node": "' + b"a" * 65 + b'"}', "application/json", 400),
    ],
)
async def test_malformed_requests_get_their_4xx(
    endpoint: Endpoint, faults: FaultInjector, body: bytes, content_type: str, status: int
) -> None:
    """Malformed input is refused before anything is read from EC2 (nothing reaches moto), with one
    log line that says why and never carries the body."""
    faults.record()
    with capture_logs() as logs:
        assert (await endpoint.post("127.0.0.1", body, content_type))[0] == status
    assert faults.recorded() == []
    [line] = [e for e in logs if e["event"] == "join refused"]
    assert line["status"] == status and body.decode(errors="replace")[:40] not in json.dumps(line)


async def test_one_address_is_limited(endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """More than `PER_ADDRESS` requests from one address in a minute: 429, other addresses still heard."""
    monkeypatch.setattr(join_module, "PER_ADDRESS", 3)
    statuses = [(await endpoint.post("127.0.0.9", b"{}"))[0] for _ in range(5)]
    assert statuses == [400, 400, 400, 429, 429]
    assert (await endpoint.post("127.0.0.10", b"{}"))[0] == 400


async def test_a_daemon_not_started_answers_503(endpoint: Endpoint, faults: FaultInjector) -> None:
    """Before its start-up checks (its deployment id unknown), the daemon cannot tell its machines."""
    _, ip, good = await _launch(endpoint, faults)
    endpoint.desk.ready = False
    assert (await endpoint.post(ip, {"ticket": good}))[0] == 503


async def test_only_the_machine_itself_confirms_its_node_and_only_that_node_is_adopted(
    endpoint: Endpoint, faults: FaultInjector
) -> None:
    """Someone holding a join token (from a deployment without tickets, say) joins a node under a pending
    machine's hostname; the machine joins too and confirms its node id. Naming the impostor's node, or
    its own, from another address, with a wrong ticket, naming a node of another hostname, a manager or
    a node confirmed for another instance: 403 and nothing labelled. The machine itself naming its
    node: that node is labelled with the instance id (a manager's write), and the planner, given what
    EC2 and this swarm list, adopts it and leaves the impostor unowned. A confirmation past the start
    time: 403."""
    ep = endpoint
    iid, ip, good = await _launch(ep, faults)
    assert (await ep.post(ip, {"ticket": good}))[0] == 200
    [inst] = [i for i in await ep.cloud.list_instances() if i.id == iid]
    host = inst.hostname
    impostor = replace(_joined(host), id="impostor0node")
    mine = replace(_joined(host), id="machine0node")
    elsewhere = replace(_joined("ip-10-9-9-9"), id="elsewhere0node")
    manager = replace(_joined(host), id="manager0node", is_manager=True)
    taken = replace(_joined(host), id="taken0node", labels={IDENTITY_LABEL: "i-0123456789abcdef0"})
    ep.swarm.nodes[:] = [impostor, mine, elsewhere, manager, taken]
    other = ip.rsplit(".", 1)[0] + (".250" if not ip.endswith(".250") else ".251")
    refused = [
        (other, good, "impostor0node"),
        (other, good, "machine0node"),
        (ip, ticket(TOKEN, new_nonce()), "machine0node"),
        (ip, good, "elsewhere0node"),
        (ip, good, "manager0node"),
        (ip, good, "taken0node"),
        (ip, good, "nosuchnode"),
    ]
    for source, given, node_id in refused:
        assert (await ep.post(source, {"ticket": given, "node": node_id}))[0] == 403, node_id
    assert ep.swarm.labelled == []
    status, body = await ep.post(ip, {"ticket": good, "node": "machine0node"})
    assert (status, body) == (200, {"node": "machine0node", "instance": iid})
    assert ep.swarm.labelled == [("machine0node", {IDENTITY_LABEL: iid})]
    assert (await ep.post(ip, {"ticket": good, "node": "machine0node"}))[0] == 200  # a retry: no new write
    assert len(ep.swarm.labelled) == 1
    # a task on the machine later reads the ticket (user data) and posts from the machine's own address,
    # naming the impostor: refused while the machine's confirmed node is ready
    assert (await ep.post(ip, {"ticket": good, "node": "impostor0node"}))[0] == 403
    assert len(ep.swarm.labelled) == 1
    snapshot = Snapshot(
        now=time.time(),
        instance_types=(),
        instances=tuple(await ep.cloud.list_instances()),
        nodes=tuple(n for n in await ep.swarm.list_nodes() if n.id in ("impostor0node", "machine0node")),
        workers=(),
        unrunnable=(),
    )
    fleet = classify(snapshot, replace(make_policy(), adopt_by_identity=True))
    [member] = [m for m in fleet.joining if m.instance is not None and m.instance.id == iid]
    assert member.node is not None and member.node.id == "machine0node"
    assert [m.node.id for m in fleet.unowned if m.node] == ["impostor0node"]
    ep.desk.max_start_time = 0.0
    assert (await ep.post(ip, {"ticket": good, "node": "machine0node"}))[0] == 403
