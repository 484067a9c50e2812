"""Fault injection: random (from rates and a seed) or scripted (explicit lists, for shrinking).

Every decision is a pure function of (seed, what, index), so a run is reproducible from its seed and the
decision for the n-th launch does not depend on how many other random draws happened before it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from swarm_autoscaler_lab.sim.world import Faults, Knobs


def _uniform(seed: int, what: str, index: int) -> float:
    return random.Random(f"{seed}:{what}:{index}").random()


def _jittered_join(seed: int, instance_no: int, knobs: Knobs) -> float:
    """`join_s ± join_jitter_s`, uniform, never below 1 s."""
    jitter = (2 * _uniform(seed, "join", instance_no) - 1) * knobs.join_jitter_s
    return max(1.0, knobs.join_s + jitter)


@dataclass(frozen=True)
class RandomFaults(Faults):
    """Capacity refusals per launch call with a per-type rate (`refusal_rates`, else `refusal_rate`),
    machines that never join with `never_join_rate`, and each join delay drawn uniformly in
    `join_s ± join_jitter_s` (never below 1 s)."""

    seed: int = 0
    refusal_rate: float = 0.0
    refusal_rates: Mapping[str, float] = field(default_factory=dict)
    never_join_rate: float = 0.0
    start_refusal_rate: float = 0.0  # a warm-pool machine's start refused for capacity
    interruptions_per_hour: float = 0.0  # EC2's notices per spot machine-hour (a Poisson rate)

    def refuse(self, call_no: int, type_name: str, subnet_id: str = "") -> bool:
        rate = self.refusal_rates.get(type_name, self.refusal_rate)
        return rate > 0 and _uniform(self.seed, "refuse", call_no) < rate

    def refuse_start(self, call_no: int, type_name: str) -> bool:
        rate = self.start_refusal_rate
        return rate > 0 and _uniform(self.seed, "start", call_no) < rate

    def never_joins(self, instance_no: int) -> bool:
        return self.never_join_rate > 0 and _uniform(self.seed, "never", instance_no) < self.never_join_rate

    def join_delay(self, instance_no: int, knobs: Knobs) -> float:
        return _jittered_join(self.seed, instance_no, knobs)

    def interruption_after(self, instance_no: int) -> float | None:
        """Seconds from a spot machine's launch to EC2's notice: exponential at `interruptions_per_hour`."""
        if self.interruptions_per_hour <= 0:
            return None
        return (
            -math.log(1.0 - _uniform(self.seed, "interrupt", instance_no))
            * 3600.0
            / self.interruptions_per_hour
        )


@dataclass(frozen=True)
class ScriptedFaults(Faults):
    """Exactly these faults: refused launch calls, never-joining instances (by launch order, from 1) and
    daemon restarts (by tick number). Join delays jitter as in `RandomFaults` with `seed`.
    `refused_in` lists (type, subnet) pairs whose every launch call is refused (a zone out of capacity)."""

    seed: int = 0
    refused_calls: frozenset[int] = frozenset()
    never_join: frozenset[int] = frozenset()
    restarts: frozenset[int] = frozenset()
    refused_in: frozenset[tuple[str, str]] = frozenset()
    refused_starts: frozenset[int] = frozenset()  # warm-pool starts refused for capacity (by call, from 1)
    interrupted: frozenset[int] = frozenset()  # spot instances given a notice (by launch order, from 1)

    def refuse(self, call_no: int, type_name: str, subnet_id: str = "") -> bool:
        return call_no in self.refused_calls or (type_name, subnet_id) in self.refused_in

    def refuse_start(self, call_no: int, type_name: str) -> bool:
        return call_no in self.refused_starts

    def never_joins(self, instance_no: int) -> bool:
        return instance_no in self.never_join

    def restart(self, tick_no: int) -> bool:
        return tick_no in self.restarts

    def join_delay(self, instance_no: int, knobs: Knobs) -> float:
        return _jittered_join(self.seed, instance_no, knobs)

    def interruption_after(self, instance_no: int) -> float | None:
        """A notice for the listed instances, 30 to 330 s after launch (about when it works)."""
        if instance_no not in self.interrupted:
            return None
        return 30.0 + 300.0 * _uniform(self.seed, "interrupt", instance_no)
