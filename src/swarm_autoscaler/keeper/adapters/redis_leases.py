"""Named locks on redis for the keeper (`keeper.ports.Locks`), shared by every keeper replica.

Each name is one key, `swarm-autoscaler:keeper:<keeper name>:<lock name>`, holding this replica's
token with a TTL. `exclusive` takes a short-lived lock and waits for it (get-or-create per user and
wallet); `claim` takes or refreshes a lease without waiting (one replica handles a cluster at a time).
It is also the keeper's `Replicas`: each replica's token in one sorted set, `...:replicas`, scored with
when it expires (redis' own clock, so the replicas' clocks need not agree); `beat` renews this one and
drops the expired ones in one script, `leave` removes this one at a graceful stop.
Every write that depends on who holds a key is the same compare-then-act Lua script as the leader
lock's, so a replica never extends or deletes a key another replica holds. The URL's password never
appears in a message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import RedisError

from swarm_autoscaler.adapters.redis_lock import (
    _COMPARE_AND_DELETE,
    _COMPARE_AND_PEXPIRE,
    _password_of,
    default_token,
    open_client,
    redact_url,
)
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.runtime.logs import REDACTED

KEY_PREFIX = "swarm-autoscaler:keeper:"
_POLL = 0.05  # how often a waiting `exclusive` retries

# KEYS[1] the replicas' sorted set; ARGV[1] this replica's token, ARGV[2] its TTL in ms. Returns how many
# replicas are alive. The set itself expires with the longest TTL renewed into it.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return redis.call('ZCARD', KEYS[1])
"""


class RedisLocks:
    """`keeper.ports.Locks` on one redis. `hold_ttl` bounds an `exclusive` lock's life if its holder
    dies mid-way (it is deleted as soon as the body ends)."""

    def __init__(self, url: str, keeper_name: str, *, hold_ttl: float = 60.0, timeout: float = 5.0) -> None:
        self._endpoint = f"redis {redact_url(url)}"
        self._password = _password_of(url)
        self.prefix = f"{KEY_PREFIX}{keeper_name}:"
        self.token = default_token()
        self._hold_ms = max(1, round(hold_ttl * 1000))
        self._redis = open_client(url, timeout)
        self._pexpire = self._redis.register_script(_COMPARE_AND_PEXPIRE)
        self._delete = self._redis.register_script(_COMPARE_AND_DELETE)
        self._beat = self._redis.register_script(_BEAT)

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str, wait: float) -> AsyncIterator[bool]:
        key = self.prefix + name
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not await self._call(self._redis.set(key, self.token, nx=True, px=self._hold_ms)):
            if loop.time() >= deadline:
                yield False
                return
            await asyncio.sleep(_POLL)
        try:
            yield True
        finally:
            await self._call(self._delete(keys=[key], args=[self.token]))

    async def claim(self, name: str, ttl: float) -> bool:
        key, ttl_ms = self.prefix + name, max(1, round(ttl * 1000))
        if await self._call(self._redis.set(key, self.token, nx=True, px=ttl_ms)):
            return True
        return bool(await self._call(self._pexpire(keys=[key], args=[self.token, ttl_ms])))

    async def release(self, name: str) -> None:
        await self._call(self._delete(keys=[self.prefix + name], args=[self.token]))

    async def beat(self, ttl: float) -> int:
        ttl_ms = max(1, round(ttl * 1000))
        return int(await self._call(self._beat(keys=[self.prefix + "replicas"], args=[self.token, ttl_ms])))

    async def leave(self) -> None:
        await self._call(self._redis.zrem(self.prefix + "replicas", self.token))

    async def check(self) -> None:
        """Once at start: PING (after AUTH when the URL holds a password). Raises `EndpointError`."""
        await self._call(self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except (RedisError, OSError) as exc:
            raise EndpointError(self._endpoint, self._clean(exc)) from None

    def _clean(self, exc: BaseException) -> str:
        detail = f"{type(exc).__name__}: {exc}"
        return detail.replace(self._password, REDACTED) if self._password else detail
