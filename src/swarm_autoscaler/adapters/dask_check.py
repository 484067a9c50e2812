"""The start-up check of a dask scheduler: its distributed version, whether it has the internals that
cordoning calls (see `dask.py`), and whether it runs the packing preload (`dask_packing.py`). `PROBE` runs on the scheduler (built in a factory, so cloudpickle ships it
by value); `cordon_problem` decides, purely, from what it found.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def _make_probe() -> Callable[..., dict[str, Any]]:
    def probe(dask_scheduler: Any) -> dict[str, Any]:
        """The scheduler's distributed version and the internals cordoning calls."""
        import inspect

        import distributed

        handler = getattr(dask_scheduler, "handle_worker_status_change", None)
        try:
            params = list(inspect.signature(handler).parameters) if callable(handler) else []
        except (TypeError, ValueError):
            params = []
        return {
            "version": str(getattr(distributed, "__version__", "")),
            "status_change": params,
            "streams": isinstance(getattr(dask_scheduler, "stream_comms", None), dict),
            # the preload's plugin (`dask_packing._PLUGIN`), by name: the probe cannot import it
            "packing": "dask-packing-queued" in getattr(dask_scheduler, "plugins", {}),
        }

    return probe


PROBE = _make_probe()

# The oldest distributed whose scheduler internals the cordon relies on (`handle_worker_status_change`
# with a stimulus id, the worker's `worker-status-change` op, queued tasks).
MIN_DISTRIBUTED = (2024, 1, 0)
_STATUS_CHANGE_PARAMS = ["status", "worker", "stimulus_id"]


def cordon_problem(version: str, status_change_params: Sequence[str], has_streams: bool) -> str | None:
    """None when a scheduler with this distributed `version` and these internals can cordon workers,
    else the reason, for one log line."""
    minimum = ".".join(map(str, MIN_DISTRIBUTED))
    parsed = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if parsed is None:
        return f"its distributed version {version!r} is unknown; cordoning needs {minimum} or later"
    if tuple(int(part) for part in parsed.groups()) < MIN_DISTRIBUTED:
        return f"it runs distributed {version}; cordoning needs {minimum} or later"
    if list(status_change_params) != _STATUS_CHANGE_PARAMS or not has_streams:
        return (
            f"its distributed {version} has no Scheduler.handle_worker_status_change(status, worker, "
            "stimulus_id) or stream_comms, which cordoning calls"
        )
    return None


@dataclass(frozen=True, slots=True)
class SchedulerCheck:
    """What `check_scheduler()` found: the scheduler's distributed version, None or why it cannot
    cordon, and whether the packing preload runs in it."""

    version: str
    cordon: str | None
    packing: bool = False
