"""Resources as plain float vectors, for the placement hot paths. Pure.

A `Vec` is (cpus, ram, gpus, then one slot per generic resource name seen in the snapshot); `Space`
interns one per distinct `Resources` value, so the inner loops compare floats, not dataclasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from swarm_autoscaler.core.model import Resources

Vec = tuple[float, ...]
EPS = 1e-9
UNBOUNDED = 1 << 62  # how many zero-need tasks fit in a bin


class Space:
    """Turns `Resources` into `Vec`s over a fixed set of generic resource names."""

    def __init__(self, generic_names: Iterable[str]) -> None:
        self.names = tuple(sorted(set(generic_names)))
        self._slot = {name: 3 + i for i, name in enumerate(self.names)}
        self.zero: Vec = (0.0,) * (3 + len(self.names))
        self._cache: dict[tuple[float, int, int, tuple[tuple[str, float], ...]], Vec] = {}

    @staticmethod
    def over(resources: Iterable[Resources]) -> Space:
        return Space(name for r in resources for name, _ in r.generic)

    def vec(self, res: Resources) -> Vec:
        key = (res.cpus, res.ram, res.gpus, res.generic)  # cheaper to hash than the dataclass
        v = self._cache.get(key)
        if v is None:
            out = [float(res.cpus), float(res.ram), float(res.gpus), *self.zero[3:]]
            for name, amount in res.generic:
                out[self._slot[name]] = float(amount)
            v = self._cache[key] = tuple(out)
        return v


def fits(need: Vec, free: Vec) -> bool:
    return all(a <= b + EPS for a, b in zip(need, free, strict=True))


def fit_count(need: Vec, free: Vec) -> int:
    """How many copies of `need` fit in `free` at once."""
    best = UNBOUNDED
    for a, b in zip(need, free, strict=True):
        if a > 0.0:
            k = int((b + EPS) / a)
            if k < best:
                if k <= 0:
                    return 0
                best = k
    return best


def fit_count_nz(nz: Sequence[tuple[int, float]], free: Vec) -> int:
    """`fit_count` for a need given as its non-zero (dimension, amount) pairs."""
    best = UNBOUNDED
    for d, a in nz:
        k = int((free[d] + EPS) / a)
        if k < best:
            if k <= 0:
                return 0
            best = k
    return best


def minus(free: Vec, need: Vec, k: int = 1) -> Vec:
    return tuple(max(0.0, b - a * k) for a, b in zip(need, free, strict=True))


def plus(total: Vec, need: Vec, k: int = 1) -> Vec:
    return tuple(b + a * k for a, b in zip(need, total, strict=True))
