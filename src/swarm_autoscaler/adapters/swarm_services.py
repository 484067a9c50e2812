"""Dynamic mode's workload: `ports.Workload` over the swarm's services and tasks, with aiodocker.

One read (`GET /nodes`, `GET /services`, `GET /tasks`) is translated into `core.services` values and
turned into the planner's `WorkloadView` there (pure): every ready non-manager node is a worker whose
processing tasks are the service tasks on it; tasks waiting for a node are unrunnable.

- A service is **global** when its `Spec.Mode` is `Global` (or `GlobalJob`): its tasks never keep a
  node busy. A service labelled `swarm-autoscaler.daemon` (any value) is the daemon's own: ignored too.
- Reservations: `NanoCPUs` / 1e9 CPUs, `MemoryBytes`, and `GenericResources`: a discrete or named
  resource of kind `NVIDIA-GPU` or `gpu` (any case) counts as GPUs, others by their kind (a named one counts 1 per
  value).
- There is no worker process to retire or cordon: **retire** and **fence** set the node's availability
  to `pause` (swarm places nothing new there; what runs stays), after which the planner drains it.
  `cordon` does nothing (the daemon turns consolidation off in this mode). `unfence` sets back to active
  only the nodes this adapter paused for a fence and that are still paused.
- A fence re-reads the tasks after pausing: a host with a task on it is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import aiodocker
import aiohttp

from swarm_autoscaler.adapters.swarm import DEFAULT_PREFIX, node_from_api
from swarm_autoscaler.core.model import Availability, InstanceType, Policy, Resources, Worker
from swarm_autoscaler.core.ports import Fence, WorkloadView
from swarm_autoscaler.core.services import ServiceTask, SwarmNode, busy_hosts, service_view
from swarm_autoscaler.errors import EndpointError, NotFoundError

OWN_SERVICE_LABEL = "swarm-autoscaler.daemon"
# Generic resource kinds that are GPUs (lower case): `NVIDIA-GPU` is what the daemon's GPU machines
# advertise (`config.gpus`), `gpu` what other guides use.
GPU_KINDS = ("gpu", "nvidia-gpu")
_GLOBAL_MODES = ("Global", "GlobalJob")


def resources_of(raw: Mapping[str, Any] | None) -> Resources:
    """Docker's `Resources` (a reservation, or a node's `Description.Resources`) as model Resources."""
    raw = raw or {}
    generic: dict[str, float] = {}
    gpus = 0
    for item in raw.get("GenericResources") or ():
        discrete = item.get("DiscreteResourceSpec")
        named = item.get("NamedResourceSpec")
        kind, amount = "", 0.0
        if discrete:
            kind, amount = str(discrete.get("Kind", "")), float(discrete.get("Value", 0))
        elif named:
            kind, amount = str(named.get("Kind", "")), 1.0
        if kind.lower() in GPU_KINDS:
            gpus += int(amount)
        elif kind:
            generic[kind] = generic.get(kind, 0.0) + amount
    cpus = int(raw.get("NanoCPUs") or 0) / 1e9
    return Resources.of(cpus, int(raw.get("MemoryBytes") or 0), gpus, **generic)


def task_from_api(raw: Mapping[str, Any], services: Mapping[str, Mapping[str, Any]]) -> ServiceTask:
    """One task of `GET /tasks` with its service (by id) as a `ServiceTask`."""
    spec = raw.get("Spec") or {}
    service = services.get(str(raw.get("ServiceID", ""))) or {}
    service_spec = service.get("Spec") or {}
    status = raw.get("Status") or {}
    return ServiceTask(
        id=str(raw["ID"]),
        service=str(service_spec.get("Name", raw.get("ServiceID", ""))),
        state=str(status.get("State", "")),
        desired=str(raw.get("DesiredState", "")),
        node_id=str(raw.get("NodeID") or ""),
        needs=resources_of((spec.get("Resources") or {}).get("Reservations")),
        constraints=tuple((spec.get("Placement") or {}).get("Constraints") or ()),
        global_service=any(mode in (service_spec.get("Mode") or {}) for mode in _GLOBAL_MODES),
        ours=OWN_SERVICE_LABEL in (service_spec.get("Labels") or {}),
        message=str(status.get("Err") or status.get("Message") or ""),
    )


class SwarmServicesWorkload:
    """`ports.Workload` for the swarm whose manager's engine API is at `docker_url`, as seen by the
    cluster `cluster_name` with the allowed types of `policy` (for each node's room)."""

    def __init__(
        self,
        docker_url: str,
        cluster_name: str,
        catalogue: Sequence[InstanceType],
        policy: Policy,
        *,
        label_prefix: str = DEFAULT_PREFIX,
        timeout: float = 30.0,
        poll: float = 2.0,
    ) -> None:
        self.docker_url = docker_url
        self.cluster_name = cluster_name
        self.catalogue = tuple(catalogue)
        self.policy = policy
        self.prefix = label_prefix
        self._timeout = timeout
        self._poll = poll
        self._docker: aiodocker.Docker | None = None
        self._endpoint = f"docker engine {docker_url}"
        self._fenced: set[str] = set()  # node ids this adapter paused for a fence
        self._seen_waiting: frozenset[str] = frozenset()

    @property
    def address(self) -> str:
        return self.docker_url

    def _client(self) -> aiodocker.Docker:
        if self._docker is None:
            self._docker = aiodocker.Docker(
                url=self.docker_url, timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        return self._docker

    async def close(self) -> None:
        if self._docker is not None:
            docker, self._docker = self._docker, None
            await docker.close()

    async def __aenter__(self) -> SwarmServicesWorkload:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ reads

    async def read(self) -> tuple[tuple[SwarmNode, ...], tuple[ServiceTask, ...]]:
        """The nodes and every task, read concurrently (three engine calls)."""
        client = self._client()
        raw_nodes, raw_services, raw_tasks = await asyncio.gather(
            self._call("list nodes", client.nodes.list()),
            self._call("list services", client.services.list()),
            self._call("list tasks", client.tasks.list()),
        )
        try:
            services = {str(s["ID"]): s for s in raw_services}
            nodes = tuple(
                SwarmNode(
                    node_from_api(raw, self.prefix, self.cluster_name),
                    resources_of((raw.get("Description") or {}).get("Resources")),
                )
                for raw in raw_nodes
                if (raw.get("Description") or {}).get("Hostname")
            )
            tasks = tuple(task_from_api(t, services) for t in raw_tasks)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise EndpointError(self._endpoint, f"unexpected answer from docker ({exc!r})") from exc
        return nodes, tasks

    async def _view(self, with_pending: bool) -> tuple[WorkloadView, tuple[SwarmNode, ...]]:
        nodes, tasks = await self.read()
        view = service_view(nodes, tasks, self.catalogue, self.policy, self.cluster_name, with_pending)
        if with_pending:
            self._seen_waiting = frozenset(t.key for t in view.unrunnable)
        return view, nodes

    async def observe(self) -> WorkloadView:
        return (await self._view(with_pending=True))[0]

    async def list_workers(self) -> tuple[Worker, ...]:
        return (await self._view(with_pending=False))[0].workers

    async def check(self) -> None:
        """One read, so that a start-up fails at once on an engine that cannot answer it."""
        await self.read()

    # ------------------------------------------------------------------ no worker process: nodes

    async def _set(self, node_id: str, availability: Availability, attempts: int = 5) -> None:
        """Set a node's availability with the version just read; re-read when it went stale."""
        for attempt in range(attempts):
            try:
                return await self._set_once(node_id, availability)
            except EndpointError as exc:
                if "out of sequence" not in str(exc) or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))

    async def _set_once(self, node_id: str, availability: Availability) -> None:
        client = self._client()
        raw = await self._call(f"inspect node {node_id}", client.nodes.inspect(node_id=node_id))
        spec = dict(raw["Spec"]) | {"Availability": str(availability)}
        if spec != raw["Spec"]:
            update = client.nodes.update(node_id=node_id, version=int(raw["Version"]["Index"]), spec=spec)
            await self._call(f"update node {node_id}", update)

    async def retire(self, addresses: Sequence[str]) -> tuple[str, ...]:
        """Pause these nodes (addresses are node ids): swarm places nothing new there."""
        done = []
        for node_id in addresses:
            try:
                await self._set(node_id, Availability.PAUSE)
            except NotFoundError:
                continue
            done.append(node_id)
        return tuple(done)

    async def cordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return ()  # consolidation is off in the dynamic mode

    async def uncordon(self, addresses: Sequence[str]) -> tuple[str, ...]:
        return ()

    async def fence(self, hostnames: Sequence[str]) -> Fence:
        """Pause the active nodes of these hosts, then read the tasks: hosts with a task are refused."""
        wanted = set(hostnames)
        _, nodes = await self._view(with_pending=False)
        for seat in nodes:
            node = seat.node
            if node.hostname in wanted and node.ours and node.availability == Availability.ACTIVE:
                await self._set(node.id, Availability.PAUSE)
                self._fenced.add(node.id)
        view, _ = await self._view(with_pending=False)
        workers = tuple(w for w in view.workers if w.hostname in wanted)
        return Fence(workers, tuple(h for h in busy_hosts(view) if h in wanted))

    async def unfence(self, hostnames: Sequence[str]) -> None:
        wanted = set(hostnames)
        _, nodes = await self._view(with_pending=False)
        for seat in nodes:
            node = seat.node
            if node.id in self._fenced and node.hostname in wanted:
                self._fenced.discard(node.id)
                if node.availability == Availability.PAUSE:
                    await self._set(node.id, Availability.ACTIVE)

    async def wait_for_change(self, timeout: float) -> bool:
        """Poll the tasks until one waits for a node that did not at the last observation."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(min(self._poll, left))
            try:
                _, tasks = await self.read()
            except EndpointError:
                continue
            if any(t.waiting and t.load and t.id not in self._seen_waiting for t in tasks):
                return True
        return False

    async def _call(self, what: str, awaitable: Any) -> Any:
        try:
            return await awaitable
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                raise NotFoundError(f"{what}: {exc.message}") from exc
            raise EndpointError(self._endpoint, f"{what} failed: [{exc.status}] {exc.message}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise EndpointError(self._endpoint, f"{what} failed: {exc!r}") from exc
