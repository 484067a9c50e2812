"""End to end on the local cloud with real dockerd swarm nodes: two daemon replicas behind a redis leader lock
(real processes, one killed with SIGKILL mid-scale-up), and a daemon restarted in the middle of a scale-down.
Machines boot as EC2 boots them (the `real_boot` fixture): their own user data on their own dockerd node,
and their dask workers are the worker service's tasks."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client
from tests.e2e.helpers import (
    REAL_BOOT,
    hostname_of,
    instance_state,
    owned_instances,
    start,
    wait_for,
)

from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.core.actions import DrainNode, Launch, RetireWorkers, Terminate
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, env_without_autoscaler
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

pytestmark = [*REAL_BOOT, pytest.mark.timeout(400)]

LEADER = "this replica is the leader"
STANDBY = "standby: another replica holds the lock"
ACTION_LINE = re.compile(r"\]\s+action\s")
LOCK_TTL_S = 3.0
POLL_S = 1.0  # the fast timing of the local cloud


def _pinned(cpus: float = 1.5) -> dict[str, float]:
    # 1.5 of an m5.large's 2 CPUs: one such task per machine, so N tasks need exactly N machines.
    return {"CPU": cpus, "RAM": GIB, "instance-type:m5.large": 1}


def _ever(lc: LocalCloud) -> set[str]:
    return set(owned_instances(lc, ("pending", "running", "shutting-down", "terminated")))


class Replica:
    """`swarm-autoscaler run --env-file F` as a separate process, its log in a file."""

    def __init__(self, name: str, env_file: Path, log: Path) -> None:
        self.name, self.log = name, log
        exe = Path(sys.executable).with_name("swarm-autoscaler")
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(exe), "run", "--env-file", str(env_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env_without_autoscaler() | {"NO_COLOR": "1"},
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _acted_before_leading(text: str) -> bool:
    """True when the log shows an action before this replica ever became the leader."""
    head = text.split(LEADER, 1)[0]
    return bool(ACTION_LINE.search(head))


async def test_two_replicas_one_acts_and_the_other_takes_over_after_kill_9(
    cloud: LocalCloud, foreign_instance: str, tmp_path: Path
) -> None:
    lc = cloud
    before = _ever(lc)
    async with RedisServer() as redis:
        env_file = lc.write_env_file(
            {"AUTOSCALER_REDIS_URL": redis.url, "AUTOSCALER_REDIS_LOCK_TTL": f"{LOCK_TTL_S:g}s"}
        )
        replicas = [Replica(n, env_file, tmp_path / f"{n}.log") for n in ("a", "b")]
        try:
            await wait_for(
                lambda: (
                    all(LEADER in r.text() or STANDBY in r.text() for r in replicas)
                    and any(LEADER in r.text() for r in replicas)
                ),
                60,
                "both replicas up, one of them the leader",
            )
            leaders = [r for r in replicas if LEADER in r.text()]
            assert len(leaders) == 1, [r.text()[-2000:] for r in replicas]
            leader = leaders[0]
            standby = next(r for r in replicas if r is not leader)

            runs_before = lc.moto.faults.calls().get("RunInstances", 0)
            async with Client(lc.scheduler_address, asynchronous=True) as client:
                futures = [
                    client.submit(time.sleep, 3.0, key=f"replica-{i}", resources=_pinned(), pure=False)
                    for i in range(3)
                ]
                await wait_for(
                    lambda: lc.moto.faults.calls().get("RunInstances", 0) > runs_before, 30, "a launch"
                )
                assert not _acted_before_leading(standby.text()), (
                    "the standby acted while the leader held the lock"
                )
                leader.proc.send_signal(signal.SIGKILL)  # mid-scale-up: launched, nothing joined yet
                leader.proc.wait(timeout=10)
                took = await wait_for(lambda: LEADER in standby.text(), 30, "the standby taking over")
                assert took <= LOCK_TTL_S + POLL_S + 3.0, f"takeover took {took:.1f}s"
                await asyncio.wait_for(client.gather(futures), 240)
            launched = _ever(lc) - before
            # three tasks needing one m5.large each: three machines, none launched twice across the takeover
            assert len(launched) == 3, f"launched {sorted(launched)} (the takeover launched again?)"
            await wait_for(lambda: not owned_instances(lc), 60, "the survivor scaling back down to 0")
            assert ACTION_LINE.search(standby.text().split(LEADER, 1)[1]), "the survivor never acted"
        except BaseException:  # what each replica said, for the failure's report (their logs are files)
            for r in replicas:
                print(
                    f"--- replica {r.name}, last lines:\n" + "\n".join(r.text().splitlines()[-40:]),
                    flush=True,
                )
            raise
        finally:
            for r in replicas:
                r.stop()
    assert all(r.proc.returncode is not None for r in replicas)
    assert instance_state(lc, foreign_instance) == "running"


async def test_restart_mid_scale_down_resumes_from_labels_and_spares_busy_nodes(
    cloud: LocalCloud, foreign_instance: str
) -> None:
    lc = cloud
    assert lc.scheduler is not None and lc.orchestrator is not None
    scheduler, orchestrator = lc.scheduler, lc.orchestrator
    before = _ever(lc)
    async with Client(lc.scheduler_address, asynchronous=True) as client:
        # three short pinned tasks make the daemon launch three machines (dask may pile them all on the first
        # worker to join; that does not matter, the machines are launched and join anyway)
        warm = [
            client.submit(time.sleep, 0.5, key=f"warm-{i}", resources=_pinned(), pure=False) for i in range(3)
        ]

        async with lc.daemon() as daemon:
            first = await start(daemon)
            try:
                await asyncio.wait_for(client.gather(warm), 240)
                for future in warm:
                    future.release()  # results held on a worker keep it from being retired
                await wait_for(lambda: len(scheduler.workers) == 3, 40, "three workers")
                long = client.submit(time.sleep, 15.0, key="long", resources=_pinned(), pure=False)
                await wait_for(
                    lambda: getattr(scheduler.tasks.get("long"), "processing_on", None) is not None,
                    30,
                    "the long task running",
                )
                busy_worker = scheduler.tasks["long"].processing_on
                busy_host, busy_address = (
                    machine_hostname(str(busy_worker.name)),
                    str(busy_worker.address),
                )
                # mid-scale-down: the first daemon has started draining idle nodes
                await wait_for(lambda: bool(first.record.of(DrainNode)), 40, "the first daemon draining")
            finally:
                await first.halt()
        drained_by_first = {a.node_id for a in first.record.of(DrainNode)}
        nodes = {n.id: n for n in await orchestrator.list_nodes()}
        marked = {
            i
            for i, n in nodes.items()
            if n.marks.drained_since is not None or n.marks.empty_since is not None
        }
        assert drained_by_first <= marked, "the scale-down state was not left in node labels"
        assert not long.done(), "the long task must still be running across the restart"

        async with lc.daemon() as daemon:
            second = await start(daemon)
            try:
                await asyncio.wait_for(long, 60)
                long_done = time.monotonic()
                assert long.status == "finished"
                long.release()  # a worker holding the only copy of a result is (rightly) never retired
                await wait_for(lambda: not owned_instances(lc), 60, "the restarted daemon scaling down to 0")
            finally:
                await second.halt()

    launched = {iid: inst for iid, inst in owned_instances(lc, ("shutting-down", "terminated")).items()}
    launched = {iid: inst for iid, inst in launched.items() if iid not in before}
    assert len(launched) == 3
    busy_ids = {iid for iid, inst in launched.items() if hostname_of(inst) == busy_host}
    assert len(busy_ids) == 1
    busy_node = next((i for i, n in nodes.items() if n.hostname == busy_host), None)
    # nothing busy was retired, drained or terminated, by either daemon, while its task ran
    for rec in (first.record, second.record):
        for t, action in rec.actions:
            if t >= long_done:
                continue
            if isinstance(action, DrainNode):
                assert action.hostname != busy_host and action.node_id != busy_node
            if isinstance(action, RetireWorkers):
                assert busy_address not in action.addresses
            if isinstance(action, Terminate):
                assert not busy_ids & set(action.instance_ids)
    # the restarted daemon resumed: it terminated what the first one drained, without draining it again
    # and without launching anything
    terminated_by_second = {n for a in second.record.of(Terminate) for n in a.node_ids}
    assert drained_by_first <= terminated_by_second
    assert not drained_by_first & {a.node_id for a in second.record.of(DrainNode)}
    assert not second.record.of(Launch)
    assert instance_state(lc, foreign_instance) == "running"
