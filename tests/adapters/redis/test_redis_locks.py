"""The keeper's named locks on a real redis-server, two replicas sharing it."""

from __future__ import annotations

import asyncio

import pytest

from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.keeper.adapters.redis_leases import RedisLocks
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

from .conftest import PASSWORD


async def test_exclusive_admits_one_holder_at_a_time_across_replicas(redis_server: RedisServer) -> None:
    a, b = RedisLocks(redis_server.url, "k1"), RedisLocks(redis_server.url, "k1")
    inside, most = 0, 0

    async def enter(locks: RedisLocks) -> bool:
        nonlocal inside, most
        async with locks.exclusive("create:u:w", wait=5) as held:
            if held:
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.01)
                inside -= 1
            return held

    results = await asyncio.gather(*(enter(x) for x in [a, b] * 5))
    assert all(results) and most == 1
    await a.close()
    await b.close()


async def test_exclusive_gives_up_after_its_wait(redis_server: RedisServer) -> None:
    a, b = RedisLocks(redis_server.url, "k2"), RedisLocks(redis_server.url, "k2")
    async with a.exclusive("x", wait=1) as held_a, b.exclusive("x", wait=0.2) as held_b:
        assert held_a and not held_b
    async with b.exclusive("x", wait=0.2) as again:
        assert again
    await a.close()
    await b.close()


async def test_a_lease_is_one_replicas_until_released_or_expired(redis_server: RedisServer) -> None:
    a, b = RedisLocks(redis_server.url, "k3"), RedisLocks(redis_server.url, "k3")
    assert await a.claim("cluster:c1", ttl=0.3)
    assert await a.claim("cluster:c1", ttl=0.3)  # refreshed by its holder
    assert not await b.claim("cluster:c1", ttl=0.3)
    await b.release("cluster:c1")  # not b's: no effect
    assert not await b.claim("cluster:c1", ttl=0.3)
    await asyncio.sleep(0.4)  # a died: the lease expires and b takes it over
    assert await b.claim("cluster:c1", ttl=0.3)
    await b.release("cluster:c1")
    assert await a.claim("cluster:c1", ttl=0.3)
    await a.close()
    await b.close()


async def test_a_wrong_password_is_an_endpoint_error_without_the_password(redis_server: RedisServer) -> None:
    url = redis_server.url.replace(PASSWORD, "not-the-password")
    locks = RedisLocks(url, "k4")
    with pytest.raises(EndpointError) as info:
        await locks.claim("x", 1)
    assert "not-the-password" not in str(info.value) and PASSWORD not in str(info.value)
    await locks.close()


async def test_a_thousand_claims_at_once_all_get_an_answer(redis_server: RedisServer) -> None:
    """1,000 cluster tasks claim their leases together: every claim waits for one of the client's
    connections (at most `MAX_CONNECTIONS`) instead of failing with redis-py's `MaxConnectionsError`."""
    from swarm_autoscaler.adapters.redis_lock import MAX_CONNECTIONS

    a, b = RedisLocks(redis_server.url, "k-many"), RedisLocks(redis_server.url, "k-many")
    try:
        names = [f"cluster:c{n}" for n in range(1000)]
        won_a = await asyncio.gather(*(a.claim(n, ttl=30) for n in names))
        won_b = await asyncio.gather(*(b.claim(n, ttl=30) for n in names))
        assert all(won_a) and not any(won_b)  # every claim answered: a holds them all, b none
        pool = a._redis.connection_pool
        assert pool.max_connections == MAX_CONNECTIONS
    finally:
        await a.close()
        await b.close()
