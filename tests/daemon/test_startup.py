"""The daemon's start-up check of the dask scheduler: a scheduler that cannot cordon workers turns
consolidation off, said in one warning line, and the daemon runs on; one that can keeps it. A scheduler
without the packing preload is named in one warning line of its own; one with it in none.

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


PRELOAD = "swarm_autoscaler.adapters.dask_packing"
NO_PACKING = "runs without the packing preload"
JOIN_TICKETS_OFF = "join tickets are off"


def warnings_of_ours(out: io.StringIO, packing: bool = False) -> list[dict[str, object]]:
    """The daemon's warnings and errors; the packing preload's warning only with `packing`, and never
    the one that join tickets are off (the local cloud's VPC is not on loopback here: test_join_startup)."""
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    found = [e for e in lines if "logger" not in e and e["level"] in ("warning", "error")]
    found = [e for e in found if not str(e["event"]).startswith(JOIN_TICKETS_OFF)]
    return [e for e in found if packing or NO_PACKING not in str(e["event"])]


@pytest.fixture
async def packing_scheduler() -> AsyncIterator[Scheduler]:
    """A scheduler started as docs/packing.md deploys it: with the packing preload."""
    sched = Scheduler(
        host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0", preload=[PRELOAD]
    )
    async with sched:
        yield sched


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


async def test_a_scheduler_without_the_packing_preload_is_named_in_one_warning_line(lc: LocalCloud) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    assert lc.scheduler is not None and not lc.options.scheduler_preload
    async with lc.daemon() as daemon:
        assert await daemon.tick_once() is not None  # and the daemon runs on
    [warning] = warnings_of_ours(out, packing=True)
    event = str(warning["event"])
    assert event.startswith(f"the dask scheduler {lc.scheduler.address} {NO_PACKING}: ")
    assert f"--preload {PRELOAD}" in event


async def test_a_scheduler_with_the_packing_preload_gets_no_warning(
    lc: LocalCloud, packing_scheduler: Scheduler
) -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    async with lc.daemon({"AUTOSCALER_DASK_SCHEDULER_URL": packing_scheduler.address}) as daemon:
        assert daemon.policy.consolidate_below == 0.5
        assert await daemon.tick_once() is not None
    assert warnings_of_ours(out, packing=True) == []
