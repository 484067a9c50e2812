"""What one user and one wallet may start: clusters per user and a budget per wallet.

- **Clusters per user** (`Limits.max_clusters_per_user`): a create that would give a user more live
  clusters (starting or running) than that is refused with **429** (a count limit: the user may end
  one, or wait for one to end, and retry). Workers per cluster are bounded by the cluster's own
  autoscaler (`AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER` becomes its maximum).
- **A budget per wallet** (USD, all the wallet's clusters' machines, every user of that wallet, since
  the ledger began): the default (`default_budget`, None: unlimited), overridden per wallet by the
  settings (`budgets`) and, above both, by an admin through the API (kept in redis, `BudgetStore`). A
  create for a wallet that has spent its budget is refused with **402 Payment Required** (money, not
  permission: 403 stays the answer to a wrong token). Spending is read from the usage ledger, so it lags
  the machines by up to one usage interval. A **running** cluster whose wallet runs out of budget stops
  growing (its own autoscaler is told to launch nothing more) and ends after a grace period
  (`AUTOSCALER_KEEPER_BUDGET_GRACE`, counted from when the wallet was first found over it, kept in
  redis so a failover does not restart it); nothing running is ended before.

Refusals are `LimitRefusedError`s carrying the status and a JSON body that says which limit, the
figures and what to do next.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler.keeper.usage import UsageLedger


class LimitRefusedError(Exception):
    """A create refused by a limit: `status` (429 or 402) and the JSON `body` (with `error`)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["error"])
        self.status = status
        self.body = body


@runtime_checkable
class BudgetStore(Protocol):
    """Per-wallet budgets set through the API, shared by every replica."""

    async def get(self, wallet_id: str) -> float | None:
        """The wallet's budget in USD, None when none was set here."""
        ...

    async def set(self, wallet_id: str, budget_usd: float) -> None: ...

    async def delete(self, wallet_id: str) -> bool:
        """Drop the wallet's budget set here (the settings' apply again); False when none was set."""
        ...

    async def exhausted_since(self, wallet_id: str, now: float) -> float:
        """When the wallet was first found over its budget (`now` if this is the first time); shared by
        every replica, so a cluster's grace survives a failover."""
        ...

    async def recovered(self, wallet_id: str) -> None:
        """The wallet is within its budget again (raised, or a new default): forget when it ran out."""
        ...


class InProcessBudgets:
    """`BudgetStore` for one process (tests; a keeper without redis has no ledger to check budgets)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.since: dict[str, float] = {}

    async def exhausted_since(self, wallet_id: str, now: float) -> float:
        return self.since.setdefault(wallet_id, now)

    async def recovered(self, wallet_id: str) -> None:
        self.since.pop(wallet_id, None)

    async def get(self, wallet_id: str) -> float | None:
        return self.values.get(wallet_id)

    async def set(self, wallet_id: str, budget_usd: float) -> None:
        self.values[wallet_id] = budget_usd

    async def delete(self, wallet_id: str) -> bool:
        return self.values.pop(wallet_id, None) is not None


@dataclass(frozen=True, slots=True)
class Budget:
    """A wallet's budget and where it comes from (`api`, `settings`, `default` or `none`)."""

    wallet_id: str
    budget_usd: float | None
    source: str
    spent_usd: float

    @property
    def exhausted(self) -> bool:
        return self.budget_usd is not None and self.spent_usd >= self.budget_usd

    def to_json(self) -> dict[str, Any]:
        remaining = None if self.budget_usd is None else round(max(0.0, self.budget_usd - self.spent_usd), 6)
        return {
            "wallet_id": self.wallet_id,
            "budget_usd": self.budget_usd,
            "source": self.source,
            "spent_usd": round(self.spent_usd, 6),
            "remaining_usd": remaining,
            "exhausted": self.exhausted,
        }


@dataclass
class Limits:
    """The limits a keeper enforces (see the module docstring). `usage` is the ledger budgets are
    checked against (None: no budget can be checked, so none is set)."""

    max_clusters_per_user: int | None = None
    default_budget: float | None = None
    budgets: Mapping[str, float] = field(default_factory=dict)
    store: BudgetStore = field(default_factory=InProcessBudgets)
    usage: UsageLedger | None = None

    async def budget(self, wallet_id: str, spent: float | None = None) -> Budget:
        """The wallet's budget now and what it has spent (read from the ledger unless given)."""
        if spent is None:
            spent = await self.spent(wallet_id)
        stored = await self.store.get(wallet_id)
        if stored is not None:
            return Budget(wallet_id, stored, "api", spent)
        if wallet_id in self.budgets:
            return Budget(wallet_id, self.budgets[wallet_id], "settings", spent)
        if self.default_budget is not None:
            return Budget(wallet_id, self.default_budget, "default", spent)
        return Budget(wallet_id, None, "none", spent)

    async def over_budget(self, wallets: set[str], now: float) -> dict[str, float]:
        """Of `wallets`, those over their budget, with when each was first found so (one ledger read)."""
        if self.usage is None or not wallets:
            return {}
        spent: dict[str, float] = {}
        for row in await self.usage.query(None, None, None, None):
            spent[row.wallet_id] = spent.get(row.wallet_id, 0.0) + row.cost
        over: dict[str, float] = {}
        for wallet in sorted(wallets):
            if (await self.budget(wallet, spent.get(wallet, 0.0))).exhausted:
                over[wallet] = await self.store.exhausted_since(wallet, now)
            else:
                await self.store.recovered(wallet)
        return over

    async def spent(self, wallet_id: str) -> float:
        if self.usage is None:
            return 0.0
        rows = await self.usage.query(None, wallet_id, None, None)
        return math.fsum(r.cost for r in rows)

    async def admit(self, key: ClusterKey, live_of_user: int) -> None:
        """Raise `LimitRefusedError` when a new cluster for `key` would break a limit; `live_of_user`:
        how many live clusters the user has now."""
        limit = self.max_clusters_per_user
        if limit is not None and live_of_user >= limit:
            raise LimitRefusedError(
                429,
                {
                    "error": f"user {key.user_id} has {live_of_user} live clusters, the most allowed "
                    f"({limit}); end one (DELETE) or wait for one to end, then retry",
                    "limit": "clusters_per_user",
                    "user_id": key.user_id,
                    "live_clusters": live_of_user,
                    "max_clusters_per_user": limit,
                },
            )
        budget = await self.budget(key.wallet_id)
        if budget.exhausted:
            raise LimitRefusedError(
                402,
                {
                    "error": f"wallet {key.wallet_id} has spent {budget.spent_usd:.2f} USD of its "
                    f"{budget.budget_usd:.2f} USD budget; ask the operator to raise it",
                    "limit": "wallet_budget",
                    **budget.to_json(),
                },
            )
