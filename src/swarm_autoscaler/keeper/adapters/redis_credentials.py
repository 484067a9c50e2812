"""`keeper.credentials.CredentialStore` on redis, shared by every keeper replica.

A cluster's credentials are one key, `swarm-autoscaler:keeper:<keeper name>:credentials:<cluster id>`
(JSON of the PEM texts), written with SET NX so that concurrent first uses through two replicas agree on
the first set stored; the primary's spent token is `...:credentials-used:<cluster id>`, also SET NX. Both
expire after `ttl` (longer than any cluster lives) and are deleted when the cluster is gone. Values are
never logged; an error names the redis endpoint without its password.
"""

from __future__ import annotations

import asyncio
from typing import Any

from swarm_autoscaler.adapters.redis_lock import _password_of, open_client, redact_url, redis_call
from swarm_autoscaler.keeper.adapters.redis_leases import KEY_PREFIX
from swarm_autoscaler.keeper.credentials import Credentials, MakeCredentials

DEFAULT_TTL = 90 * 24 * 3600.0


class RedisCredentials:
    """`CredentialStore` on one redis; `make(cluster_id)` makes a new set (`adapters.tls`)."""

    def __init__(
        self,
        url: str,
        keeper_name: str,
        make: MakeCredentials,
        *,
        ttl: float = DEFAULT_TTL,
        timeout: float = 5.0,
    ) -> None:
        self._endpoint = f"redis {redact_url(url)}"
        self._password = _password_of(url)
        self._prefix = f"{KEY_PREFIX}{keeper_name}:"
        self._make = make
        self._ttl_ms = max(1, round(ttl * 1000))
        self._redis = open_client(url, timeout)

    async def get_or_make(self, cluster_id: str) -> Credentials:
        key = f"{self._prefix}credentials:{cluster_id}"
        stored = await self._call(self._redis.get(key))
        if stored is None:
            made = await asyncio.to_thread(self._make, cluster_id)
            await self._call(self._redis.set(key, made.to_json(), nx=True, px=self._ttl_ms))
            stored = await self._call(self._redis.get(key))
            if stored is None:  # expired or deleted between the two calls: the cluster is gone
                return made
        return Credentials.from_json(stored.decode() if isinstance(stored, bytes) else stored)

    async def get(self, cluster_id: str) -> Credentials | None:
        stored = await self._call(self._redis.get(f"{self._prefix}credentials:{cluster_id}"))
        if stored is None:
            return None
        return Credentials.from_json(stored.decode() if isinstance(stored, bytes) else stored)

    async def use_once(self, cluster_id: str) -> bool:
        key = f"{self._prefix}credentials-used:{cluster_id}"
        return bool(await self._call(self._redis.set(key, "1", nx=True, px=self._ttl_ms)))

    async def forget(self, cluster_id: str) -> None:
        await self._call(self._redis.delete(f"{self._prefix}credentials:{cluster_id}"))

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, awaitable: Any) -> Any:
        return await redis_call(awaitable, self._endpoint, self._password)
