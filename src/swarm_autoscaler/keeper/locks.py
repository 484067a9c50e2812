"""`InProcessLocks`: the keeper's `Locks` for a single replica (no `AUTOSCALER_REDIS_URL`).

Get-or-create stays exclusive per (user, wallet) within the process through one asyncio lock per name;
every lease is this replica's, since there is no other. Run more than one replica only with redis.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class InProcessLocks:
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str, wait: float) -> AsyncIterator[bool]:
        lock = self._locks.setdefault(name, asyncio.Lock())
        try:
            async with asyncio.timeout(wait):
                await lock.acquire()
        except TimeoutError:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    async def claim(self, name: str, ttl: float) -> bool:
        return True

    async def release(self, name: str) -> None:
        return None

    async def check(self) -> None:
        """Nothing to check: there is no redis."""
        return None

    async def close(self) -> None:
        return None
