"""The keeper's listing route: each cluster's instances as the keeper's last listing saw them.

`GET /v1/primaries/{cluster_id}/instances` answers a cluster's own autoscaler
(`adapters.keeper_listing.KeeperListedCloud`) with its workers, so that one paged DescribeInstances by the
keeper serves every cluster instead of one per cluster every tick. Its bearer is the cluster's listing
token (`credentials.listing_token`): read-only, that cluster's listing only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from swarm_autoscaler.keeper.credentials import listing_token_matches
from swarm_autoscaler.keeper.inputs import bearer
from swarm_autoscaler.keeper.model import ID_PATTERN
from swarm_autoscaler.keeper.service import Keeper


def listing_route(keeper: Keeper, secret: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler: 401 without the cluster's listing token, 503 before a listing, else 200 with
    `{"cluster_id", "listed_at", "instances", "primary_arn"}` (each instance in DescribeInstances'
    shape; `primary_arn`, the cluster's primary's instance ARN, which its autoscaler tags every worker
    with, or null when the listing did not see the primary)."""

    async def primary_listing(request: web.Request) -> web.Response:
        cid = request.match_info["cluster_id"]
        given = bearer(request.headers.get("Authorization")) or ""
        if not ID_PATTERN.fullmatch(cid) or not listing_token_matches(secret, cid, given):
            return web.json_response({"error": "missing or wrong listing token"}, status=401)
        listed = keeper.listing(cid)
        if listed is None:
            why = "no listing of this cluster yet: try again after the keeper's next listing"
            return web.json_response({"error": why}, status=503)
        at, instances = listed
        return web.json_response(
            {
                "cluster_id": cid,
                "listed_at": at,
                "instances": list(instances),
                "primary_arn": keeper.primary_arn(cid),
            },
            headers={"Cache-Control": "no-store"},
        )

    return primary_listing
