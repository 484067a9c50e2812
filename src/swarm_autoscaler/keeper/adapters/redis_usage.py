"""The usage ledger on redis (`keeper.usage.UsageLedger`), shared by every keeper replica.

Keys, under `swarm-autoscaler:keeper:<keeper name>:usage:`:

    machine:<instance id>        hash: `s`, the seconds already counted for that machine (kept 8 days:
                                 EC2 lists a terminated instance for about an hour)
    wallet:<user>:<wallet>       hash: `<cluster id>|<hour>|s` and `|c`, instance-seconds and USD
                                 counted in that hour (epoch seconds of its start); never expires
    wallets                      set of `<user>:<wallet>` (ids never hold a `:`)

One Lua script reads a machine's counted seconds, and adds only what the reading adds beyond them to
its wallet's totals while raising them: atomic, so readings repeated (a restart, a failover, two
replicas reading the same machine) count nothing twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from swarm_autoscaler.adapters.redis_lock import _password_of, open_client, redact_url, redis_call
from swarm_autoscaler.keeper.adapters.redis_leases import KEY_PREFIX
from swarm_autoscaler.keeper.usage import HOUR, Reading, UsageRow

MACHINE_TTL_S = 8 * 24 * 3600
BATCH = 500  # readings per script call

_RECORD = """
local p, hour, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 6 do
  local iid, user, wallet, cid = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local s, price = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
  local mk = p .. 'machine:' .. iid
  local prev = tonumber(redis.call('HGET', mk, 's') or '0')
  if s > prev then
    local ds = s - prev
    redis.call('HSET', mk, 's', ARGV[i + 4], 'c', cid)
    redis.call('EXPIRE', mk, ttl)
    local wk = p .. 'wallet:' .. user .. ':' .. wallet
    redis.call('HINCRBYFLOAT', wk, cid .. '|' .. hour .. '|s', string.format('%.6f', ds))
    redis.call('HINCRBYFLOAT', wk, cid .. '|' .. hour .. '|c', string.format('%.9f', ds * price))
    redis.call('SADD', p .. 'wallets', user .. ':' .. wallet)
    table.insert(out, iid)
    table.insert(out, string.format('%.6f', ds))
  end
end
return out
"""


class RedisUsage:
    def __init__(self, url: str, keeper_name: str, *, timeout: float = 5.0) -> None:
        self._endpoint = f"redis {redact_url(url)}"
        self._password = _password_of(url)
        self.prefix = f"{KEY_PREFIX}{keeper_name}:usage:"
        self._redis = open_client(url, timeout)
        self._record = self._redis.register_script(_RECORD)

    async def record(self, readings: Sequence[Reading], now: float) -> list[Reading]:
        hour = str(int(math.floor(now / HOUR) * HOUR))
        by_id = {r.machine.instance_id: r for r in readings}
        added: list[Reading] = []
        for start in range(0, len(readings), BATCH):
            args: list[Any] = [self.prefix, hour, MACHINE_TTL_S]
            for r in readings[start : start + BATCH]:
                m = r.machine
                args += [m.instance_id, m.user_id, m.wallet_id, m.cluster_id, f"{r.seconds:.3f}"]
                args.append(repr(r.price_per_second))
            out = await self._call(self._record(keys=[], args=args))
            for iid, ds in zip(out[::2], out[1::2], strict=True):
                reading = by_id[_text(iid)]
                added.append(Reading(reading.machine, float(_text(ds)), reading.price_per_second))
        return added

    async def query(
        self, user_id: str | None, wallet_id: str | None, since: float | None, until: float | None
    ) -> list[UsageRow]:
        low = -math.inf if since is None else math.floor(since / HOUR) * HOUR
        high = math.inf if until is None else until
        pairs = sorted(_text(p) for p in await self._call(self._redis.smembers(self.prefix + "wallets")))
        rows: list[UsageRow] = []
        for pair in pairs:
            user, _, wallet = pair.partition(":")
            if (user_id is not None and user != user_id) or (wallet_id is not None and wallet != wallet_id):
                continue
            fields = await self._call(self._redis.hgetall(f"{self.prefix}wallet:{pair}"))
            totals: dict[str, list[float]] = {}
            for name, value in fields.items():
                cid, hour, kind = _text(name).rsplit("|", 2)
                if not low <= float(hour) < high:
                    continue
                slot = totals.setdefault(cid, [0.0, 0.0])
                slot[0 if kind == "s" else 1] += float(_text(value))
            rows += [UsageRow(user, wallet, cid, s, c) for cid, (s, c) in sorted(totals.items())]
        return rows

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, awaitable: Any) -> Any:
        return await redis_call(awaitable, self._endpoint, self._password)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
