"""The disruption budgets setting (`AUTOSCALER_DISRUPTION_BUDGETS`): a JSON list of budgets, each
Karpenter's shape, read into the core's `Budget` (core/budgets.py says how they apply)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from swarm_autoscaler.config.types import json_value
from swarm_autoscaler.core.model import Budget

Reason = Literal["empty", "consolidation", "drift", "expiry"]
Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_NODES = re.compile(r"^(\d+)(%?)$")
_CLOCK = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)$")


class BudgetSetting(BaseModel):
    """One disruption budget: `nodes` as a count ("3") or a share ("20%"), the reasons it bounds, and an
    optional window (days, start and end as HH:MM in UTC)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: str = Field(description='"N" machines or "P%" of the nodes, in disruption at once')
    reasons: tuple[Reason, ...] = ("empty", "consolidation", "drift", "expiry")
    days: tuple[Day, ...] = ()
    start: str = "00:00"
    end: str = "24:00"

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: object) -> str:
        text = str(value).strip()
        match = _NODES.match(text)
        if match is None or (match.group(2) and int(match.group(1)) > 100):
            raise ValueError(f'nodes must be a count ("3") or a share ("20%"), not {value!r}')
        return text

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str) -> str:
        if _CLOCK.match(value) is None or (value.startswith("24") and value != "24:00"):
            raise ValueError(f"a time of day must be HH:MM (00:00 to 24:00), not {value!r}")
        return value

    def to_budget(self) -> Budget:
        match = _NODES.match(self.nodes)
        assert match is not None  # validated
        count, percent = match.groups()
        start, end = (_seconds(self.start), _seconds(self.end))
        days = tuple(DAYS.index(d) for d in self.days)
        if percent:
            return Budget(share=int(count) / 100, reasons=self.reasons, days=days, start=start, end=end)
        return Budget(nodes=int(count), reasons=self.reasons, days=days, start=start, end=end)


Budgets = Annotated[
    tuple[BudgetSetting, ...], BeforeValidator(json_value('a JSON list like [{"nodes": "20%"}]'))
]


def _seconds(clock: str) -> float:
    hours, minutes = clock.split(":")
    return int(hours) * 3600.0 + int(minutes) * 60.0
