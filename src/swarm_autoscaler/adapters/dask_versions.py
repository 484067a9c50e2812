"""Whether the scheduler, its workers and its clients run the same Python and `distributed`.

dask pickles functions and data between clients, the scheduler and workers: a worker image on another
Python minor version, or another `distributed`, fails in ways that point nowhere near the cause (a task
that cannot be unpickled, a protocol error). A team bringing its own worker image (docs/worker-service.md)
is where this happens, so the daemon says it once, naming the versions.

`read_versions` (run on the scheduler, inside `observe`'s call) counts each distinct (Python major.minor,
distributed) among the scheduler, workers and clients; `version_mismatch` (pure) turns that into one line
or None; `VersionWarnings` logs each distinct line once per process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

log = structlog.get_logger("swarm_autoscaler.adapters.dask_versions")


def _make_version_reader() -> Callable[[Any], dict[str, dict[str, int]]]:
    def read_versions(dask_scheduler: Any) -> dict[str, dict[str, int]]:
        """{"scheduler"|"workers"|"clients": {"python 3.11, distributed 2026.8.0": count}}."""
        import sys

        import distributed

        def describe(versions: Any) -> str:
            packages = (versions or {}).get("packages") or {}
            python = ".".join(str(packages.get("python") or "?").split(".")[:2])
            return f"python {python}, distributed {packages.get('distributed') or '?'}"

        def count(items: Any) -> dict[str, int]:
            out: dict[str, int] = {}
            for versions in items:
                if versions:  # the scheduler's own internal clients report none
                    key = describe(versions)
                    out[key] = out.get(key, 0) + 1
            return out

        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        own = {"packages": {"python": python, "distributed": getattr(distributed, "__version__", "")}}
        return {
            "scheduler": {describe(own): 1},
            "workers": count(getattr(ws, "versions", None) for ws in dask_scheduler.workers.values()),
            "clients": count(getattr(cs, "versions", None) for cs in dask_scheduler.clients.values()),
        }

    return read_versions


READ_VERSIONS = _make_version_reader()


def version_mismatch(found: Mapping[str, Mapping[str, int]]) -> str | None:
    """One line naming every (Python, distributed) seen and where, or None when all agree."""
    seen = {key for group in found.values() for key in group}
    if len(seen) <= 1:
        return None
    parts = []
    for role in ("scheduler", "workers", "clients"):
        for key, n in sorted(found.get(role, {}).items()):
            parts.append(f"{role if n == 1 or role == 'scheduler' else f'{n} {role}'}: {key}")
    return (
        "the dask scheduler, workers and clients do not run the same Python and distributed ("
        + "; ".join(parts)
        + "): tasks may fail to unpickle; build the worker image with the scheduler's versions "
        "(docs/worker-service.md, 'Your own worker image')"
    )


class VersionWarnings:
    """Logs each distinct mismatch once (the fleet changes every tick; the warning must not)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def check(self, found: Mapping[str, Mapping[str, int]]) -> str | None:
        line = version_mismatch(found)
        if line is None:
            return None
        # keyed by the distinct versions, not the counts: a worker more or less is not news
        key = "|".join(sorted({k for group in found.values() for k in group}))
        if key in self.said:
            return None
        self.said.add(key)
        log.warning(line)
        return line
