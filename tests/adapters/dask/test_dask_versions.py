"""The version check between the scheduler, its workers and its clients (`adapters.dask_versions`): on a
real scheduler with in-process workers and a client (all on this process's versions: no warning), then
the pure rule on what a scheduler reports when a team's worker image runs another Python or distributed
(what the e2e suite's worker image, Debian's Python 3.11.2, is to a 3.11.7 client: the same minor)."""

from __future__ import annotations

import sys

import distributed
from distributed import Client, Scheduler
from tests.adapters.dask.conftest import StartWorker

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.adapters.dask_versions import READ_VERSIONS, VersionWarnings, version_mismatch

HERE = f"python {sys.version_info.major}.{sys.version_info.minor}, distributed {distributed.__version__}"


async def test_a_cluster_on_one_version_reads_as_one_and_warns_nothing(
    scheduler: Scheduler, start_worker: StartWorker, client: Client, workload: DaskWorkload
) -> None:
    await start_worker("ip-10-0-0-5")
    await start_worker("ip-10-0-0-6")
    found = READ_VERSIONS(scheduler)
    assert found["scheduler"] == {HERE: 1} and found["workers"] == {HERE: 2}
    assert found["clients"].get(HERE, 0) >= 1  # the user's client (and the adapter's once connected)
    await workload.observe()
    assert workload.versions.said == set()


def test_a_worker_image_on_another_version_is_named_once() -> None:
    found = {
        "scheduler": {"python 3.11, distributed 2026.8.0": 1},
        "workers": {"python 3.12, distributed 2026.9.0": 3, "python 3.11, distributed 2026.8.0": 1},
        "clients": {"python 3.11, distributed 2026.8.0": 2},
    }
    line = version_mismatch(found)
    assert line is not None
    assert "3 workers: python 3.12, distributed 2026.9.0" in line
    assert "scheduler: python 3.11, distributed 2026.8.0" in line and "2 clients:" in line
    warnings = VersionWarnings()
    assert warnings.check(found) == line
    more = {**found, "workers": {"python 3.12, distributed 2026.9.0": 5}}
    assert warnings.check(more) is None  # the same disagreement with more workers: said already
    assert version_mismatch({"scheduler": {"a": 1}, "workers": {"a": 4}, "clients": {}}) is None
