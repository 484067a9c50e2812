"""The keeper's launch route: a keeper cluster's workers are launched by the keeper, never by the cluster.

`POST /v1/primaries/{cluster_id}/launches` is what a cluster's own autoscaler calls instead of
RunInstances (`adapters.keeper_listing.KeeperListedCloud`): the primaries' IAM role holds no
`ec2:RunInstances`, since a user's code on the primary holds that role (docs/security.md, "Tenant
credentials: the decision"). Its bearer is the cluster's token (`credentials.listing_token`, the one its
listing is read with). The body is JSON data (`LaunchBody`, never pickle), at most `BODY_LIMIT` bytes:

    {"instance_type": "m5.large", "count": 2, "market": "on-demand" | "spot", "subnet_id": "subnet-..",
     "user_data": "#!/bin/bash ...", "client_token": "<1-40 of A-Z a-z 0-9 ->",
     "labels": {"role": "gpu"}, "pool": false, "deployment": "<the cluster's swarm id>",
     "join_nonce": "<32 hex digits>"}

`join_nonce` (optional): the nonce of the join ticket the user data carries (`adapters.join_tickets`),
which the keeper tags on the workers as `swarm-autoscaler/join-nonce`: the cluster's autoscaler, serving
the join desk on the primary (`AUTOSCALER_EC2_JOIN_URL`, set by the default boot script), answers the
swarm join token only to a worker whose nonce gives the ticket, from that worker's own private IP. So a
keeper cluster's worker's user data carries no join token. The nonce is no secret (tags are readable) and
touches only the cluster's own swarm.

The keeper checks, in this order, and changes nothing when one fails (each a 4xx with `{"error"}` and
one "request refused" line, the API's rule):

- 401 without the cluster's token; 400 for a body that is not that object (unknown fields, wrong
  types, user data over EC2's 16 KiB, labels past `MAX_LABELS`), 404 for a cluster this keeper does not
  know (or a keeper that launches no workers), 409 for one that is not live (ending, failed);
- 403 for a type the keeper does not offer the cluster (`AUTOSCALER_KEEPER_WORKER_TYPES`, or its profile's), spot for a
  type whose `capacity` has no spot, a warm-pool launch as spot, or a subnet that is not the keeper's;
- then, under the cluster's lock `launch:<id>` (shared by the replicas, so two launches of one cluster
  are counted one after the other): 402 while the cluster's wallet is over its budget (the keeper's
  budget view, and the wallet's budget read again now); 429 when the cluster's pending and running
  workers, read from EC2 now (`WorkerLauncher.live_workers`), plus `count` pass the cluster's maximum
  (`AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER`); 503 before a listing named the cluster's primary or
  when the lock, the budget or EC2 cannot be had now (retry).

`POST /v1/primaries/{cluster_id}/starts` (the same bearer, body `{"instance_ids": ["i-..", ...]}`, at
most `MAX_STARTS`) starts stopped warm-pool workers of the cluster, which the primaries' role cannot do
either (`ec2:StartInstances` is denied to it: a user's code started them past the maximum). Its
autoscaler rewrites each one's user data and tags it first (those stay the primary's, on its own
workers); the keeper checks as for a launch (404, 409, 503, 402), then that every id is, read from EC2
now, a stopped worker of this cluster naming its primary, of a type the keeper offers it (403
otherwise: one retyped while stopped is not started), and that the cluster's pending
and running workers plus these stay within the maximum (429); then one StartInstances with its own
credentials: 200 with `{"started": [...]}`, EC2's refusal 502 with its code.

Then one RunInstances with the keeper's parameters (`keeper.adapters.ec2_workers`): 200 with
`{"instances": [...]}` in DescribeInstances' shape, as the listing gives them. EC2's refusal is 502 with
`{"error", "ec2_code"}` (a capacity or quota code the autoscaler backs off on as if EC2 had answered it).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from swarm_autoscaler.adapters.boot_scripts import USER_DATA_LIMIT
from swarm_autoscaler.errors import AutoscalerError
from swarm_autoscaler.keeper.credentials import listing_token_matches
from swarm_autoscaler.keeper.inputs import BadInput, bearer, json_object
from swarm_autoscaler.keeper.model import ID_PATTERN, Cluster
from swarm_autoscaler.keeper.ports import WorkerLaunch, WorkerLauncher, WorkerLaunchError
from swarm_autoscaler.keeper.service import Keeper

_Body = TypeVar("_Body", bound=BaseModel)

log = structlog.get_logger("swarm_autoscaler.keeper.launches")

BODY_LIMIT = 64 * 1024  # bytes: 16 KiB of user data, JSON-escaped, and the rest
MAX_LABELS = 30  # node labels per launch (EC2 allows 50 tags; the keeper's own take the rest)
LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
LOCK_WAIT = 10.0  # seconds a launch waits for the cluster's previous launch
MAX_STARTS = 50  # ids in one start (EC2 takes more; a cluster's pool is far smaller)


class LaunchBody(BaseModel):
    """What a cluster's autoscaler may choose of a launch; everything else is the keeper's."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    instance_type: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*\.[a-z0-9-]+$", max_length=64)
    count: int = Field(ge=1, le=1000)
    market: Literal["on-demand", "spot"] = "on-demand"
    subnet_id: str = Field(default="", pattern=r"^(subnet-[0-9a-zA-Z]{1,40})?$")
    user_data: str = Field(default="", max_length=USER_DATA_LIMIT)
    client_token: str = Field(pattern=r"^[A-Za-z0-9-]{1,40}$")
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    pool: bool = False
    deployment: str = Field(default="", pattern=r"^[a-z0-9]{0,64}$")
    join_nonce: str = Field(default="", pattern=r"^([0-9a-f]{32})?$")

    @field_validator("user_data")
    @classmethod
    def _user_data(cls, value: str) -> str:
        if len(value.encode("utf-8", "surrogatepass")) > USER_DATA_LIMIT:
            raise ValueError(f"user data over EC2's {USER_DATA_LIMIT} bytes (before base64)")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not LABEL_KEY.fullmatch(key):
                raise ValueError("a label key is 1-100 of letters, digits, '_', '.', '-'")
            if len(text) > 200 or not text.isprintable():
                raise ValueError("a label value is at most 200 printable characters")
        return value


class StartBody(BaseModel):
    """The warm-pool workers a cluster's autoscaler asks the keeper to start."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    instance_ids: list[Annotated[str, Field(pattern=r"^i-[0-9a-f]{8,17}$")]] = Field(
        min_length=1, max_length=MAX_STARTS
    )


class LaunchRefusedError(Exception):
    """A launch the keeper refuses (`status`: the 4xx, or 502 for EC2's refusal with `ec2_code`)."""

    def __init__(self, status: int, message: str, ec2_code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.ec2_code = ec2_code


@dataclass
class Launches:
    """The checks and the launch (see the module docstring). `types`: each worker type the keeper
    offers and the capacities it may be launched with (`AllowedType.capacity`); `subnets`: the keeper's
    (empty: EC2's default subnet, and no subnet may be named); `maximum`: workers per cluster."""

    keeper: Keeper
    launcher: WorkerLauncher
    types: Mapping[str, Sequence[str]]
    maximum: int
    subnets: Sequence[str] = ()
    # A cluster of another profile than `default` (`config.profiles`): its worker types and capacities,
    # and their AMIs (a profile absent here offers `types`, with the launcher's AMIs).
    profile_types: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    profile_amis: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def types_of(self, cluster: Cluster) -> frozenset[str]:
        """The worker types the keeper offers `cluster` (its profile's, else the keeper's)."""
        return frozenset(self.profile_types.get(cluster.profile, self.types))

    def _live(self, cluster_id: str) -> Cluster:
        cluster = next((c for c in self.keeper.clusters if c.cluster_id == cluster_id), None)
        if cluster is None:
            raise LaunchRefusedError(404, "this keeper knows no such cluster")
        if not cluster.live:
            raise LaunchRefusedError(409, f"the cluster is {cluster.state}: it launches no workers")
        return cluster

    def _arn(self, cluster_id: str) -> str:
        arn = self.keeper.primary_arn(cluster_id)
        if arn is None:
            raise LaunchRefusedError(503, "no listing named the cluster's primary yet: retry")
        return arn

    async def _room(self, cluster_id: str, more: int) -> None:
        live = await self.launcher.live_workers(cluster_id)
        if len(live) + more > self.maximum:
            raise LaunchRefusedError(
                429,
                f"{len(live)} workers pending or running and {more} more would pass the "
                f"cluster's maximum of {self.maximum}",
            )

    async def start(self, cluster_id: str, body: StartBody) -> tuple[str, ...]:
        """Start stopped warm-pool workers of the cluster (see the module docstring)."""
        cluster = self._live(cluster_id)
        arn = self._arn(cluster_id)
        ids = tuple(dict.fromkeys(body.instance_ids))
        async with self.keeper.locks.exclusive(f"launch:{cluster_id}", LOCK_WAIT) as held:
            if not held:
                raise LaunchRefusedError(503, "another launch of this cluster is under way: retry")
            await self._within_budget(cluster)
            types = self.types_of(cluster)
            mine = await self.launcher.stopped_workers(cluster_id, arn, ids, types)
            others = [i for i in ids if i not in mine]
            if others:
                raise LaunchRefusedError(
                    403,
                    f"not stopped workers of this cluster, of its worker types {sorted(types)}: {others[:5]}",
                )
            await self._room(cluster_id, len(ids))
            try:
                await self.launcher.start(cluster_id, ids)
            except WorkerLaunchError as exc:
                log.warning("worker start refused by EC2", cluster=cluster_id, code=exc.code, ids=list(ids))
                raise LaunchRefusedError(502, exc.message, exc.code) from None
        log.info("workers started", cluster=cluster_id, started=list(ids))
        return ids

    async def launch(self, cluster_id: str, body: LaunchBody) -> tuple[dict[str, Any], ...]:
        cluster = self._live(cluster_id)
        self._allowed(body, self.profile_types.get(cluster.profile, self.types))
        arn = self._arn(cluster_id)
        async with self.keeper.locks.exclusive(f"launch:{cluster_id}", LOCK_WAIT) as held:
            if not held:
                raise LaunchRefusedError(503, "another launch of this cluster is under way: retry")
            await self._within_budget(cluster)
            await self._room(cluster_id, body.count)
            launch = WorkerLaunch(
                cluster_id=cluster_id,
                key=cluster.key,
                primary_arn=arn,
                instance_type=body.instance_type,
                count=body.count,
                spot=body.market == "spot",
                subnet_id=body.subnet_id,
                user_data=body.user_data,
                client_token=body.client_token,
                labels=tuple(sorted(body.labels.items())),
                pool=body.pool,
                deployment=body.deployment,
                join_nonce=body.join_nonce,
                ami_id=self.profile_amis.get(cluster.profile, {}).get(body.instance_type, ""),
            )
            try:
                made = await self.launcher.launch(launch)
            except WorkerLaunchError as exc:
                log.warning("worker launch refused by EC2", cluster=cluster_id, code=exc.code,
                            type=body.instance_type, market=body.market, subnet=body.subnet_id)  # fmt: skip
                raise LaunchRefusedError(502, exc.message, exc.code) from None
        log.info(
            "workers launched", cluster=cluster_id, type=body.instance_type, market=body.market,
            asked=body.count, launched=[raw["InstanceId"] for raw in made],
        )  # fmt: skip
        return made

    def _allowed(self, body: LaunchBody, types: Mapping[str, Sequence[str]]) -> None:
        capacities = types.get(body.instance_type)
        if capacities is None:
            raise LaunchRefusedError(
                403,
                f"instance type {body.instance_type} is not among the cluster's worker types {sorted(types)}",
            )
        if body.market == "spot" and ("spot" not in capacities or body.pool):
            raise LaunchRefusedError(403, f"{body.instance_type} is not launched as spot here")
        if body.subnet_id and body.subnet_id not in self.subnets:
            raise LaunchRefusedError(403, f"subnet {body.subnet_id} is not one of the keeper's")
        if not body.subnet_id and self.subnets:
            raise LaunchRefusedError(403, f"name one of the keeper's subnets {list(self.subnets)}")

    async def _within_budget(self, cluster: Cluster) -> None:
        if self.keeper.budget_ends_at(cluster) is not None:
            raise LaunchRefusedError(402, f"wallet {cluster.key.wallet_id} spent its budget")
        limits = self.keeper.limits
        if limits is None or limits.usage is None:
            return
        try:
            budget = await limits.budget(cluster.key.wallet_id)
        except AutoscalerError as exc:
            raise LaunchRefusedError(503, f"the wallet's budget cannot be read now ({exc}): retry") from None
        if budget.exhausted:
            raise LaunchRefusedError(402, f"wallet {cluster.key.wallet_id} spent its budget")


def _body(raw: bytes, model: type[_Body], expected: str) -> _Body:
    """The request's body as a `model`; `BadInput` (400) otherwise (never echoing the input)."""
    value = json_object(raw, expected, limit=BODY_LIMIT)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise BadInput(400, f"{where}: {first.get('msg', 'invalid')}") from None


def launch_body(raw: bytes) -> LaunchBody:
    """The request's body as a `LaunchBody`; `BadInput` (400) otherwise (never echoing the input)."""
    return _body(raw, LaunchBody, "a JSON launch object (docs/keeper.md, the launch route)")


def start_body(raw: bytes) -> StartBody:
    """The request's body as a `StartBody`; `BadInput` (400) otherwise (never echoing the input)."""
    return _body(raw, StartBody, 'a JSON start object ({"instance_ids": [...]})')


def _route(
    secret: str,
    parse: Callable[[bytes], _Body],
    act: Callable[[str, _Body], Awaitable[Sequence[Any]]] | None,
    answer_key: str,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A cluster route's handler: the cluster's token (401), the body (400), then `act`, whose refusal
    is its status with EC2's code when there is one; `act` None: this keeper launches no workers (404)."""

    async def handle(request: web.Request) -> web.Response:
        cid = request.match_info["cluster_id"]
        given = bearer(request.headers.get("Authorization")) or ""
        if not ID_PATTERN.fullmatch(cid) or not listing_token_matches(secret, cid, given):
            return web.json_response({"error": "missing or wrong cluster token"}, status=401)
        body = parse(await request.read())
        if act is None:
            return web.json_response({"error": "this keeper launches no workers"}, status=404)
        try:
            done = await act(cid, body)
        except LaunchRefusedError as exc:
            answer: dict[str, Any] = {"error": str(exc)}
            if exc.ec2_code:
                answer["ec2_code"] = exc.ec2_code
            return web.json_response(answer, status=exc.status)
        return web.json_response(
            {"cluster_id": cid, answer_key: list(done)}, headers={"Cache-Control": "no-store"}
        )

    return handle


def starts_route(launches: Launches | None, secret: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The start route's handler (see the module docstring)."""
    return _route(secret, start_body, launches.start if launches else None, "started")


def launches_route(
    launches: Launches | None, secret: str
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The launch route's handler (see the module docstring)."""
    return _route(secret, launch_body, launches.launch if launches else None, "instances")
