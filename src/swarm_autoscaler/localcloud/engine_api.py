"""The in-memory swarm served over a small imitation of the Docker Engine API, so that the real swarm
adapter (aiodocker over HTTP) and a real `swarm-autoscaler run` process can drive a swarm of hundreds of
nodes on one machine, where a real dockerd per node (about 130 MB each) cannot.

Served on 127.0.0.1 only: `GET /version`, `GET /v{api}/nodes`, `GET /v{api}/nodes/{id}`,
`POST /v{api}/nodes/{id}/update?version=N` (docker's optimistic concurrency: a stale `N` is refused
with "update out of sequence", as dockerd does), `DELETE /v{api}/nodes/{id}` and `GET /v{api}/swarm`.
Lifecycle marks travel as labels exactly as the adapter writes them (`adapters.swarm`). A node's version
changes whenever the node changes, however it was changed (the machine emulator joins nodes directly).
`latency` delays every answer, to stand in for a busy manager; `write_latency` delays node updates and
removals further (a manager that stopped answering them, for stop tests). The manager itself is not a node of the
in-memory swarm: only a listing filtered on managers shows it (with its address, for the join command).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from swarm_autoscaler.adapters.swarm import (
    DEFAULT_PREFIX,
    labels_to_marks,
    mark_label_names,
    marks_to_labels,
)
from swarm_autoscaler.core.model import Availability, Node
from swarm_autoscaler.localcloud.memswarm import MemorySwarm

API_VERSION = "1.41"


class EngineApi:
    """Serves `swarm` until `close()`. Use `async with EngineApi(swarm) as api:` and `api.url`."""

    def __init__(self, swarm: MemorySwarm, *, latency: float = 0.0, write_latency: float = 0.0) -> None:
        self.swarm = swarm
        self.latency = latency
        self.write_latency = write_latency
        self.writes_started = 0
        self.write_seen = asyncio.Event()  # set by the first node update or removal
        self.out_of_sequence = 0  # updates refused for a stale version
        self.requests = 0
        self._versions: dict[str, tuple[Node, int]] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> EngineApi:
        app = web.Application()
        prefix = f"/v{API_VERSION}"
        app.router.add_get("/version", self._version)
        app.router.add_get(f"{prefix}/nodes", self._list)
        app.router.add_get(f"{prefix}/nodes/{{id}}", self._inspect)
        app.router.add_post(f"{prefix}/nodes/{{id}}/update", self._update)
        app.router.add_delete(f"{prefix}/nodes/{{id}}", self._remove)
        app.router.add_get(f"{prefix}/swarm", self._swarm)
        # Hung requests (write_latency) must not hold the shutdown for aiohttp's default 60 s.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ------------------------------------------------------------------ the engine's view of a node

    def _version_of(self, node: Node) -> int:
        seen = self._versions.get(node.id)
        if seen is None or seen[0] is not node:  # nodes are frozen: any change is a new object
            seen = (node, (seen[1] + 1) if seen else 1)
            self._versions[node.id] = seen
        return seen[1]

    def _raw(self, node: Node) -> dict[str, Any]:
        labels = {**node.labels, **marks_to_labels(node.marks, DEFAULT_PREFIX)}
        return {
            "ID": node.id,
            "Version": {"Index": self._version_of(node)},
            "Spec": {
                "Labels": labels,
                "Role": "manager" if node.is_manager else "worker",
                "Availability": str(node.availability),
            },
            "Description": {"Hostname": node.hostname},
            "Status": {"State": str(node.status)},
        }

    # ------------------------------------------------------------------ handlers

    async def _answer(self, body: Any, status: int = 200) -> web.Response:
        self.requests += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        return web.json_response(body, status=status)

    async def _version(self, _: web.Request) -> web.Response:
        return await self._answer({"ApiVersion": API_VERSION, "Version": "memory"})

    async def _list(self, request: web.Request) -> web.Response:
        if "manager" in request.query.get("filters", ""):  # the swarm's manager: for the join command
            address = self.swarm.manager_address
            manager = {"ID": "manager", "ManagerStatus": {"Leader": True, "Addr": address}}
            return await self._answer([manager])
        return await self._answer([self._raw(n) for n in self.swarm.nodes.values()])

    async def _inspect(self, request: web.Request) -> web.Response:
        node = self.swarm.nodes.get(request.match_info["id"])
        if node is None:
            return await self._answer({"message": "node not found"}, 404)
        return await self._answer(self._raw(node))

    async def _write_delay(self) -> None:
        self.writes_started += 1
        self.write_seen.set()
        if self.write_latency:
            await asyncio.sleep(self.write_latency)

    async def _update(self, request: web.Request) -> web.Response:
        await self._write_delay()
        node_id = request.match_info["id"]
        node = self.swarm.nodes.get(node_id)
        if node is None:
            return await self._answer({"message": f"node {node_id} not found"}, 404)
        if int(request.query.get("version", "-1")) != self._version_of(node):
            self.out_of_sequence += 1
            return await self._answer({"message": "update out of sequence"}, 500)
        spec = await request.json()
        labels = dict(spec.get("Labels") or {})
        lifecycle = set(mark_label_names(DEFAULT_PREFIX).values())
        self.swarm.replace_node(
            node_id,
            availability=Availability(spec.get("Availability", node.availability)),
            labels={k: v for k, v in labels.items() if k not in lifecycle},
            marks=labels_to_marks(labels, DEFAULT_PREFIX),
        )
        return await self._answer({})

    async def _remove(self, request: web.Request) -> web.Response:
        await self._write_delay()
        node_id = request.match_info["id"]
        if node_id not in self.swarm.nodes:
            return await self._answer({"message": f"node {node_id} not found"}, 404)
        await self.swarm.remove(node_id)
        return await self._answer({})

    async def _swarm(self, _: web.Request) -> web.Response:
        return await self._answer({"JoinTokens": {"Worker": self.swarm.join_token, "Manager": "-"}})
