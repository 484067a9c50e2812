"""The keeper's scheduler probe against a real dask scheduler's HTTP endpoint."""

from __future__ import annotations

import asyncio

from distributed import Client, Scheduler

from swarm_autoscaler.keeper.adapters.dask_probe import HttpSchedulerProbe, busy_from_metrics


def test_busy_states_are_read_from_prometheus_text() -> None:
    idle = 'dask_scheduler_tasks{state="released"} 4.0\ndask_scheduler_tasks{state="processing"} 0.0\n'
    assert not busy_from_metrics(idle)
    assert busy_from_metrics(idle + 'dask_scheduler_tasks{state="no-worker"} 2.0\n')
    assert not busy_from_metrics('garbage\ndask_scheduler_tasks{state="queued"} x\n')


async def test_a_real_scheduler_answers_and_shows_its_work() -> None:
    probe = HttpSchedulerProbe(timeout=3)
    async with Scheduler(port=0, dashboard_address="127.0.0.1:0") as scheduler:
        url = f"http://127.0.0.1:{scheduler.http_server.port}"
        first = await probe.probe(url)
        assert first.answered and not first.busy
        async with Client(scheduler.address, asynchronous=True) as client:
            futures = client.map(lambda x: x, range(3), resources={"GPU": 1})  # no worker: unrunnable
            for _ in range(50):
                if (await probe.probe(url)).busy:
                    break
                await asyncio.sleep(0.05)
            assert (await probe.probe(url)).busy
            await client.cancel(futures)
    gone = await probe.probe(url)
    assert not gone.answered
    await probe.close()
