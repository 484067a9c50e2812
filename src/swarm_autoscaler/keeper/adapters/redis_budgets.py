"""`keeper.limits.BudgetStore` on redis: the per-wallet budgets an admin set through the API, shared by
every replica, in one hash `swarm-autoscaler:keeper:<keeper name>:budgets` (wallet id -> USD), and
when each wallet was first found over its budget in `...:budget-spent` (wallet id -> epoch seconds,
written with HSETNX so every replica agrees on the first)."""

from __future__ import annotations

from typing import Any

from swarm_autoscaler.adapters.redis_lock import _password_of, open_client, redact_url, redis_call
from swarm_autoscaler.keeper.adapters.redis_leases import KEY_PREFIX


class RedisBudgets:
    def __init__(self, url: str, keeper_name: str, *, timeout: float = 5.0) -> None:
        self._endpoint = f"redis {redact_url(url)}"
        self._password = _password_of(url)
        self._key = f"{KEY_PREFIX}{keeper_name}:budgets"
        self._spent = f"{KEY_PREFIX}{keeper_name}:budget-spent"
        self._redis = open_client(url, timeout)

    async def get(self, wallet_id: str) -> float | None:
        value = await self._call(self._redis.hget(self._key, wallet_id))
        return None if value is None else float(value)

    async def set(self, wallet_id: str, budget_usd: float) -> None:
        await self._call(self._redis.hset(self._key, wallet_id, repr(float(budget_usd))))

    async def delete(self, wallet_id: str) -> bool:
        return bool(await self._call(self._redis.hdel(self._key, wallet_id)))

    async def exhausted_since(self, wallet_id: str, now: float) -> float:
        await self._call(self._redis.hsetnx(self._spent, wallet_id, repr(float(now))))
        value = await self._call(self._redis.hget(self._spent, wallet_id))
        return now if value is None else float(value)

    async def recovered(self, wallet_id: str) -> None:
        await self._call(self._redis.hdel(self._spent, wallet_id))

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, awaitable: Any) -> Any:
        return await redis_call(awaitable, self._endpoint, self._password)
