"""The keeper's HTTP API (aiohttp). Every /v1 route needs `Authorization: Bearer <token>`; the token is
compared in constant time and never logged. Errors are JSON `{"error": "..."}`:

    PUT    /v1/clusters/{user_id}/{wallet_id}            get or create: 201 created, 200 existed
    POST   /v1/clusters/{user_id}/{wallet_id}/heartbeat  204; 404 without a live cluster
    GET    /v1/clusters                                  200, a JSON list
    GET    /v1/clusters/{user_id}/{wallet_id}            200; 404 unknown
    DELETE /v1/clusters/{user_id}/{wallet_id}            202 (ends it now); 404 without a live cluster
    GET    /v1/usage?user_id=&wallet_id=&since=&until=   200, instance-seconds and USD: totals, per
                                                         wallet, per cluster (`usage.usage_json`);
                                                         since/until epoch seconds, whole hours; 400 for
                                                         a bad one; 503 without a ledger (no redis)
    GET    /v1/clusters/{user_id}/{wallet_id}/credentials  200, the client's TLS files (PEM) of the live
                                                         cluster; 404 without one
    GET    /v1/primaries/{cluster_id}/credentials        the primary's TLS files, once: its bearer is the
                                                         one-time token of its boot script (not the API
                                                         token); 410 Gone on a second use
    GET    /healthz, /metrics                            no token (no state changes)

401 without a token or with a wrong one, 422 for ids that break `model.ID_RULE`, 503 when the cloud
cannot be reached or a concurrent creation (or state change) of the same cluster takes too long (retry).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from swarm_autoscaler.errors import AutoscalerError
from swarm_autoscaler.keeper.credentials import CredentialStore, token_matches
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ID_PATTERN, ID_RULE, Cluster, ClusterKey, InvalidIdError
from swarm_autoscaler.keeper.service import Keeper, KeeperBusyError
from swarm_autoscaler.keeper.usage import UsageLedger, usage_json

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEEPER: web.AppKey[Keeper] = web.AppKey("keeper", Keeper)
_EXEMPT = ("/healthz", "/metrics")
_OWN_TOKEN = "/v1/primaries/"  # routes that check a token of their own


def cluster_json(cluster: Cluster, now: float, eta_s: float) -> dict[str, Any]:
    """The API's view of a cluster. `eta_s`: seconds until a starting cluster is expected to run."""
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
    }


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
    ) -> None:
        self.usage = usage
        self.keeper = keeper
        self._token = token
        self.credentials = credentials
        self._expected = f"Bearer {token}".encode()
        self.metrics = metrics
        self.expected_start_s = expected_start_s
        self.healthy = healthy

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Token check, errors as JSON, and the request counter."""
        response = await self._respond(request, handler)
        resource = request.match_info.route.resource
        self.metrics.request(request.method, resource.canonical if resource else "unmatched", response)
        return response

    async def _respond(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in _EXEMPT and not request.path.startswith(_OWN_TOKEN):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, self._expected):
                return _error(401, "missing or wrong bearer token")
        try:
            return await handler(request)
        except web.HTTPException as exc:
            return _error(exc.status, exc.reason)
        except InvalidIdError as exc:
            return _error(422, str(exc))
        except KeeperBusyError as exc:
            return _error(503, str(exc))
        except AutoscalerError as exc:
            return _error(503, f"cloud unavailable: {exc}")

    def _view(self, cluster: Cluster) -> dict[str, Any]:
        return cluster_json(cluster, self.keeper.clock(), self.expected_start_s)

    async def put_cluster(self, request: web.Request) -> web.Response:
        cluster, created = await self.keeper.get_or_create(_key(request))
        return web.json_response(self._view(cluster), status=201 if created else 200)

    async def heartbeat(self, request: web.Request) -> web.Response:
        if await self.keeper.heartbeat(_key(request)) is None:
            return _error(404, "no live cluster for this user and wallet")
        return web.Response(status=204)

    async def list_clusters(self, _: web.Request) -> web.Response:
        return web.json_response([self._view(c) for c in await self.keeper.list()])

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
        window = {}
        for name in ("since", "until"):
            text = query.get(name) or None
            try:
                window[name] = None if text is None else float(text)
            except ValueError:
                return _error(400, f"{name} must be epoch seconds, got {str(text)[:40]!r}")
        rows = await self.usage.query(ids["user_id"], ids["wallet_id"], window["since"], window["until"])
        return web.json_response(usage_json(rows))

    async def client_credentials(self, request: web.Request) -> web.Response:
        cluster = await self.keeper.get(_key(request))
        if cluster is None or not cluster.live:
            return _error(404, "no live cluster for this user and wallet")
        if self.credentials is None:
            return _error(404, "this keeper's clusters have no TLS credentials")
        made = await self.credentials.get_or_make(cluster.cluster_id)
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
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not ID_PATTERN.fullmatch(cid) or not token_matches(self._token, cid, given):
            return _error(401, "missing or wrong one-time token")
        if self.credentials is None:
            return _error(404, "this keeper's clusters have no TLS credentials")
        if not await self.credentials.use_once(cid):
            return _error(410, "this one-time token was already used")
        made = await self.credentials.get_or_make(cid)
        return web.json_response(
            {"cluster_id": cid, "files": made.for_primary()}, headers={"Cache-Control": "no-store"}
        )

    async def healthz(self, _: web.Request) -> web.Response:
        problem = self.healthy()
        if problem is not None:
            return web.json_response({"status": "unhealthy", "reason": problem}, status=503)
        return web.json_response({"status": "ok", "clusters": len(self.keeper.clusters)})

    async def metrics_text(self, _: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition(self.keeper.clusters)
        return web.Response(body=body, headers={"Content-Type": content_type})


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
) -> web.Application:
    """The API over `keeper`. `healthy` returns None when fine, else why not (503 on /healthz).
    `expected_start_s` is how long a primary usually takes to run (for `eta_s`). `credentials`: where
    the clusters' TLS credentials are kept (None: the credentials routes answer 404)."""
    routes = _Routes(keeper, token, metrics, expected_start_s, healthy, usage, credentials)
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
    app.router.add_get("/healthz", routes.healthz)
    app.router.add_get("/metrics", routes.metrics_text)
    return app
