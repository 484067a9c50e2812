"""`keeper.access.TokenStore` on redis, shared by every keeper replica.

Keys, under `swarm-autoscaler:keeper:<keeper name>:`:

    token:<sha256 of a token>    the user id it belongs to
    user-token:<user id>         the digest of that user's token (to replace or revoke it)

Only digests are stored, never a token. Issuing and revoking are one Lua script each, so the two keys
never disagree and a replaced token stops working at once on every replica.
"""

from __future__ import annotations

from typing import Any

from swarm_autoscaler.adapters.redis_lock import _password_of, open_client, redact_url, redis_call
from swarm_autoscaler.keeper.access import new_token, token_digest
from swarm_autoscaler.keeper.adapters.redis_leases import KEY_PREFIX

# KEYS[1] user-token:<user>; ARGV[1] prefix, ARGV[2] user, ARGV[3] new digest ('' to revoke)
_SWAP = """
local old = redis.call('GET', KEYS[1])
if old then redis.call('DEL', ARGV[1] .. 'token:' .. old) end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[3])
  redis.call('SET', ARGV[1] .. 'token:' .. ARGV[3], ARGV[2])
end
if old then return 1 end
return 0
"""


class RedisTokens:
    def __init__(self, url: str, keeper_name: str, *, timeout: float = 5.0) -> None:
        self._endpoint = f"redis {redact_url(url)}"
        self._password = _password_of(url)
        self._prefix = f"{KEY_PREFIX}{keeper_name}:"
        self._redis = open_client(url, timeout)
        self._swap = self._redis.register_script(_SWAP)

    async def issue(self, user_id: str) -> str:
        token = new_token()
        await self._call(
            self._swap(keys=[self._user_key(user_id)], args=[self._prefix, user_id, token_digest(token)])
        )
        return token

    async def revoke(self, user_id: str) -> bool:
        return bool(
            await self._call(self._swap(keys=[self._user_key(user_id)], args=[self._prefix, user_id, ""]))
        )

    async def user_of(self, token: str) -> str | None:
        found = await self._call(self._redis.get(f"{self._prefix}token:{token_digest(token)}"))
        if found is None:
            return None
        return found.decode() if isinstance(found, bytes) else str(found)

    async def close(self) -> None:
        await self._redis.aclose()

    def _user_key(self, user_id: str) -> str:
        return f"{self._prefix}user-token:{user_id}"

    async def _call(self, awaitable: Any) -> Any:
        return await redis_call(awaitable, self._endpoint, self._password)
