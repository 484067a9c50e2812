"""do-not-disrupt as a dask task annotation, on a real dask scheduler and in-process workers (named
like EC2 hosts): the adapter reads `with dask.annotate(do_not_disrupt=True)` off the scheduler's task
state, and the planner then never consolidates the machine running it, until it finishes."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import dask
import pytest
from distributed import Client
from tests.adapters.dask import test_dask_workload as base
from tests.adapters.dask.conftest import StartWorker
from tests.builders import make_instance, make_node, make_policy, make_snapshot

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.core.actions import Cordon
from swarm_autoscaler.core.model import GIB, Snapshot, Worker
from swarm_autoscaler.core.plan import plan

HOSTS = ("ip-10-0-0-1", "ip-10-0-0-2")
held, observe_until = base.held, base._observe_until


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Holds `held` tasks until set (base's module event: in-process workers share this process)."""
    base._GATE.clear()
    yield base._GATE
    base._GATE.set()


def _snapshot(workers: tuple[Worker, ...]) -> Snapshot:
    """Two m5.xlarge machines of ours whose workers are the scheduler's (as observe reports them)."""
    return make_snapshot(
        instances=[make_instance(n, "m5.xlarge") for n in (1, 2)],
        nodes=[make_node(n) for n in (1, 2)],
        workers=workers,
    )


async def test_a_machine_running_an_annotated_task_is_not_consolidated_until_it_finishes(
    workload: DaskWorkload, start_worker: StartWorker, client: Client, gate: threading.Event
) -> None:
    for host in HOSTS:
        await start_worker(host, cpus=4, ram=16 * GIB)
    with dask.annotate(do_not_disrupt=True):
        kept = [
            client.submit(held, n, key=f"long-{n}", workers=[w], resources={"CPU": 1})
            for n, w in enumerate(HOSTS)
        ]
    # (running, as a heartbeat reports: a task still waiting on a worker keeps it from a cordon anyway)
    view = await observe_until(
        workload, lambda v: sum(t.executing for w in v.workers for t in w.processing) == 2
    )
    tasks = [t for w in view.workers for t in w.processing]
    assert {t.key for t in tasks} == {"long-0", "long-1"} and all(t.do_not_disrupt for t in tasks)

    # Each worker is a quarter used: consolidation would cordon one (the control, the same workers
    # without the annotation); with it, none, and the plan says why.
    annotated = plan(_snapshot(view.workers), make_policy())
    plain = tuple(
        dataclasses.replace(
            w, processing=tuple(dataclasses.replace(t, do_not_disrupt=False) for t in w.processing)
        )
        for w in view.workers
    )
    assert len(plan(_snapshot(plain), make_policy()).of_kind(Cordon)) == 1
    assert annotated.of_kind(Cordon) == ()
    assert [(h.reason, h.by) for h in annotated.held] == [("consolidation", "do-not-disrupt")]
    assert "annotated do_not_disrupt (long-" in annotated.held[0].why

    gate.set()  # the tasks finish: nothing protects the machines any more
    assert await client.gather(kept) == [0, 1]
    view = await observe_until(workload, lambda v: not any(w.processing for w in v.workers))
    assert plan(_snapshot(view.workers), make_policy()).held == ()
