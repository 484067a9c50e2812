"""A small imitation of the Docker Engine API over a `MemorySwarm`, on a loopback port.

It serves exactly what the aiodocker-based adapter (`adapters/swarm.py`) calls, so that the real adapter
and a real `swarm-autoscaler run` process can drive an in-memory swarm of hundreds of nodes on one
machine, where a real dockerd per node (about 130 MB each) cannot. Used by the chaos world
(`localcloud/cloudhost.py`), the act benchmark (`bench/act_bench.py`) and the stop test:

- `GET /version` (aiodocker negotiates the API version with it);
- `GET /v*/nodes` (filters `id`, `name`, `role`, `membership` and `node.label`, `key` or `key=value`;
  `label`, the engine labels, is matched against the node labels too), `GET /v*/nodes/{id}`;
- `POST /v*/nodes/{id}/update?version=N` with a node spec: the version must be the node's current
  `Version.Index`, or docker's "update out of sequence" error (HTTP 500) comes back;
- `DELETE /v*/nodes/{id}?force=...`;
- `GET /v*/swarm` (the join tokens);
- `GET /v*/services` and `GET /v*/tasks` (filters ignored): the `services` source's, empty without one
  (the dynamic mode's demo), which also gives each node's `Description.Resources`.

The swarm's nodes keep their lifecycle marks apart from their labels (`model.Node.marks`); here they are
one set of labels, as on a real engine, written and read with the adapter's own label names. A node's
version moves whenever the node changes, whoever changed it (the machine emulator joins nodes directly).
A manager node (the swarm's leader, `manager_hostname`, with the swarm's `manager_address`, which the
adapter's join command reads) exists only in this API: machines never see it.

Use `url = await api.start()` ... `await api.close()`, or `async with DockerApi(swarm) as api:` and
`api.url`. Requests still in flight at close (see `write_latency`) are cut after half a second.

For chaos and stop tests: `latency` seconds (a number, or a callable drawn per request) are slept before
each request but `/version` is answered (a slow, uneven manager); `write_latency` seconds more before each
node update or removal (a manager that stopped answering them; `write_seen` is set and `writes_started`
counts from the moment one arrives); `conflict_rate` makes that share of updates meet a concurrent writer
(the node's version moves and the update is refused out of sequence, as when two clients race; counted
in `conflicts`, and every refusal in `out_of_sequence`); `guard(kind, node)` is awaited right before a
node is drained (`kind` "drain") or removed ("remove"), while nothing else can change it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from swarm_autoscaler.adapters.swarm import DEFAULT_PREFIX, labels_to_marks, mark_label_names, marks_to_labels
from swarm_autoscaler.core.model import Availability, Node
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm

API_VERSION = "1.45"
MANAGER_ID = "manager0001"
Guard = Callable[[str, Node], Awaitable[None]]


class ServicesSource(Protocol):
    """Swarm services and their tasks, in docker's JSON (`localcloud.memservices.MemoryServices`)."""

    def services_json(self) -> list[dict[str, Any]]: ...
    def tasks_json(self) -> list[dict[str, Any]]: ...
    def node_resources(self, hostname: str) -> dict[str, Any] | None:
        """What the engine on this host reports (`Description.Resources`); None: unknown."""
        ...


class DockerApi:
    """Serve `swarm` over HTTP: `await start()` returns the URL to give as AUTOSCALER_DOCKER_URL."""

    def __init__(
        self,
        swarm: MemorySwarm,
        *,
        guard: Guard | None = None,
        latency: float | Callable[[], float] = 0.0,
        write_latency: float = 0.0,
        conflict_rate: float = 0.0,
        seed: int = 0,
        prefix: str = DEFAULT_PREFIX,
        manager_hostname: str = "ip-10-0-255-1",
        services: ServicesSource | None = None,
    ) -> None:
        self.swarm = swarm
        self.services = services
        self._guard = guard
        self._latency = latency if callable(latency) else (lambda: float(latency))
        self.write_latency = write_latency
        self._conflict_rate = conflict_rate
        self._rng = random.Random(seed)
        self._prefix = prefix
        self._lifecycle = frozenset(mark_label_names(prefix).values())
        self._manager_hostname = manager_hostname
        self._index = itertools.count(10)
        self._versions: dict[str, tuple[Node, int]] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.requests = 0  # every request but /version
        self.conflicts = 0  # updates that met the concurrent writer of `conflict_rate`
        self.out_of_sequence = 0  # updates refused for a stale version (conflicts included)
        self.writes_started = 0  # node updates and removals received
        self.write_seen = asyncio.Event()  # set by the first node update or removal

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_get("/version", self._version)
        app.router.add_get("/{api}/version", self._version)
        app.router.add_get("/{api}/nodes", self._list)
        app.router.add_get("/{api}/nodes/{id}", self._inspect)
        app.router.add_post("/{api}/nodes/{id}/update", self._update)
        app.router.add_delete("/{api}/nodes/{id}", self._remove)
        app.router.add_get("/{api}/swarm", self._swarm)
        app.router.add_get("/{api}/services", self._services)
        app.router.add_get("/{api}/tasks", self._tasks)
        # Hung requests (write_latency) must not hold the shutdown for aiohttp's default 60 s.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"
        return self.url

    async def __aenter__(self) -> DockerApi:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # --- the engine's JSON -------------------------------------------------------------------------

    def version_of(self, node: Node) -> int:
        """The node's Version.Index: it moves whenever the node changed (any writer, machines included)."""
        seen = self._versions.get(node.id)
        if seen is None or seen[0] is not node:
            seen = (node, next(self._index))
            self._versions[node.id] = seen
        return seen[1]

    def node_json(self, node: Node) -> dict[str, Any]:
        labels = {**dict(node.labels), **marks_to_labels(node.marks, self._prefix)}
        return {
            "ID": node.id,
            "Version": {"Index": self.version_of(node)},
            "Spec": {
                "Labels": labels,
                "Role": "manager" if node.is_manager else "worker",
                "Availability": str(node.availability),
            },
            "Description": self._description(node.hostname),
            "Status": {"State": str(node.status), "Addr": "127.0.0.1"},
        }

    def _description(self, hostname: str) -> dict[str, Any]:
        resources = self.services.node_resources(hostname) if self.services is not None else None
        return {"Hostname": hostname} | ({"Resources": resources} if resources is not None else {})

    def _manager_json(self) -> dict[str, Any]:
        return {
            "ID": MANAGER_ID,
            "Version": {"Index": 1},
            "Spec": {"Labels": {}, "Role": "manager", "Availability": "active"},
            "Description": {"Hostname": self._manager_hostname},
            "Status": {"State": "ready", "Addr": "127.0.0.1"},
            "ManagerStatus": {
                "Leader": True,
                "Reachability": "reachable",
                "Addr": self.swarm.manager_address,
            },
        }

    # --- handlers ----------------------------------------------------------------------------------

    async def _answer_later(self) -> None:
        self.requests += 1
        delay = self._latency()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _write_arrives(self) -> None:
        self.writes_started += 1
        self.write_seen.set()
        if self.write_latency > 0:
            await asyncio.sleep(self.write_latency)

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"ApiVersion": API_VERSION, "Version": "imitation", "MinAPIVersion": "1.24"})

    async def _list(self, request: web.Request) -> web.Response:
        await self._answer_later()
        filters = _filters(request.query.get("filters"))
        nodes = [self._manager_json()] + [self.node_json(n) for n in self.swarm.nodes.values()]
        return web.json_response([n for n in nodes if _matches(n, filters)])

    async def _inspect(self, request: web.Request) -> web.Response:
        await self._answer_later()
        node_id = request.match_info["id"]
        if node_id == MANAGER_ID:
            return web.json_response(self._manager_json())
        node = self.swarm.nodes.get(node_id)
        if node is None:
            return _error(404, f"node {node_id} not found")
        return web.json_response(self.node_json(node))

    async def _update(self, request: web.Request) -> web.Response:
        await self._write_arrives()
        spec = await request.json()
        await self._answer_later()
        node = self.swarm.nodes.get(request.match_info["id"])
        if node is None:
            return _error(404, f"node {request.match_info['id']} not found")
        if self._conflict_rate and self._rng.random() < self._conflict_rate:
            self.conflicts += 1  # someone else wrote the node just before us: its version moves on
            self.swarm.nodes[node.id] = node = dataclasses.replace(node)
        if int(request.query.get("version", "-1")) != self.version_of(node):
            self.out_of_sequence += 1
            return _error(500, "rpc error: code = Unknown desc = update out of sequence")
        availability = Availability(spec.get("Availability", str(node.availability)))
        if availability == Availability.DRAIN and node.availability != Availability.DRAIN and self._guard:
            await self._guard("drain", node)
            if node.id not in self.swarm.nodes:  # the guard only reads, but the machine may have left
                return _error(404, f"node {node.id} not found")
        labels: Mapping[str, str] = spec.get("Labels") or {}
        self.swarm.replace_node(  # recomputes `ours` from the labels, as the adapter reads it
            node.id,
            availability=availability,
            labels={k: v for k, v in labels.items() if k not in self._lifecycle},
            marks=labels_to_marks(labels, self._prefix),
        )
        return web.Response(status=200)

    async def _remove(self, request: web.Request) -> web.Response:
        await self._write_arrives()
        await self._answer_later()
        node_id = request.match_info["id"]
        if node_id == MANAGER_ID:
            return _error(400, "rpc error: code = FailedPrecondition desc = node is a manager")
        node = self.swarm.nodes.get(node_id)
        if node is None:
            return _error(404, f"node {node_id} not found")
        if self._guard is not None:
            await self._guard("remove", node)
        await self.swarm.remove(node_id)
        return web.Response(status=200)

    async def _services(self, _: web.Request) -> web.Response:
        await self._answer_later()
        return web.json_response(self.services.services_json() if self.services is not None else [])

    async def _tasks(self, _: web.Request) -> web.Response:
        await self._answer_later()
        return web.json_response(self.services.tasks_json() if self.services is not None else [])

    async def _swarm(self, _: web.Request) -> web.Response:
        await self._answer_later()
        return web.json_response(
            {"ID": "swarm-imitation", "JoinTokens": {"Worker": self.swarm.join_token, "Manager": "SWMTKN-m"}}
        )


def _filters(raw: str | None) -> dict[str, set[str]]:
    """Docker's `filters` query parameter: {name: [values]} (or {name: {value: true}}) as JSON."""
    if not raw:
        return {}
    parsed: dict[str, Any] = json.loads(raw)
    return {name: {values} if isinstance(values, str) else set(values) for name, values in parsed.items()}


def _matches(node: Mapping[str, Any], filters: Mapping[str, set[str]]) -> bool:
    """A node passes when, for every filter, it matches one of its values (as docker combines them)."""
    return all(any(_match_one(node, name, v) for v in values) for name, values in filters.items())


def _match_one(node: Mapping[str, Any], name: str, value: str) -> bool:
    match name:
        case "id":
            return str(node["ID"]).startswith(value)
        case "name":
            return bool(node["Description"]["Hostname"] == value)
        case "role":
            return bool(node["Spec"]["Role"] == value)
        case "membership":
            return value == "accepted"
        case "node.label" | "label":
            return _has_label(node["Spec"]["Labels"], value)
    return False  # a filter this imitation does not know matches nothing, rather than everything


def _has_label(labels: Mapping[str, str], wanted: str) -> bool:
    key, eq, value = wanted.partition("=")
    return key in labels and (not eq or labels[key] == value)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"message": message}, status=status)
