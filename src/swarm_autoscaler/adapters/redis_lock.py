"""Leadership among replicas: a redis lock per managed cluster, and a single-replica stand-in.

The lock is one key, `swarm-autoscaler:leader:<cluster_name>`, whose value is this replica's unique
token and which expires after `ttl` seconds unless the leader extends it. Every write that depends on
who holds the key (refresh, extend, release) is a Lua script that compares the token first, so a
replica can never extend or delete a lock another replica took over after its own expired.

The redis URL may carry a password: it never appears in a message or a log line (see `redact_url`).
"""

from __future__ import annotations

import os
import socket
import uuid
from types import TracebackType
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.connection import parse_url
from redis.exceptions import AuthenticationError, RedisError

from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler.runtime.logs import REDACTED, redact_text

KEY_PREFIX = "swarm-autoscaler:leader:"
MAX_CONNECTIONS = 50  # per client; more calls at once wait for a free connection

# KEYS[1] = lock key, ARGV[1] = token, ARGV[2] = ttl in ms. Returns 1 when the TTL was refreshed.
_COMPARE_AND_PEXPIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] = lock key, ARGV[1] = token. Returns 1 when the key was ours and is now deleted.
_COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def redact_url(url: str) -> str:
    """The URL fit for messages and logs: credentials masked (`logs.redact_text`) and the query dropped,
    since redis-py also reads a password from it (`unix:///path.sock?password=...`)."""
    return redact_text(url).partition("?")[0]


def _password_of(url: str) -> str | None:
    """The password redis-py will use, from the URL's userinfo or its `password` query parameter."""
    try:
        password = parse_url(url).get("password")  # type: ignore[no-untyped-call]  # redis-py's own parser
    except ValueError:
        return None
    return str(password) if password else None


def open_client(url: str, timeout: float) -> aioredis.Redis:
    """A redis client for `url` that connects lazily, bounds every call by `timeout` and retries once,
    quickly (a leader must learn fast that it cannot reach redis). A malformed URL raises
    `ConfigurationError` without the password.

    Its pool holds at most `MAX_CONNECTIONS`, and a call beyond them waits (up to `timeout`) for one to
    be free: redis-py's default pool refuses it at once (`MaxConnectionsError` past 100), so a keeper
    whose 1,000 cluster tasks claim their leases together failed most claims and checked those clusters
    only an interval later."""
    try:
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=timeout,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
        )
        client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    except (ValueError, RedisError) as exc:
        detail = f"{type(exc).__name__}: {exc}"
        password = _password_of(url)
        if password:
            detail = detail.replace(password, REDACTED)
        raise ConfigurationError(f"invalid redis URL {redact_url(url)}: {detail}") from None
    return client


async def redis_call(awaitable: Any, endpoint: str, password: str | None) -> Any:
    """Await one redis command; a redis or socket failure becomes an EndpointError naming `endpoint`,
    with the password (when there is one) redacted from the message."""
    try:
        return await awaitable
    except (RedisError, OSError) as exc:
        detail = f"{type(exc).__name__}: {exc}"
        raise EndpointError(endpoint, detail.replace(password, REDACTED) if password else detail) from None


def default_token() -> str:
    """A token unique to this replica and this process start: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"


class RedisLock:
    """`ports.Lock` on redis (SET NX PX to take, compare-and-pexpire to extend, compare-and-delete
    to release).

    `ttl` (seconds) is how long the lock survives a leader that stopped extending it; `timeout` bounds
    every redis call (it is capped at a third of the TTL so that a slow call cannot outlive the lock).
    Connection and protocol errors raise `EndpointError` naming the redacted URL. The client connects
    lazily; call `close()` (or use `async with`) to release its connections.
    """

    def __init__(
        self,
        url: str,
        cluster_name: str,
        ttl: float,
        *,
        token: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        if ttl <= 0:
            raise ConfigurationError(f"the leader lock TTL must be positive, got {ttl}")
        if not cluster_name:
            raise ConfigurationError("the leader lock needs a cluster name")
        self._endpoint = f"redis {redact_url(url)}"
        self._password = _password_of(url)
        self.key = KEY_PREFIX + cluster_name
        self.token = token or default_token()
        self._ttl_ms = max(1, round(ttl * 1000))
        self._redis = open_client(url, min(timeout, ttl / 3))
        self._pexpire = self._redis.register_script(_COMPARE_AND_PEXPIRE)
        self._delete = self._redis.register_script(_COMPARE_AND_DELETE)

    async def check(self) -> None:
        """Once at start: PING (after AUTH when the URL holds a password). Raises `EndpointError` when
        redis is unreachable, refuses the password, or is not redis."""
        await self._call(self._redis.ping())

    async def acquire(self) -> bool:
        """Take the lock if free, or refresh it if this replica already holds it."""
        taken = await self._call(self._redis.set(self.key, self.token, nx=True, px=self._ttl_ms))
        if taken:
            return True
        return await self.extend()

    async def extend(self) -> bool:
        """Refresh the TTL; False when another replica holds the lock or nobody does (lost)."""
        refreshed = await self._call(self._pexpire(keys=[self.key], args=[self.token, self._ttl_ms]))
        return bool(refreshed)

    async def release(self) -> None:
        """Delete the key if and only if it still holds this replica's token."""
        await self._call(self._delete(keys=[self.key], args=[self.token]))

    async def close(self) -> None:
        await self._redis.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except (RedisError, OSError) as exc:
            # `from None`: the vendor exception (and its args) must not leak the password upwards.
            raise EndpointError(self._endpoint, self._clean(exc)) from None

    def _clean(self, exc: BaseException) -> str:
        detail = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, AuthenticationError) or "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
            detail = f"authentication failed ({detail}); check the password in the URL"
        if self._password:
            detail = detail.replace(self._password, REDACTED)
        return detail


class SingleReplicaLock:
    """`ports.Lock` for a deployment without redis: the only replica is always the leader."""

    async def check(self) -> None:
        """Nothing to check: there is no redis."""
        return None

    async def acquire(self) -> bool:
        return True

    async def extend(self) -> bool:
        return True

    async def release(self) -> None:
        return None

    async def close(self) -> None:
        return None
