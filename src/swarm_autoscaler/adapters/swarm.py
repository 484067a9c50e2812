"""The docker swarm adapter: `ports.Orchestrator` over the docker engine API, with aiodocker.

The lifecycle marks live in node labels named `<prefix>ready`, `<prefix>empty-since`,
`<prefix>drained-since`, `<prefix>termination-started`, `<prefix>down-since` and `<prefix>cordoned-since`
(times as epoch seconds),
so a restarted daemon continues where it stopped. Ownership is the label `swarm-autoscaler.cluster`
(`ports.OWNERSHIP_LABEL`), which the daemon writes when a machine it launched joins: `Node.ours` is read
from it and the orchestrator's cluster name, never from the `instance-type` placement label. A garbled label value is read as absent, never a crash.

Node updates carry the node's current `Version.Index`; when someone else updated the node between our
read and our write, docker answers "update out of sequence" and the update is re-read and retried.
aiodocker negotiates the API version with `GET /version` on first use. Every docker error is translated
into `EndpointError` or `NotFoundError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any

import aiodocker
import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.model import Availability, Node, NodeMarks, NodeStatus
from swarm_autoscaler.core.ports import is_ours
from swarm_autoscaler.errors import EndpointError, NotFoundError

DEFAULT_PREFIX = "swarm-autoscaler."
_TIME_MARKS = ("empty_since", "drained_since", "termination_started", "down_since", "cordoned_since")
_TRUE = frozenset({"true", "1", "yes"})
# How long `manager_addresses` answers from the managers `join_command` read: the two are asked one after
# the other for one launch's user data, so one docker call serves both.
MANAGERS_FRESH_S = 5.0

Spec = dict[str, Any]


class _OutOfSequenceError(Exception):
    """Docker refused a node update because the version we sent is stale."""


def mark_label_names(prefix: str) -> dict[str, str]:
    """NodeMarks field name -> label name."""
    return {"ready": f"{prefix}ready"} | {name: prefix + name.replace("_", "-") for name in _TIME_MARKS}


def labels_to_marks(labels: Mapping[str, str], prefix: str = DEFAULT_PREFIX) -> NodeMarks:
    """Read the lifecycle marks from node labels; a missing or garbled value reads as absent."""
    names = mark_label_names(prefix)
    ready = labels.get(names["ready"], "").strip().lower() in _TRUE
    times = {field: _parse_time(labels.get(label)) for field, label in names.items() if field != "ready"}
    return NodeMarks(ready=ready, **times)


def marks_to_labels(marks: NodeMarks, prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """The labels that carry `marks`: only the marks that are set (False/None means no label)."""
    names = mark_label_names(prefix)
    out = {names["ready"]: "true"} if marks.ready else {}
    for field in _TIME_MARKS:
        value: float | None = getattr(marks, field)
        if value is not None:
            out[names[field]] = repr(float(value))
    return out


def _first_line(text: str, limit: int = 200) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def node_from_api(raw: Mapping[str, Any], prefix: str = DEFAULT_PREFIX, cluster_name: str = "") -> Node:
    """Translate one node of `GET /nodes` into `model.Node`. A malformed entry raises `ValueError`.
    `Node.ours` is True for a worker node whose `OWNERSHIP_LABEL` is `cluster_name` (never when it is "")."""
    try:
        spec = raw["Spec"]
        labels = dict(spec.get("Labels") or {})
        is_manager = spec.get("Role") == "manager"
        return Node(
            id=raw["ID"],
            hostname=machine_hostname(raw["Description"]["Hostname"]),
            availability=Availability(spec["Availability"]),
            status=NodeStatus(raw["Status"]["State"]),
            is_manager=is_manager,
            marks=labels_to_marks(labels, prefix),
            labels=MappingProxyType(labels),
            ours=is_ours(labels, cluster_name, is_manager),
            address=str((raw.get("Status") or {}).get("Addr") or ""),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"unexpected node entry from docker ({exc!r}): {raw.get('ID', '?')}") from exc


def nodes_from_api(
    raw_nodes: list[dict[str, Any]], prefix: str = DEFAULT_PREFIX, cluster_name: str = ""
) -> tuple[Node, ...]:
    """Every described node. A node still joining is listed before it has described itself (no
    hostname yet): it cannot be matched to a machine, so it is left out until the next listing."""
    described = [raw for raw in raw_nodes if (raw.get("Description") or {}).get("Hostname")]
    return tuple(node_from_api(raw, prefix, cluster_name) for raw in described)


class SwarmOrchestrator:
    """`ports.Orchestrator` for the swarm whose manager's engine API is at `docker_url`, on behalf of
    the cluster `cluster_name` (its nodes carry `OWNERSHIP_LABEL=<cluster_name>` and are listed as ours).

    Use as an async context manager or call `close()`: the HTTP session is always closed.
    """

    def __init__(
        self,
        docker_url: str,
        label_prefix: str = DEFAULT_PREFIX,
        *,
        cluster_name: str = "",
        timeout: float = 30.0,
        update_attempts: int = 6,
    ) -> None:
        self.docker_url = docker_url
        self.cluster_name = cluster_name
        self.prefix = label_prefix
        self._timeout = timeout
        self._attempts = update_attempts
        self._docker: aiodocker.Docker | None = None
        self._endpoint = f"docker engine {docker_url}"
        self._managers: tuple[float, list[Mapping[str, Any]]] = (-math.inf, [])  # (monotonic, statuses)

    # ------------------------------------------------------------------ session

    def _client(self) -> aiodocker.Docker:
        # Created on first use, inside the running loop that aiohttp's session belongs to.
        if self._docker is None:
            self._docker = aiodocker.Docker(
                url=self.docker_url, timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        return self._docker

    async def close(self) -> None:
        if self._docker is not None:
            docker, self._docker = self._docker, None
            await docker.close()

    async def __aenter__(self) -> SwarmOrchestrator:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ the port

    async def list_nodes(self) -> tuple[Node, ...]:
        """Every node of the swarm (managers included, flagged)."""
        try:
            raw_nodes = await self._call("list nodes", self._client().nodes.list())
        except NotFoundError:  # no /version or /nodes at all: some other HTTP server
            raise EndpointError(
                self._endpoint, "list nodes failed: HTTP 404 (not found); is this a docker engine API?"
            ) from None
        try:
            return nodes_from_api(raw_nodes, self.prefix, self.cluster_name)
        except ValueError as exc:
            raise EndpointError(self._endpoint, str(exc)) from exc

    async def set_availability(self, node_id: str, availability: Availability) -> None:
        """Set the node's availability; idempotent; a missing node raises `NotFoundError`."""
        await self._update(node_id, lambda spec: spec | {"Availability": str(availability)})

    async def mark(
        self,
        node_id: str,
        marks: NodeMarks,
        labels: Mapping[str, str] | None = None,
        availability: Availability | None = None,
    ) -> None:
        """Replace the node's lifecycle marks, add `labels` and set `availability` (None: unchanged), in
        one update, keeping every other label. Idempotent: no write when the node already carries them."""
        lifecycle = set(mark_label_names(self.prefix).values())
        extra = dict(labels or {})
        state = {} if availability is None else {"Availability": str(availability)}

        def change(spec: Spec) -> Spec:
            kept = {k: v for k, v in (spec.get("Labels") or {}).items() if k not in lifecycle}
            return spec | {"Labels": kept | extra | marks_to_labels(marks, self.prefix)} | state

        await self._update(node_id, change)

    async def add_labels(self, node_id: str, labels: Mapping[str, str]) -> None:
        """Add or overwrite these labels on the node (for example the labels its instance was
        launched with), keeping the others. Idempotent."""
        await self._update(
            node_id, lambda spec: spec | {"Labels": dict(spec.get("Labels") or {}) | dict(labels)}
        )

    async def remove(self, node_id: str) -> None:
        """Remove the node forcibly. A node already gone counts as success."""
        try:
            await self._call(
                f"remove node {node_id}", self._client().nodes.remove(node_id=node_id, force=True)
            )
        except NotFoundError:
            return

    async def swarm_id(self) -> str:
        """The swarm's id: made once at `docker swarm init`, the same on every manager (the daemon's
        deployment identity, `ec2_identity`)."""
        swarm = await self._call("inspect swarm", self._client().swarm.inspect())
        return str(swarm.get("ID") or "")

    async def join_command(self) -> tuple[str, str]:
        """(worker join token, manager address host:port), preferring the leader's address."""
        swarm = await self._call("inspect swarm", self._client().swarm.inspect())
        statuses = await self._read_managers()
        try:
            token = swarm["JoinTokens"]["Worker"]
            addr = next(s["Addr"] for s in statuses if s.get("Addr"))
        except (KeyError, TypeError, StopIteration) as exc:
            raise EndpointError(
                self._endpoint, f"no worker token or manager address in swarm ({exc!r})"
            ) from exc
        return str(token), str(addr)

    async def manager_addresses(self) -> tuple[str, ...]:
        """Every manager's `ManagerStatus.Addr` (its advertised address: what workers join, so what they
        reach), the leader first, unreachable ones left out. From the managers `join_command` read when
        that was under `MANAGERS_FRESH_S` ago (a launch asks both, one after the other), else read now.
        Not `Status.Addr`: that is the source address swarm's dispatcher saw the node's connection come
        from, not the one workers are told to reach (on a local dockerd swarm both read 127.0.0.11)."""
        read_at, statuses = self._managers
        if time.monotonic() - read_at >= MANAGERS_FRESH_S:
            statuses = await self._read_managers()
        found = (str(s["Addr"]) for s in statuses if s.get("Addr") and s.get("Reachability") != "unreachable")
        return tuple(dict.fromkeys(found))

    async def _read_managers(self) -> list[Mapping[str, Any]]:
        """The managers' `ManagerStatus`, the leader first, then the reachable; remembered with the time."""
        managers = await self._call("list managers", self._client().nodes.list(filters={"role": "manager"}))
        statuses = [m.get("ManagerStatus") or {} for m in managers]
        statuses.sort(key=lambda s: (not s.get("Leader", False), s.get("Reachability") != "reachable"))
        self._managers = (time.monotonic(), statuses)
        return statuses

    # ------------------------------------------------------------------ steps

    async def _read_node(self, node_id: str) -> Mapping[str, Any]:
        """The node as docker has it now (its spec and current version)."""
        raw: Mapping[str, Any] = await self._call(
            f"inspect node {node_id}", self._client().nodes.inspect(node_id=node_id)
        )
        return raw

    async def _update(self, node_id: str, change: Callable[[Spec], Spec]) -> None:
        """Read the node, apply `change` to its spec and write it with the version just read;
        re-read and retry when docker says the version went stale. No write when nothing changes."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_OutOfSequenceError),
            stop=stop_after_attempt(self._attempts),
            wait=wait_random_exponential(multiplier=0.05, max=1.0),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._update_once(node_id, change)
        except _OutOfSequenceError as exc:
            raise EndpointError(
                self._endpoint, f"node {node_id} kept changing under us ({self._attempts} attempts): {exc}"
            ) from exc

    async def _update_once(self, node_id: str, change: Callable[[Spec], Spec]) -> None:
        raw = await self._read_node(node_id)
        try:
            spec: Spec = dict(raw["Spec"])
            version = int(raw["Version"]["Index"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EndpointError(self._endpoint, f"node {node_id} has no spec or version ({exc!r})") from exc
        new_spec = change(spec)
        if new_spec == spec:
            return
        update = self._client().nodes.update(node_id=node_id, version=version, spec=new_spec)
        await self._call(f"update node {node_id}", update)

    async def _call(self, what: str, awaitable: Any) -> Any:
        """Await one docker API call, translating its failures into the project's errors."""
        try:
            return await awaitable
        except aiodocker.DockerError as exc:
            message = _first_line(str(exc.message))  # an HTML error page, when this is not docker
            if exc.status == 404:
                raise NotFoundError(f"{what}: {message}") from exc
            if "out of sequence" in message:
                raise _OutOfSequenceError(message) from exc
            raise EndpointError(self._endpoint, f"{what} failed: [{exc.status}] {message}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise EndpointError(self._endpoint, f"{what} failed: {exc!r}") from exc
