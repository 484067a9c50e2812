"""The keeper's HTTP API (aiohttp). Every /v1 route needs `Authorization: Bearer <token>`: the admin
token (`AUTOSCALER_KEEPER_TOKEN`, every route) or a user token (`keeper.access`: that user's clusters and
usage only; another user's path is 403, the admin routes are 403). Tokens are compared in constant time
(the admin's) or by digest (a user's) and never logged. Errors are JSON `{"error": "..."}`:

    PUT    /v1/clusters/{user_id}/{wallet_id}            get or create: 201 created, 200 existed; body
                                                         optional, {"profile": "<name>"} (422, 409: inputs)
    POST   /v1/clusters/{user_id}/{wallet_id}/heartbeat  204; 404 without a live cluster
    GET    /v1/clusters                                  200, a JSON list (a user's token: its own)
    GET    /v1/clusters/{user_id}/{wallet_id}            200; 404 unknown
    DELETE /v1/clusters/{user_id}/{wallet_id}            202 (ends it now); 404 without a live cluster
    GET    /v1/usage?user_id=&wallet_id=&since=&until=   200, instance-seconds and USD: totals, per
                                                         wallet, per cluster (`usage.usage_json`);
                                                         since/until epoch seconds, whole hours; 400 for
                                                         a bad one; 503 without a ledger (no redis);
                                                         a user's token: its own (another user_id 403)
    GET    /v1/clusters/{user_id}/{wallet_id}/credentials  200, the client's TLS files (PEM) of the live
                                                         cluster; 404 without one
    GET    /v1/primaries/{cluster_id}/instances          the cluster's workers as the keeper last listed
                                                         them (its autoscaler's bearer: the cluster token)
    POST   /v1/primaries/{cluster_id}/launches           launch the cluster's workers within its scope,
                                                         maximum, budget and types (`keeper.launches`;
                                                         the same bearer); the primaries cannot launch
    GET    /v1/primaries/{cluster_id}/credentials        the primary's TLS files, once: its bearer is the
                                                         one-time token of its boot script (not the API
                                                         token), with its autoscaler's cluster token
                                                         (never in user data); 410 Gone on a second use
    POST   /v1/users/{user_id}/token                     admin: a new token for the user, 201, shown
                                                         once (replaces the previous one)
    DELETE /v1/users/{user_id}/token                     admin: revoke it, 204; 404 without one
    GET    /v1/wallets/{wallet_id}/budget                admin: the wallet's budget, its source and
                                                         what it spent
    PUT    /v1/wallets/{wallet_id}/budget                admin: `{"budget_usd": 12.5}` sets it (over
                                                         the settings'), 200
    DELETE /v1/wallets/{wallet_id}/budget                admin: the settings' budget applies again, 204;
                                                         404 without one set
    GET    /healthz, /metrics                            no token (no state changes)

Inputs are checked first (`keeper.inputs`): a token that is not printable ASCII is no token (401), a
non-finite since/until is 400, a budget body over 4 KiB, not JSON or nested deep is 400; every 4xx is one
log line ("request refused": method, route, status, message; never a token or a body). The credentials
routes answer 409 for a running cluster whose credentials the store lost (`credentials.LOST`).
401 without a token or with a wrong one, 403 with a user's token on another user's path or an admin
route, 429 for a create over a count limit and 402 for a create on a wallet that spent its budget
(`keeper.limits`: the body says which limit and the figures), 422 for ids that break `model.ID_RULE`, 503 when the cloud
cannot be reached or a concurrent creation (or state change) of the same cluster takes too long (retry).
With `AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS`, a primary's credentials fetch from any other address than
its private IP is 403 and does not spend the token (`credentials.by_primary`).

Why one file of this size: every route shares one guard (tokens, errors, the refused-request line) and
one `_Routes`; the listing and launch routes already live in modules of their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from swarm_autoscaler.errors import AutoscalerError
from swarm_autoscaler.keeper.access import ADMIN, InProcessTokens, Principal, TokenStore, is_admin
from swarm_autoscaler.keeper.credentials import (
    LOST,
    Credentials,
    CredentialStore,
    by_primary,
    listing_token,
    token_matches,
)
from swarm_autoscaler.keeper.inputs import BadInput, bearer, epoch_seconds, json_object, profile_of
from swarm_autoscaler.keeper.launches import Launches, launches_route, starts_route
from swarm_autoscaler.keeper.limits import LimitRefusedError, Limits
from swarm_autoscaler.keeper.listing import listing_route
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import (
    ID_PATTERN,
    ID_RULE,
    Cluster,
    ClusterKey,
    ClusterState,
    InvalidIdError,
)
from swarm_autoscaler.keeper.service import Keeper, KeeperBusyError
from swarm_autoscaler.keeper.usage import UsageLedger, usage_json

log = structlog.get_logger("swarm_autoscaler.keeper.api")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEEPER: web.AppKey[Keeper] = web.AppKey("keeper", Keeper)
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
_EXEMPT = ("/healthz", "/metrics")
_OWN_TOKEN = "/v1/primaries/"  # routes that check a token of their own
_USER_TOKEN = "/v1/users/{user_id}/token"
_BUDGET = "/v1/wallets/{wallet_id}/budget"
_ADMIN_ONLY = (_USER_TOKEN, _BUDGET)  # canonical routes only the admin token may call


def cluster_json(
    cluster: Cluster, now: float, eta_s: float, budget_ends_at: float | None = None
) -> dict[str, Any]:
    """The API's view of a cluster. `eta_s`: seconds until a starting cluster is expected to run.
    `budget_ends_at`: when a live cluster whose wallet spent its budget will be ended (it launches no
    more workers meanwhile); None otherwise."""
    return {
        "id": cluster.cluster_id,
        "user_id": cluster.key.user_id,
        "wallet_id": cluster.key.wallet_id,
        "state": str(cluster.state),
        "scheduler_url": cluster.scheduler_url,
        "dashboard_url": cluster.dashboard_url,
        "created_at": cluster.created_at,
        "last_heartbeat": cluster.last_heartbeat,
        "eta_s": max(0.0, round(cluster.created_at + eta_s - now, 1)) if cluster.state == "starting" else 0.0,
        "reason": cluster.reason,
        "budget_ends_at": budget_ends_at if cluster.live else None,
        "profile": cluster.profile,
    }


def _refused_elsewhere(cid: str, known: Cluster | None, request: web.Request) -> None:
    """A valid one-time token from another address than its primary's: someone who read the user data
    racing the boot, or every primary seen through swarm's routing mesh, a NAT or a proxy (which replace
    the source address): one warning that says which to look for, never the token."""
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    log.warning(
        "one-time token refused: not from its primary's private IP",
        cluster=cid, source=str(peer[0]) if peer else "", primary_ip=known.private_ip if known else "",
        hint="if every primary is refused, they reach the keeper through swarm's routing mesh, a NAT or a "
        "proxy: publish its port in host mode (docker/keeper-stack.yml) or set "
        "AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS=false (the token can then be raced before boot)",
    )  # fmt: skip


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class _Routes:
    """The handlers, sharing the keeper, the token and the metrics."""

    def __init__(
        self,
        keeper: Keeper,
        token: str,
        metrics: KeeperMetrics,
        expected_start_s: float,
        healthy: Callable[[], str | None],
        usage: UsageLedger | None = None,
        credentials: CredentialStore | None = None,
        tokens: TokenStore | None = None,
    ) -> None:
        self.usage = usage
        self.tokens = tokens if tokens is not None else InProcessTokens()
        self.keeper = keeper
        self._token = token
        self.credentials = credentials
        self.metrics = metrics
        self.expected_start_s = expected_start_s
        self.healthy = healthy

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Token check, errors as JSON, and the request counter."""
        response = await self._respond(request, handler)
        resource = request.match_info.route.resource
        route = resource.canonical if resource else "unmatched"
        self.metrics.request(request.method, route, response)
        if 400 <= response.status < 500:  # one line per refused request; never a token or a body
            text = response.text if isinstance(response, web.Response) else None
            log.info(
                "request refused",
                method=request.method,
                route=route,
                status=response.status,
                error=(text or "")[:200],
            )
        return response

    async def _respond(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path not in _EXEMPT and not request.path.startswith(_OWN_TOKEN):
                principal = await self._principal(request)
                if principal is None:
                    return _error(401, "missing or wrong bearer token")
                refused = _refused(request, principal)
                if refused is not None:
                    return _error(403, refused)
                request[PRINCIPAL] = principal
            return await handler(request)
        except web.HTTPException as exc:
            return _error(exc.status, exc.reason)
        except BadInput as exc:
            return _error(exc.status, str(exc))
        except InvalidIdError as exc:
            return _error(422, str(exc))
        except LimitRefusedError as exc:
            return web.json_response(exc.body, status=exc.status)
        except KeeperBusyError as exc:
            return _error(503, str(exc))
        except AutoscalerError as exc:
            return _error(503, f"cloud unavailable: {exc}")

    async def _principal(self, request: web.Request) -> Principal | None:
        """The admin, a user, or None (no token, or one nobody holds)."""
        given = bearer(request.headers.get("Authorization"))
        if given is None:
            return None
        if is_admin(self._token, given):
            return ADMIN
        user = await self.tokens.user_of(given)
        return None if user is None else Principal(user)

    def _view(self, cluster: Cluster) -> dict[str, Any]:
        ends_at = self.keeper.budget_ends_at(cluster)
        return cluster_json(cluster, self.keeper.clock(), self.expected_start_s, ends_at)

    async def put_cluster(self, request: web.Request) -> web.Response:
        cluster, created = await self.keeper.get_or_create(_key(request), profile_of(await request.read()))
        return web.json_response(self._view(cluster), status=201 if created else 200)

    async def heartbeat(self, request: web.Request) -> web.Response:
        if await self.keeper.heartbeat(_key(request)) is None:
            return _error(404, "no live cluster for this user and wallet")
        return web.Response(status=204)

    async def list_clusters(self, request: web.Request) -> web.Response:
        principal = request[PRINCIPAL]
        clusters = [c for c in await self.keeper.list() if principal.may_act_for(c.key.user_id)]
        return web.json_response([self._view(c) for c in clusters])

    async def get_cluster(self, request: web.Request) -> web.Response:
        cluster = await self.keeper.get(_key(request))
        if cluster is None:
            return _error(404, "no cluster for this user and wallet")
        return web.json_response(self._view(cluster))

    async def delete_cluster(self, request: web.Request) -> web.Response:
        cluster = await self.keeper.end(_key(request))
        if cluster is None:
            return _error(404, "no live cluster for this user and wallet")
        return web.json_response(self._view(cluster), status=202)

    async def get_usage(self, request: web.Request) -> web.Response:
        if self.usage is None:
            return _error(503, "usage accounting needs AUTOSCALER_REDIS_URL")
        query = request.query
        ids = {}
        for name in ("user_id", "wallet_id"):
            value = query.get(name) or None
            if value is not None and not ID_PATTERN.fullmatch(value):
                raise InvalidIdError(f"{name} {value[:80]!r} is not valid: {ID_RULE}")
            ids[name] = value
        principal = request[PRINCIPAL]
        if not principal.admin:
            if ids["user_id"] not in (None, principal.user_id):
                return _error(403, "this token belongs to another user (it reads its own user's usage only)")
            ids["user_id"] = principal.user_id
        window = {name: epoch_seconds(name, query.get(name)) for name in ("since", "until")}
        rows = await self.usage.query(ids["user_id"], ids["wallet_id"], window["since"], window["until"])
        return web.json_response(usage_json(rows))

    async def client_credentials(self, request: web.Request) -> web.Response:
        cluster = await self.keeper.get(_key(request))
        if cluster is None or not cluster.live:
            return _error(404, "no live cluster for this user and wallet")
        if self.credentials is None:
            return _error(404, "this keeper's clusters have no TLS credentials")
        made = await self._issued(self.credentials, cluster.cluster_id, cluster)
        if made is None:
            return _error(409, LOST)
        return web.json_response(
            {
                "cluster_id": cluster.cluster_id,
                "scheduler_url": cluster.scheduler_url,
                "files": made.for_client(),
            },
            headers={"Cache-Control": "no-store"},
        )

    async def primary_credentials(self, request: web.Request) -> web.Response:
        cid = request.match_info["cluster_id"]
        given = bearer(request.headers.get("Authorization")) or ""
        if not ID_PATTERN.fullmatch(cid) or not token_matches(self._token, cid, given):
            return _error(401, "missing or wrong one-time token")
        if self.credentials is None:
            return _error(404, "this keeper's clusters have no TLS credentials")
        known = next((c for c in self.keeper.clusters if c.cluster_id == cid), None)
        if self.keeper.bind_primaries and not by_primary(known, request.transport):  # the token is not spent
            _refused_elsewhere(cid, known, request)
            return _error(403, "the one-time token works only from the cluster's primary's private IP")
        if known is not None and known.state != ClusterState.STARTING:
            # Its primary fetched its files before its scheduler answered: this is a second use, even
            # when the store forgot the first (redis flushed).
            if await self.credentials.get(cid) is None:
                log.error("credentials lost", cluster=cid, what_to_do=LOST)
            return _error(410, "this one-time token was already used (the cluster is past its start)")
        if not await self.credentials.use_once(cid):
            return _error(410, "this one-time token was already used")
        made = await self.credentials.get_or_make(cid)
        return web.json_response(
            # the cluster autoscaler's listing and launch token rides here, over the keeper's TLS, never in
            # user data (a read-only principal reads that)
            {
                "cluster_id": cid,
                "files": made.for_primary(),
                "listing_token": listing_token(self._token, cid),
            },
            headers={"Cache-Control": "no-store"},
        )

    async def _issued(self, store: CredentialStore, cid: str, cluster: Cluster) -> Credentials | None:
        """The cluster's credentials; made only while it is starting (`credentials.LOST`): None, and an
        error logged, for a running cluster whose set the store lost."""
        if cluster.state == ClusterState.STARTING:
            return await store.get_or_make(cid)
        made = await store.get(cid)
        if made is None:
            log.error("credentials lost", cluster=cid, what_to_do=LOST)
        return made

    async def issue_token(self, request: web.Request) -> web.Response:
        user_id = _user_id(request)
        token = await self.tokens.issue(user_id)
        log.info("user token issued", user=user_id)
        return web.json_response(
            {"user_id": user_id, "token": token}, status=201, headers={"Cache-Control": "no-store"}
        )

    async def revoke_token(self, request: web.Request) -> web.Response:
        user_id = _user_id(request)
        if not await self.tokens.revoke(user_id):
            return _error(404, "this user has no token")
        log.info("user token revoked", user=user_id)
        return web.Response(status=204)

    def _limits(self) -> Limits:
        if self.keeper.limits is None:
            raise web.HTTPNotFound(reason="this keeper enforces no limits")
        return self.keeper.limits

    async def get_budget(self, request: web.Request) -> web.Response:
        limits = self._limits()
        return web.json_response((await limits.budget(_wallet_id(request))).to_json())

    async def put_budget(self, request: web.Request) -> web.Response:
        limits, wallet = self._limits(), _wallet_id(request)
        if limits.usage is None:
            return _error(409, "budgets need the usage ledger: set AUTOSCALER_REDIS_URL")
        expected = 'a JSON body {"budget_usd": <USD, 0 or more>}'
        try:
            value = json_object(await request.read(), expected)["budget_usd"]
            budget = float(value)
        except (ValueError, KeyError, TypeError, OverflowError):
            return _error(400, f"expected {expected}")
        if not 0 <= budget < float("inf") or isinstance(value, bool):
            return _error(400, 'expected a JSON body {"budget_usd": <USD, 0 or more>}')
        await limits.store.set(wallet, budget)
        log.info("wallet budget set", wallet=wallet, budget_usd=budget)
        return web.json_response((await limits.budget(wallet)).to_json())

    async def delete_budget(self, request: web.Request) -> web.Response:
        limits, wallet = self._limits(), _wallet_id(request)
        if not await limits.store.delete(wallet):
            return _error(404, "no budget was set for this wallet through the API")
        log.info("wallet budget removed", wallet=wallet)
        return web.Response(status=204)

    async def healthz(self, _: web.Request) -> web.Response:
        problem = self.healthy()
        if problem is not None:
            return web.json_response({"status": "unhealthy", "reason": problem}, status=503)
        return web.json_response({"status": "ok", "clusters": len(self.keeper.clusters)})

    async def metrics_text(self, _: web.Request) -> web.Response:
        keeper = self.keeper
        body, content_type = self.metrics.exposition(
            keeper.clusters,
            keeper.held,
            keeper.replica_count,
            budget_held=keeper.budget_held,
            wallets_over_budget=len(keeper.over_budget),
        )
        return web.Response(body=body, headers={"Content-Type": content_type})


def _refused(request: web.Request, principal: Principal) -> str | None:
    """Why `principal` may not call this route (403), or None."""
    if principal.admin:
        return None
    resource = request.match_info.route.resource
    if resource is not None and resource.canonical in _ADMIN_ONLY:
        return "this route needs the admin token"
    user_id = request.match_info.get("user_id")
    if user_id is not None and not principal.may_act_for(user_id):
        return "this token belongs to another user"
    return None


def _user_id(request: web.Request) -> str:
    user_id = request.match_info["user_id"]
    if not ID_PATTERN.fullmatch(user_id):
        raise InvalidIdError(f"user_id {user_id[:80]!r} is not valid: {ID_RULE}")
    return user_id


def _wallet_id(request: web.Request) -> str:
    wallet_id = request.match_info["wallet_id"]
    if not ID_PATTERN.fullmatch(wallet_id):
        raise InvalidIdError(f"wallet_id {wallet_id[:80]!r} is not valid: {ID_RULE}")
    return wallet_id


def _key(request: web.Request) -> ClusterKey:
    return ClusterKey.parse(request.match_info["user_id"], request.match_info["wallet_id"])


def build_keeper_app(
    keeper: Keeper,
    token: str,
    metrics: KeeperMetrics,
    *,
    expected_start_s: float = 120.0,
    healthy: Callable[[], str | None] = lambda: None,
    usage: UsageLedger | None = None,
    credentials: CredentialStore | None = None,
    tokens: TokenStore | None = None,
    launches: Launches | None = None,
) -> web.Application:
    """The API over `keeper`. `healthy` returns None when fine, else why not (503 on /healthz).
    `expected_start_s` is how long a primary usually takes to run (for `eta_s`). `credentials`: where
    the clusters' TLS credentials are kept (None: the credentials routes answer 404). `tokens`: the user
    tokens (None: kept in this process). `launches`: how the clusters' workers are launched (None: the
    launch route answers 404)."""
    routes = _Routes(keeper, token, metrics, expected_start_s, healthy, usage, credentials, tokens)
    app = web.Application(middlewares=[routes.guard])
    app[KEEPER] = keeper
    base = "/v1/clusters/{user_id}/{wallet_id}"
    app.router.add_put(base, routes.put_cluster)
    app.router.add_post(base + "/heartbeat", routes.heartbeat)
    app.router.add_get("/v1/clusters", routes.list_clusters)
    app.router.add_get(base, routes.get_cluster)
    app.router.add_delete(base, routes.delete_cluster)
    app.router.add_get("/v1/usage", routes.get_usage)
    app.router.add_get(base + "/credentials", routes.client_credentials)
    app.router.add_get(_OWN_TOKEN + "{cluster_id}/credentials", routes.primary_credentials)
    app.router.add_get(_OWN_TOKEN + "{cluster_id}/instances", listing_route(keeper, token))
    app.router.add_post(_OWN_TOKEN + "{cluster_id}/launches", launches_route(launches, token))
    app.router.add_post(_OWN_TOKEN + "{cluster_id}/starts", starts_route(launches, token))
    app.router.add_post(_USER_TOKEN, routes.issue_token)
    app.router.add_delete(_USER_TOKEN, routes.revoke_token)
    app.router.add_get(_BUDGET, routes.get_budget)
    app.router.add_put(_BUDGET, routes.put_budget)
    app.router.add_delete(_BUDGET, routes.delete_budget)
    app.router.add_get("/healthz", routes.healthz)
    app.router.add_get("/metrics", routes.metrics_text)
    return app
