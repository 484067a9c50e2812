"""RedisLock and SingleReplicaLock against a real redis-server."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from swarm_autoscaler.adapters.redis_lock import RedisLock, SingleReplicaLock, redact_url
from swarm_autoscaler.core.ports import Lock
from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler.runtime.logs import REDACTED
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer, RedisServerError

_names = itertools.count()

LockFactory = Callable[..., RedisLock]
SECRET = "an0ther-Secret"


@pytest.fixture
async def make_lock(redis_server: RedisServer) -> AsyncIterator[LockFactory]:
    """Locks on a cluster name unique to the test; every lock made is closed at the end."""
    cluster = f"cluster-{next(_names)}"
    made: list[RedisLock] = []

    def make(ttl: float = 5.0, token: str | None = None, url: str | None = None) -> RedisLock:
        lock = RedisLock(url or redis_server.url, cluster, ttl, token=token)
        made.append(lock)
        return lock

    yield make
    for lock in made:
        await lock.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_implements_the_lock_port(make_lock: LockFactory) -> None:
    assert isinstance(make_lock(), Lock)
    assert isinstance(SingleReplicaLock(), Lock)


async def test_acquire_extend_release(make_lock: LockFactory, redis_server: RedisServer) -> None:
    lock = make_lock(ttl=5.0, token="replica-a")
    assert lock.key.startswith("swarm-autoscaler:leader:cluster-")
    assert await lock.acquire() is True
    assert await lock.acquire() is True  # already held: refreshed, still ours
    assert await lock.extend() is True
    await lock.release()
    # Released: the key is gone, so extending now reports the lock as lost, and it can be taken again.
    assert await lock.extend() is False
    assert await lock.acquire() is True
    await lock.release()


async def test_second_replica_cannot_acquire_while_held(make_lock: LockFactory) -> None:
    first, second = make_lock(token="replica-a"), make_lock(token="replica-b")
    assert await first.acquire() is True
    assert await second.acquire() is False
    assert await second.extend() is False
    assert await first.extend() is True
    await first.release()
    assert await second.acquire() is True


async def test_ttl_expiry_hands_over_and_the_old_leader_loses(make_lock: LockFactory) -> None:
    first, second = make_lock(ttl=0.3, token="replica-a"), make_lock(ttl=0.3, token="replica-b")
    assert await first.acquire() is True
    assert await second.acquire() is False
    await asyncio.sleep(0.45)  # first stopped extending: the key expires
    assert await second.acquire() is True
    assert await first.extend() is False
    assert await first.acquire() is False


async def test_extend_keeps_the_lock_past_its_ttl(make_lock: LockFactory) -> None:
    leader, other = make_lock(ttl=0.4, token="replica-a"), make_lock(ttl=0.4, token="replica-b")
    assert await leader.acquire() is True
    for _ in range(4):  # 0.6 s in all, longer than the TTL
        await asyncio.sleep(0.15)
        assert await leader.extend() is True
    assert await other.acquire() is False


async def test_release_by_non_holder_does_nothing(make_lock: LockFactory) -> None:
    holder, other = make_lock(token="replica-a"), make_lock(token="replica-b")
    assert await holder.acquire() is True
    await other.release()
    assert await holder.extend() is True
    assert await other.acquire() is False
    await holder.release()
    await holder.release()  # not held any more: still safe


async def test_locks_of_different_clusters_are_independent(redis_server: RedisServer) -> None:
    async with (
        RedisLock(redis_server.url, "alpha", 5.0) as alpha,
        RedisLock(redis_server.url, "beta", 5.0) as beta,
    ):
        assert alpha.token != beta.token
        assert await alpha.acquire() is True
        assert await beta.acquire() is True
        await alpha.release()
        await beta.release()


async def test_wrong_password_is_an_endpoint_error_without_the_password(
    make_lock: LockFactory, redis_server: RedisServer
) -> None:
    assert redis_server.password
    bad_url = redis_server.url.replace(redis_server.password, "not-the-Pa55word")
    lock = make_lock(url=bad_url)
    with pytest.raises(EndpointError) as caught:
        await lock.acquire()
    message = str(caught.value)
    assert f"127.0.0.1:{redis_server.port}" in message
    assert "not-the-Pa55word" not in message
    assert REDACTED in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


async def test_unreachable_redis_is_an_endpoint_error_without_the_password(make_lock: LockFactory) -> None:
    port = _closed_port()
    lock = make_lock(url=f"redis://user:{SECRET}@127.0.0.1:{port}/0")
    for operation in (lock.acquire, lock.extend, lock.release):
        with pytest.raises(EndpointError) as caught:
            await operation()
        assert f"redis redis://user:{REDACTED}@127.0.0.1:{port}/0" in str(caught.value)
        assert SECRET not in str(caught.value)
        assert caught.value.endpoint == f"redis redis://user:{REDACTED}@127.0.0.1:{port}/0"


async def test_a_password_in_the_query_never_shows(make_lock: LockFactory, tmp_path: Path) -> None:
    """redis-py reads `?password=` too (the documented form for unix sockets)."""
    lock = make_lock(url=f"unix://{tmp_path}/no.sock?db=0&password={SECRET}")
    with pytest.raises(EndpointError) as caught:
        await lock.acquire()
    assert caught.value.endpoint == f"redis unix://{tmp_path}/no.sock"
    assert SECRET not in str(caught.value)


def test_an_invalid_url_is_a_configuration_error_without_the_password() -> None:
    with pytest.raises(ConfigurationError, match="invalid redis URL") as caught:
        RedisLock(f"redis://:{SECRET}@127.0.0.1:notaport/0", "c", 5.0)
    assert SECRET not in str(caught.value)


def test_redact_url() -> None:
    assert redact_url("redis://:pw@host:6379/0") == f"redis://{REDACTED}@host:6379/0"
    assert redact_url("rediss://admin:pw@host/1") == f"rediss://admin:{REDACTED}@host/1"
    assert redact_url("redis://host:6379") == "redis://host:6379"
    assert redact_url("redis://:pw@[::1]:6379/0") == f"redis://{REDACTED}@[::1]:6379/0"
    assert redact_url("redis://:pw@host:notaport/0") == f"redis://{REDACTED}@host:notaport/0"
    assert redact_url("unix:///run/redis.sock?db=1&password=pw") == "unix:///run/redis.sock"


async def test_single_replica_lock_is_always_leader() -> None:
    lock = SingleReplicaLock()
    assert await lock.acquire() is True
    assert await lock.extend() is True
    await lock.release()
    assert await lock.acquire() is True


def test_redis_server_missing_binary_says_what_to_do() -> None:
    with pytest.raises(RedisServerError, match=r"ensure-services\.sh or apt-get install redis-server"):
        RedisServer(executable="redis-server-that-does-not-exist").start()


async def test_redis_server_async_context_stops_the_process() -> None:
    async with RedisServer() as server:
        assert server.running
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        lock = RedisLock(server.url, "ctx", 5.0)
        assert await lock.acquire() is True
        await lock.close()
    assert not server.running
