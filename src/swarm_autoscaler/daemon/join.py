"""`POST /v1/join`: the swarm worker join token, for one of our machines booting, and nobody else.

With `AUTOSCALER_EC2_JOIN_URL` set, a machine's user data carries a join ticket, not the token
(`adapters.join_tickets`). At boot it posts `{"ticket": "<hex>"}` here from its own private address.
The answer is `{"token": ..., "manager": "host:port"}` only when all of these hold, read fresh:

1. the TCP source address of the request is the private IP of exactly one pending or running instance
   of ours (DescribeInstances filtered by that address, ownership and deployment tags checked);
2. that instance's nonce tag gives the ticket (HMAC under the worker join token, compared in constant
   time);
3. swarm has no node for that instance yet (none with its hostname, none at its address);
4. it launched, or started from the warm pool, less than `AUTOSCALER_MAX_START_TIME` ago (EC2's clock).

Once joined, the machine confirms its node: it posts `{"ticket": "<hex>", "node": "<its swarm node id>"}`
(`docker info`) the same way, and checks 1, 2 and 4 hold again; the node must exist, be a worker, carry
the instance's hostname and no other instance's id, and no other ready node may be confirmed for the
instance already (a task on the machine later, which can read the ticket, cannot name a second node;
a warm-pool start's new node replaces a down one). The desk then labels it `cluster.IDENTITY_LABEL` =
the instance id (a manager's write: a node cannot label itself) and answers `{"node": ..., "instance":
...}`. With join tickets on, the planner adopts only a node so labelled (`Policy.adopt_by_identity`),
so a node that took a pending machine's hostname with a join token obtained elsewhere stays unowned:
only the machine itself, from its own address, with its ticket, names its node.

Any replica answers: all it needs is in EC2 (address, nonce, launch time) and swarm (token, nodes),
which every replica reads; the leader lock plays no part. The source address is what the TCP
connection came from (never a header): inside a VPC, EC2's source/destination check keeps an instance
from sending from another's address. So the daemon's join port must be reached from the workers'
subnets directly (no NAT, no proxy, no swarm routing mesh: host-mode publishing), docs/deployment.md.

TLS only, on a listener of its own (`AUTOSCALER_EC2_JOIN_PORT`, nothing else served there): the answer is
the join token, which must not cross the VPC in clear. The key is derived from the worker join token
(`adapters.join_tls`), so every replica serves the same one and the machine's user data pins it. Each
replica reloads it when the token changes: read at every request and every `KEY_REFRESH_S` (a standby
that serves no request still follows a rotation within that time; a boot in flight retries meanwhile).

Refusals: a malformed request is 400 (body not a JSON object with one 64-hex-digit `ticket`, and for a
confirmation one `node` of at most 64 lower-case letters and digits), 413
(over 1 KiB) or 415 (not `application/json`); any failed check is 403 with the same body whatever
failed (the log line says which: one line, never the ticket); more than `PER_ADDRESS` requests from one
address within `WINDOW_S`, or more than `CONCURRENT` lookups at once, is 429; EC2 or swarm failing, or a
daemon not started yet, is 503. Each is one log line.

The wiring `open_daemon` uses is here too: `join_desk` (refused when the join port is the HTTP port),
`serve_join` (the TLS listener), `keep_key` (the refresh), `join_urls` (`AUTOSCALER_EC2_JOIN_URL=auto`:
every manager's advertised address at `AUTOSCALER_EC2_JOIN_PORT`, read from swarm at each launch,
`ec2_join.JoinUrls`) and `check_join_urls` (at start: `auto` that finds no manager address is refused in
one line; join tickets off is one warning, since the token then sits in every machine's user data).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.adapters.ec2_join import JoiningMachine, JoinUrls
from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.adapters.join_tickets import JOIN_PATH, TICKET, ticket_matches
from swarm_autoscaler.adapters.join_tls import JoinTls
from swarm_autoscaler.config.settings import Settings
from swarm_autoscaler.core.cluster import IDENTITY_LABEL, confirmed_instance
from swarm_autoscaler.core.model import Node, NodeStatus
from swarm_autoscaler.core.ports import Orchestrator
from swarm_autoscaler.errors import AutoscalerError, ConfigurationError
from swarm_autoscaler.runtime.http import listen

log = structlog.get_logger("swarm_autoscaler.daemon.join")

ROUTE = JOIN_PATH
MAX_BODY = 1024
PER_ADDRESS = 12  # a boot asks at most 5 times (boot_scripts.JOIN_ATTEMPTS), a warm-pool start as many
WINDOW_S = 60.0
CONCURRENT = 8  # fresh DescribeInstances at once: the endpoint never becomes a way to throttle EC2 for us
MAX_ADDRESSES = 4096  # addresses remembered for the per-address limit (older ones are forgotten first)
KEY_REFRESH_S = 5.0  # one swarm inspect: a rotated join token reaches the served key within this
_REFUSED = {"error": "refused: not a machine of this daemon waiting to join"}
NODE_ID = re.compile(r"[0-9a-z]{1,64}")  # swarm's node ids are 25 of these


@dataclass
class JoinDesk:
    """The checks behind `POST /v1/join` (module doc). `ready` stays False until the daemon's start-up
    checks passed (its deployment id is known): until then every request gets 503. `tls` is the
    listener's context, holding the key of the last join token read (`refresh`). `label_node` writes a
    confirmed node's identity label (the orchestrator's `add_labels`); None: confirmations get 403."""

    machines_at: Callable[[str], Awaitable[Sequence[JoiningMachine]]]
    join_command: Callable[[], Awaitable[tuple[str, str]]]
    list_nodes: Callable[[], Awaitable[Sequence[Node]]]
    clock: Callable[[], float]
    max_start_time: float
    label_node: Callable[[str, Mapping[str, str]], Awaitable[None]] | None = None
    ready: bool = False
    monotonic: Callable[[], float] = time.monotonic
    _seen: dict[str, list[float]] = field(default_factory=dict)
    _lookups: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CONCURRENT))
    tls: JoinTls = field(default_factory=JoinTls)

    async def refresh(self) -> None:
        """Serve the key of the join token swarm has now (`JoinTls.use`). Raises what `join_command`
        raises (`AutoscalerError`)."""
        token, _ = await self.join_command()
        self._use(token)

    def _use(self, token: str) -> None:
        if self.tls.use(token):
            log.info("join endpoint key loaded for the current swarm join token", pin=self.tls.pin)

    def limited(self, address: str) -> bool:
        """Count a request from `address`; True when it is over the per-address limit."""
        now = self.monotonic()
        recent = [t for t in self._seen.pop(address, []) if now - t < WINDOW_S]
        recent.append(now)
        self._seen[address] = recent  # re-inserted: the dict keeps addresses in order of last request
        while len(self._seen) > MAX_ADDRESSES:
            self._seen.pop(next(iter(self._seen)))
        return len(recent) > PER_ADDRESS

    async def answer(self, address: str, given: str, node_id: str = "") -> tuple[int, dict[str, str], str]:
        """(status, body, reason for the log) for a well-formed ticket from `address`; with `node_id`, the
        machine's confirmation of its node (module doc)."""
        if not self.ready:
            return 503, {"error": "the daemon is starting"}, "not started"
        if self._lookups.locked():
            return 429, {"error": "busy: try again"}, "too many lookups at once"
        async with self._lookups:
            try:
                if node_id:
                    return await self._confirm(address, given, node_id)
                return await self._check(address, given)
            except AutoscalerError as exc:
                return 503, {"error": "cannot check now: try again"}, f"lookup failed: {exc}"

    async def _machine(self, address: str, given: str) -> tuple[JoiningMachine, str, str] | str:
        """(the machine of ours at `address` whose ticket is `given` and that is young enough, the join
        token and the manager address swarm has now), or why not."""
        found = await self.machines_at(address)
        if len(found) != 1:
            return f"{len(found)} machines of ours at this address"
        machine = found[0]
        inst = machine.instance
        token, manager = await self.join_command()
        self._use(token)
        if not ticket_matches(token, machine.nonce, given):
            return f"wrong ticket for {inst.id}"
        age = self.clock() - inst.launched_at
        if age >= self.max_start_time:
            return f"{inst.id} started {age:.0f} s ago (AUTOSCALER_MAX_START_TIME)"
        return machine, token, manager

    async def _check(self, address: str, given: str) -> tuple[int, dict[str, str], str]:
        found = await self._machine(address, given)
        if isinstance(found, str):
            return 403, _REFUSED, found
        machine, token, manager = found
        inst = machine.instance
        nodes = await self.list_nodes()
        host = machine_hostname(inst.hostname)
        if any((host and machine_hostname(n.hostname) == host) or n.address == address for n in nodes):
            return 403, _REFUSED, f"{inst.id} already has a swarm node"
        return 200, {"token": token, "manager": manager}, f"{inst.id} may join"

    async def _confirm(self, address: str, given: str, node_id: str) -> tuple[int, dict[str, str], str]:
        found = await self._machine(address, given)
        if isinstance(found, str):
            return 403, _REFUSED, found
        inst = found[0].instance
        nodes = await self.list_nodes()
        node = next((n for n in nodes if n.id == node_id), None)
        host = machine_hostname(inst.hostname)
        if node is None or node.is_manager or self.label_node is None:
            return 403, _REFUSED, f"{inst.id} named node {node_id}: no such worker node"
        if not host or machine_hostname(node.hostname) != host:
            return 403, _REFUSED, f"{inst.id} named node {node_id} of another hostname ({node.hostname})"
        confirmed = confirmed_instance(node)
        if confirmed not in ("", inst.id):
            return 403, _REFUSED, f"{inst.id} named node {node_id}, confirmed for {confirmed}"
        others = [n for n in nodes if n.id != node_id and confirmed_instance(n) == inst.id]
        if any(n.status == NodeStatus.READY for n in others):
            return (
                403,
                _REFUSED,
                f"{inst.id} named node {node_id}, but another of its nodes is confirmed and ready",
            )
        if confirmed != inst.id:
            await self.label_node(node.id, {IDENTITY_LABEL: inst.id})
        return 200, {"node": node.id, "instance": inst.id}, f"{inst.id} confirmed its node {node.id}"


def join_desk(settings: Settings, ec2: Ec2Cloud, swarm: Orchestrator) -> JoinDesk | None:
    """The join endpoint's checks (`daemon.join`), with `AUTOSCALER_EC2_JOIN_URL` set; refused at start
    when its port is the HTTP port (one listener cannot be both plain and TLS)."""
    if not settings.ec2.join_url:
        return None
    if settings.ec2.join_port == settings.http.port:
        raise ConfigurationError(
            f"AUTOSCALER_EC2_JOIN_PORT is AUTOSCALER_HTTP_PORT ({settings.http.port}): the join endpoint "
            "serves TLS on a port of its own; choose another port for one of them"
        )
    return JoinDesk(
        machines_at=ec2.machines_at,
        join_command=swarm.join_command,
        list_nodes=swarm.list_nodes,
        label_node=swarm.add_labels,
        clock=ec2.now,
        max_start_time=settings.timing.max_start_time,
    )


async def check_join_urls(ec2: Ec2Cloud) -> None:
    """With join tickets, the URLs machines get now, said once (`auto` that finds no manager address is
    refused: `JoinUrls.resolve`); without, one warning: the join token is then in every user data."""
    if not ec2.join_urls.on:
        log.warning(
            "join tickets are off (AUTOSCALER_EC2_JOIN_URL is empty): the swarm join token goes into every "
            "machine's user data, readable by anyone allowed ec2:DescribeInstanceAttribute and by every "
            "process on the machine through its metadata service; set AUTOSCALER_EC2_JOIN_URL=auto and "
            "publish AUTOSCALER_EC2_JOIN_PORT to the workers' subnets (docs/deployment.md)"
        )
        return
    urls = await ec2.join_urls.resolve()
    log.info("join tickets on: machines fetch the join token at boot", join_urls=list(urls))


def join_urls(settings: Settings, swarm: Orchestrator) -> JoinUrls:
    """`AUTOSCALER_EC2_JOIN_URL`: `auto` reads every manager's address from swarm at each launch."""
    if settings.ec2.join_auto:
        return JoinUrls(managers=swarm.manager_addresses, port=settings.ec2.join_port)
    return JoinUrls(tuple(settings.ec2.join_url))


async def serve_join(desk: JoinDesk, host: str, port: int) -> web.AppRunner:
    """Listen for `POST /v1/join` over TLS (`desk.tls`) on `host:port`, nothing else served there; the
    caller stops it with `await runner.cleanup()`. A port that cannot be listened on is a
    `ConfigurationError` naming the setting."""
    app = web.Application()
    add_join_route(app, desk)
    return await listen(
        app, host, port, "AUTOSCALER_EC2_JOIN_PORT", desk.tls.context, " for the join endpoint"
    )


async def keep_key(desk: JoinDesk, interval: float = KEY_REFRESH_S) -> None:
    """Follow the join token (`JoinDesk.refresh`) every `interval` for as long as it runs; a failed
    read is one warning and the key served stays as it was."""
    while True:
        await asyncio.sleep(interval)
        try:
            await desk.refresh()
        except AutoscalerError as exc:
            log.warning("cannot read the swarm join token to follow the join endpoint's key", error=str(exc))


@contextlib.asynccontextmanager
async def refreshing(desk: JoinDesk) -> AsyncIterator[None]:
    """`keep_key` in the background while the block runs."""
    task = asyncio.create_task(keep_key(desk), name="join-key")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def add_join_route(app: web.Application, desk: JoinDesk) -> None:
    """Serve `desk` at `POST /v1/join` on `app`."""

    async def join(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        address = _plain(str(peer[0])) if peer else ""
        status, body, reason = await _respond(desk, request, address)
        line = log.info if status == 200 else log.warning
        line(
            "join granted" if status == 200 else "join refused", address=address, status=status, reason=reason
        )
        return web.json_response(body, status=status, headers={"Cache-Control": "no-store"})

    app.router.add_post(ROUTE, join)


async def _respond(desk: JoinDesk, request: web.Request, address: str) -> tuple[int, dict[str, str], str]:
    if not address:
        return 400, {"error": "no source address"}, "no peer address"
    if desk.limited(address):
        return 429, {"error": "too many requests: try again later"}, f"over {PER_ADDRESS} in {WINDOW_S:.0f} s"
    if request.content_type != "application/json":
        return 415, {"error": "send JSON: Content-Type application/json"}, "not JSON"
    if request.content_length is not None and request.content_length > MAX_BODY:
        return 413, {"error": f"a body of at most {MAX_BODY} bytes"}, "body too large"
    raw = await request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        return 413, {"error": f"a body of at most {MAX_BODY} bytes"}, "body too large"
    parsed = _ticket_of(raw)
    if parsed is None:
        return (
            400,
            {"error": 'send {"ticket": "<64 hex digits>"} (and "node": "<node id>" once joined)'},
            ("malformed body"),
        )
    return await desk.answer(address, *parsed)


def _plain(address: str) -> str:
    """An IPv4 peer as EC2 names it, also when a dual-stack socket reports it IPv4-mapped."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def _ticket_of(raw: bytes) -> tuple[str, str] | None:
    """(ticket, node id or "") of a body `{"ticket": "<64 hex>"}` or `{"ticket": ..., "node": "<id>"}`
    (nothing else), or None."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or set(body) not in ({"ticket"}, {"ticket", "node"}):
        return None
    given, node_id = body["ticket"], body.get("node", "")
    if not isinstance(given, str) or not TICKET.fullmatch(given):
        return None
    if "node" in body and not (isinstance(node_id, str) and NODE_ID.fullmatch(node_id)):
        return None
    return given, node_id
