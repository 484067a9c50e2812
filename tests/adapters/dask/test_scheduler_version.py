"""The start-up check of the dask scheduler: its distributed version and the internals cordoning calls.

A second distributed cannot be installed offline, so an older scheduler is stood in for by a real
`Scheduler` whose class lacks `handle_worker_status_change` (what a release without it looks like to the
probe); versions are covered by the pure rule `cordon_problem`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import distributed
import pytest
from distributed import Scheduler

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.adapters.dask_check import MIN_DISTRIBUTED, cordon_problem
from swarm_autoscaler.errors import EndpointError

PARAMS = ["status", "worker", "stimulus_id"]


@pytest.mark.parametrize(
    ("version", "params", "streams", "expected"),
    [
        ("2026.8.0", PARAMS, True, None),
        (".".join(map(str, MIN_DISTRIBUTED)), PARAMS, True, None),
        ("2027.1.0+12.gdeadbeef", PARAMS, True, None),
        ("2023.12.1", PARAMS, True, "it runs distributed 2023.12.1; cordoning needs 2024.1.0 or later"),
        ("2022.1.0", [], False, "it runs distributed 2022.1.0; cordoning needs 2024.1.0 or later"),
        ("", PARAMS, True, "its distributed version '' is unknown; cordoning needs 2024.1.0 or later"),
        ("2026.8.0", [], True, "its distributed 2026.8.0 has no Scheduler.handle_worker_status_change("),
        ("2026.8.0", ["status", "worker"], True, "has no Scheduler.handle_worker_status_change("),
        ("2026.8.0", PARAMS, False, "or stream_comms, which cordoning calls"),
    ],
)
def test_which_schedulers_can_cordon(
    version: str, params: list[str], streams: bool, expected: str | None
) -> None:
    problem = cordon_problem(version, params, streams)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem, problem


async def test_the_real_scheduler_passes_the_check(scheduler: Scheduler, workload: DaskWorkload) -> None:
    check = await workload.check_scheduler()
    assert check.version == distributed.__version__
    assert check.cordon is None
    assert check.packing is False  # the fixture's scheduler runs no preload
    assert await workload.cordon(["tcp://127.0.0.1:1"]) == ()  # not a worker: nothing done, no refusal


async def test_the_check_sees_the_packing_preload() -> None:
    sched = Scheduler(
        host="127.0.0.1",
        port=0,
        dashboard=False,
        dashboard_address="127.0.0.1:0",
        preload=["swarm_autoscaler.adapters.dask_packing"],
    )
    async with sched, DaskWorkload(sched.address, timeout=5.0) as workload:
        check = await workload.check_scheduler()
    assert check.packing is True and check.cordon is None


class SchedulerWithoutStatusChange(Scheduler):  # type: ignore[misc]  # distributed is untyped
    handle_worker_status_change: Any = None


@pytest.fixture
async def old_scheduler() -> AsyncIterator[Scheduler]:
    sched = SchedulerWithoutStatusChange(
        host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0"
    )
    async with sched:
        yield sched


async def test_a_scheduler_that_cannot_cordon_is_reported_and_never_asked_to(
    old_scheduler: Scheduler,
) -> None:
    async with DaskWorkload(old_scheduler.address, timeout=5.0) as workload:
        check = await workload.check_scheduler()
        assert check.cordon is not None and "handle_worker_status_change" in check.cordon
        assert (await workload.observe()).workers == ()  # everything else works
        with pytest.raises(EndpointError) as caught:
            await workload.cordon(["tcp://127.0.0.1:1"])
    assert f"dask scheduler {old_scheduler.address}: cannot cordon or uncordon" in str(caught.value)


async def test_an_unreachable_scheduler_fails_the_check() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workload = DaskWorkload(f"tcp://127.0.0.1:{port}", timeout=2.0)
    try:
        with pytest.raises(EndpointError) as caught:
            await workload.check_scheduler()
    finally:
        await workload.close()
    assert caught.value.endpoint == f"dask scheduler tcp://127.0.0.1:{port}"


async def test_waiting_on_an_unreachable_scheduler_is_quiet_and_keeps_to_its_time() -> None:
    # The tick's observe() reports an unreachable scheduler; waiting for events must not add a second line.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workload = DaskWorkload(f"tcp://127.0.0.1:{port}", timeout=0.5)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await workload.wait_for_change(2.0) is False
        assert 1.9 <= loop.time() - started < 4.0
    finally:
        await workload.close()
