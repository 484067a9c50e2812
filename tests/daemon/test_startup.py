"""The daemon's start-up check of the dask scheduler's version: a scheduler that cannot cordon workers turns
consolidation off, said in one warning line, and the daemon runs on; one that can keeps it.

The real daemon is built by `open_daemon` (as `swarm-autoscaler run` does) on the local cloud, pointed at
a real scheduler whose class lacks `handle_worker_status_change` (see tests/adapters/dask).
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator

import pytest
from distributed import Scheduler
from tests.adapters.dask.test_scheduler_version import SchedulerWithoutStatusChange

from swarm_autoscaler.runtime.logs import configure_logging
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("restore_logging")]


@pytest.fixture(scope="module")
async def lc() -> AsyncIterator[LocalCloud]:
    async with LocalCloud(LocalCloudOptions(fast=True, cluster_name="startup")) as cloud:
        yield cloud


@pytest.fixture
async def old_scheduler() -> AsyncIterator[Scheduler]:
    sched = SchedulerWithoutStatusChange(
        host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0"
    )
    async with sched:
        yield sched


def warnings_of_ours(out: io.StringIO) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    return [e for e in lines if "logger" not in e and e["level"] in ("warning", "error")]


async def test_a_scheduler_that_cannot_cordon_turns_consolidation_off_in_one_warning_line(
    lc: LocalCloud, old_scheduler: Scheduler
) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    async with lc.daemon({"AUTOSCALER_DASK_SCHEDULER_URL": old_scheduler.address}) as daemon:
        assert daemon.policy.consolidate_below == 0.0
        result = await daemon.tick_once()  # and the daemon runs on
        assert result is not None
    [warning] = warnings_of_ours(out)
    assert str(warning["event"]).startswith(
        f"consolidation is off: the dask scheduler {old_scheduler.address} cannot cordon workers (its "
        "distributed "
    )
    assert "handle_worker_status_change" in str(warning["event"])
    assert "Traceback" not in out.getvalue()


async def test_nothing_is_said_when_consolidation_is_off_anyway(
    lc: LocalCloud, old_scheduler: Scheduler
) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    settings = {"AUTOSCALER_DASK_SCHEDULER_URL": old_scheduler.address, "AUTOSCALER_CONSOLIDATE_BELOW": "0"}
    async with lc.daemon(settings) as daemon:
        assert daemon.policy.consolidate_below == 0.0
    assert warnings_of_ours(out) == []


async def test_a_scheduler_that_can_cordon_keeps_consolidation(lc: LocalCloud) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    async with lc.daemon() as daemon:
        assert daemon.policy.consolidate_below == 0.5
    assert warnings_of_ours(out) == []
