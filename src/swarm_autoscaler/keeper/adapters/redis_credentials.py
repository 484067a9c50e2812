"""`keeper.credentials.CredentialStore` on redis, shared by every keeper replica.

A cluster's credentials are one key, `swarm-autoscaler:keeper:<keeper name>:credentials:<cluster id>`
(JSON of the PEM texts), written with SET NX so that concurrent first uses through two replicas agree on
the first set stored; the primary's spent token is `...:credentials-used:<cluster id>`, also SET NX. Both
expire after `ttl` (longer than any cluster lives) and are deleted when the cluster is gone. Values are
never logged; an error names the redis endpoint without its password.

With a `sealer` (`adapters.sealing`: `AUTOSCALER_KEEPER_SECRETS_KEY`), the JSON is sealed (AES-GCM, bound
to its redis key) before it is written, so a dump of redis holds no private key. A plaintext set left by
a keeper that ran without the key is read once and sealed in place; a sealed set that does not open with
this key (another key, tampered with) raises `CredentialsUnreadableError`, which names the setting.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from swarm_autoscaler.adapters.redis_lock import _password_of, open_client, redact_url, redis_call
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler.keeper.adapters.redis_leases import KEY_PREFIX
from swarm_autoscaler.keeper.adapters.sealing import Sealer, SealError, is_sealed
from swarm_autoscaler.keeper.credentials import Credentials, MakeCredentials

log = structlog.get_logger("swarm_autoscaler.keeper.credentials")

DEFAULT_TTL = 90 * 24 * 3600.0


class CredentialsUnreadableError(ConfigurationError):
    """Sealed credentials that this keeper's key does not open."""


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
        sealer: Sealer | None = None,
    ) -> None:
        self._sealer = sealer
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
            await self._call(self._redis.set(key, self._seal(key, made.to_json()), nx=True, px=self._ttl_ms))
            stored = await self._call(self._redis.get(key))
            if stored is None:  # expired or deleted between the two calls: the cluster is gone
                return made
        return await self._opened(key, stored)

    async def get(self, cluster_id: str) -> Credentials | None:
        key = f"{self._prefix}credentials:{cluster_id}"
        stored = await self._call(self._redis.get(key))
        return None if stored is None else await self._opened(key, stored)

    def _seal(self, key: str, text: str) -> str:
        return text if self._sealer is None else self._sealer.seal(key, text)

    async def _opened(self, key: str, stored: bytes | str) -> Credentials:
        text = stored.decode() if isinstance(stored, bytes) else stored
        if self._sealer is None or not is_sealed(text):
            if self._sealer is not None:  # left by a keeper without the key: seal it now
                await self._call(self._redis.set(key, self._sealer.seal(key, text), xx=True, keepttl=True))
                log.warning("credentials sealed in place", key=key.rpartition(":")[2])
            elif is_sealed(text):
                raise CredentialsUnreadableError(
                    "the clusters' credentials in redis are sealed: set AUTOSCALER_KEEPER_SECRETS_KEY "
                    "(or _FILE) to the key that sealed them"
                )
            return Credentials.from_json(text)
        try:
            return Credentials.from_json(self._sealer.open(key, text))
        except SealError as exc:
            raise CredentialsUnreadableError(
                f"a cluster's credentials in redis {exc}: AUTOSCALER_KEEPER_SECRETS_KEY must be the key "
                "every replica of this keeper uses"
            ) from None

    async def use_once(self, cluster_id: str) -> bool:
        key = f"{self._prefix}credentials-used:{cluster_id}"
        return bool(await self._call(self._redis.set(key, "1", nx=True, px=self._ttl_ms)))

    async def forget(self, cluster_id: str) -> None:
        await self._call(self._redis.delete(f"{self._prefix}credentials:{cluster_id}"))

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, awaitable: Any) -> Any:
        return await redis_call(awaitable, self._endpoint, self._password)
