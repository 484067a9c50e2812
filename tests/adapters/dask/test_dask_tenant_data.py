"""Data, not code, from the daemon's own scheduler: anyone holding a client of it can run code there
(`run_on_scheduler`) and so make it answer anything. The daemon holds the cloud's credentials and the
docker socket; nothing its scheduler answers may run code in it.

Two attackers, each with a control that shows the payload is real (distributed's own `Client`, what the
daemon used before, runs it):

- a team member's client replaces, on a real scheduler, every handler the daemon calls (the
  autoscaler's plain-data handlers and `run_function`, which installs them) with ones answering a
  pickled frame that runs `os.mkdir` when unpickled;
- a stand-in scheduler (`tests.hostile`) that answers every message, its handshake included, with that
  frame (the control: distributed's `rpc`, the comm under its `Client`).

Every operation of the `Workload` port then fails as an `EndpointError` naming the scheduler (or
waits out quietly: `wait_for_change` is False), and the marker is never made."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, Scheduler
from distributed.core import rpc
from distributed.security import Security
from tests.hostile import Payload, hostile_scheduler

from swarm_autoscaler.adapters.dask import DaskWorkload
from swarm_autoscaler.adapters.dask_handlers import OPS
from swarm_autoscaler.adapters.dask_wire import client_context
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.keeper.adapters.tls import make_credentials


def _port_calls(workload: DaskWorkload) -> list[Callable[[], Awaitable[Any]]]:
    """Every call of the port (and the start-up check) that reads the scheduler."""
    return [
        workload.check_scheduler,
        workload.observe,
        workload.list_workers,
        lambda: workload.cordon(["tcp://10.0.0.5:1"]),
        lambda: workload.uncordon(["tcp://10.0.0.5:1"]),
        lambda: workload.fence(["ip-10-0-0-5"]),
        lambda: workload.unfence(["ip-10-0-0-5"]),
        lambda: workload.retire(["tcp://10.0.0.5:1"]),
    ]


async def _every_call_fails_without_a_trace(workload: DaskWorkload, marker: Path) -> None:
    for call in _port_calls(workload):
        with pytest.raises(EndpointError) as caught:
            await call()
        assert caught.value.endpoint == f"dask scheduler {workload.address}"
    assert await workload.wait_for_change(0.3) is False
    assert not _ran(marker), "the daemon ran code its scheduler sent"


def _ran(marker: Path) -> bool:
    return marker.exists()


def _poison(dask_scheduler: Any, marker: str, names: list[str]) -> None:
    """Run on the scheduler by the attacker's client: every handler the daemon calls now answers a
    frame that runs code when unpickled."""
    from distributed.protocol import to_serialize

    def answer(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {
            "status": "OK",
            "result": to_serialize(Payload(marker)),
            "workers": to_serialize(Payload(marker)),
        }

    for name in names:
        dask_scheduler.handlers[name] = answer


async def test_a_client_that_replaced_the_scheduler_s_handlers_runs_no_code_in_the_daemon(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    workload = DaskWorkload(scheduler.address, timeout=3.0, retire_timeout=3.0)
    await workload.check_scheduler()  # installed and working before the attack
    async with Client(scheduler.address, asynchronous=True, set_as_default=False) as attacker:
        names = [*OPS.values(), "run_function"]
        await attacker.run_on_scheduler(_poison, marker=str(marker), names=names)
        workload._installed = False  # the install (run_function) is attacked too, not only the handlers
        await _every_call_fails_without_a_trace(workload, marker)

        # The control: a dask client (what the daemon used) asking the same scheduler runs the payload.
        async with Client(scheduler.address, asynchronous=True, set_as_default=False) as daemon_before:
            with pytest.raises(FileExistsError):  # the answer's second payload: the first made the marker
                await daemon_before.run_on_scheduler(len, [])
    assert _ran(marker), "the control did not run the payload: the test proves nothing"


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_a_hostile_scheduler_runs_no_code_in_the_daemon_while_a_dask_client_would(
    tmp_path: Path, tls: bool
) -> None:
    """Over tcp:// and over tls:// (the stand-in holds a scheduler certificate of the daemon's CA, as a
    scheduler whose handlers were replaced does): the daemon's TLS path reads data only too."""
    marker = tmp_path / "ran"
    files = _tls_files(tmp_path) if tls else None
    listen = None
    if files is not None:
        listen = Security(  # type: ignore[no-untyped-call]
            tls_ca_file=files["ca.pem"], tls_scheduler_cert=files["scheduler.pem"],
            tls_scheduler_key=files["scheduler-key.pem"], require_encryption=True,
        ).get_listen_args("scheduler")["ssl_context"]  # fmt: skip
    async with hostile_scheduler(marker, listen) as url:
        daemon_files = (files["ca.pem"], files["worker.pem"], files["worker-key.pem"]) if files else None
        workload = DaskWorkload(url, timeout=3.0, retire_timeout=3.0, tls_files=daemon_files)
        await _every_call_fails_without_a_trace(workload, marker)
        args = {"ssl_context": client_context(*daemon_files)} if daemon_files else {}
        with pytest.raises(Exception):  # noqa: B017  whatever it raises after running the payload
            async with rpc(url, timeout=5, connection_args=args) as scheduler:  # type: ignore[no-untyped-call]
                await scheduler.run_function(function=b"")
    assert _ran(marker), "the control did not run the payload: the test proves nothing"


def _tls_files(tmp: Path) -> dict[str, str]:
    """A cluster's TLS files (the keeper's generator: a CA, the scheduler's and the workers' pairs)."""
    creds = make_credentials("kc-hostile")
    files = {}
    for name, text in creds.for_primary().items():
        (tmp / name).write_text(text)
        files[name] = str(tmp / name)
    return files


async def test_an_answer_of_the_wrong_shape_is_an_endpoint_error_not_a_crash(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    """The scheduler's state handler replaced by one answering plain data of the wrong shape (a string
    for the workers, a worker without fields, a task of one item): the daemon's tick sees an
    `EndpointError` naming the scheduler and what it answered, never a TypeError from deep inside."""
    workload = DaskWorkload(scheduler.address, timeout=3.0)
    await workload.connect()
    for junk in (
        {"workers": "not a list", "unrunnable": [], "queued": [], "changes": ["e", 0]},
        {"workers": [{}], "unrunnable": [], "queued": [], "changes": ["e", 0]},
        {"workers": [], "unrunnable": [["k"]], "queued": [], "changes": ["e", 0]},
        {"workers": [], "unrunnable": [], "queued": [], "changes": ["e", "not a count"]},
        ["not", "a", "map"],
    ):
        scheduler.handlers[OPS["state"]] = lambda junk=junk, **_: junk
        with pytest.raises(EndpointError, match="answer to state"):
            await workload.observe()
