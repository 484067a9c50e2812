"""Performing single actions through the ports for `act`, and the fresh reads it re-checks against.

A node's marks and launch labels (and a drain's availability) are written in ONE node update
(`Orchestrator.mark`), exactly as the plan's NodeUpdate, DrainNode, Cordon, Uncordon or Terminate
states them (complete marks: nothing is computed here; a failed termination takes back the
`termination_started` its Terminate wrote); marks the node already carries in the snapshot, with no
label, are not written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from swarm_autoscaler.core.actions import (
    Action,
    ActivateNode,
    Cordon,
    DrainNode,
    Launch,
    NodeUpdate,
    RemoveNode,
    RetireWorkers,
    Start,
    Stop,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.cluster import TYPE_LABEL
from swarm_autoscaler.core.kinds import Lane, kind_of
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, Availability, NodeMarks, Snapshot
from swarm_autoscaler.core.ports import Cloud, Orchestrator, Workload
from swarm_autoscaler.core.recheck import Fresh
from swarm_autoscaler.daemon.jobs import ActionRefused, Job, Outcome

READ_CUT = "the read was still running at the hard stop (one deadline past the tick's deadline)"


@dataclass(frozen=True, slots=True)
class Ports:
    """The three ports a tick talks through (the lock is the loop's business)."""

    cloud: Cloud
    orchestrator: Orchestrator
    workload: Workload


class Doer:
    """Performs single actions through the ports, and the fresh reads."""

    def __init__(self, ports: Ports, snapshot: Snapshot, cluster_name: str) -> None:
        self.ports = ports
        self.now = snapshot.now
        self.cluster_name = cluster_name
        self._marks = {n.id: n.marks for n in snapshot.nodes}  # as observed: what needs no write
        self._node_host = {n.id: n.hostname for n in snapshot.nodes}
        self._instance_host = {i.id: i.hostname for i in snapshot.instances}
        self._worker_host = {w.address: w.hostname for w in snapshot.workers}
        self.kept: set[str] = set()  # addresses the scheduler refused to retire during this act

    async def fresh_read(self, within: float | None) -> Fresh | str:
        """One node listing and one read of the workers, concurrently, in at most `within` seconds; the
        error text if either fails or time runs out."""
        failed = ""
        try:
            async with asyncio.timeout(within), asyncio.TaskGroup() as tg:
                nodes = tg.create_task(self.ports.orchestrator.list_nodes())
                workers = tg.create_task(self.ports.workload.list_workers())
        except* TimeoutError:
            failed = READ_CUT
        except* Exception as group:
            failed = "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions)
        return failed or Fresh(nodes.result(), workers.result())

    def hosts_of(self, action: Action) -> set[str]:
        """The hostnames a disruptive action touches (from the snapshot it was planned on)."""
        match action:
            case Terminate(instance_ids=ids, node_ids=node_ids) | Stop(instance_ids=ids, node_ids=node_ids):
                hosts = {self._instance_host.get(i, "") for i in ids}
                return (hosts | {self._node_host.get(n, "") for n in node_ids}) - {""}
            case DrainNode(hostname=host) | Cordon(hostname=host) | RemoveNode(hostname=host):
                return {host}
        return set()

    def unretired_hosts(self, outcomes: Iterable[Outcome], fresh: Fresh | str) -> dict[str, str]:
        """Host -> reason, for every worker a RetireWorkers of this act meant to retire and that did not
        retire: the scheduler kept it (it holds the only copy of a result), or the retirement failed or
        was skipped. Its node's drain and termination are then cancelled in this same act."""
        hosts = dict(self._worker_host)
        if not isinstance(fresh, str):
            hosts.update({w.address: w.hostname for w in fresh.workers})
        out: dict[str, str] = {}
        for outcome in outcomes:
            if not isinstance(outcome.action, RetireWorkers):
                continue
            for address in outcome.action.addresses:
                if address not in hosts:
                    continue
                if not outcome.ok:
                    out[hosts[address]] = (
                        f"the retirement of worker {address} did not happen ({outcome.kind})"
                    )
                elif address in self.kept:
                    out[hosts[address]] = f"the scheduler kept worker {address} (it refused to retire it)"
        return out

    def job(self, action: Action, lane: Lane = Lane.SAFETY) -> Job:
        """One action as one job, serialised on its node, run past the hard stop when its kind says."""
        node_id: str | None = getattr(action, "node_id", None)
        past = kind_of(action).finish_past_deadline
        return Job((action,), lambda: self.perform(action), node_id, past, lane)

    async def _write(self, node_id: str, marks: NodeMarks | None, labels: dict[str, str]) -> str:
        """ONE node update: the complete `marks` (None: unchanged) and `labels` added."""
        if marks is None:
            await self.ports.orchestrator.add_labels(node_id, labels)
            return "labelled"
        if node_id not in self._marks:
            raise ActionRefused("error", f"node {node_id} not in the snapshot")
        if marks == self._marks[node_id] and not labels:
            return "already marked (nothing written)"
        await self.ports.orchestrator.mark(node_id, marks, labels or None)
        return "marked and labelled" if labels else "marked"

    def terminate_batch(self, actions: Sequence[Terminate], note: str) -> Job:
        """Every Terminate of the act in ONE `Cloud.terminate` call, then their nodes removed. `note`
        (how their hosts were fenced) goes in the result. The only way a Terminate is carried out.
        Their nodes' marks (`termination_started`) are written first, and taken back if the call fails:
        a node carries the mark only for a termination that went ahead."""

        async def perform() -> str:
            ids = list(dict.fromkeys(i for a in actions for i in a.instance_ids))
            marked = await self._mark_ending(actions)
            try:
                await self.ports.cloud.terminate(ids)
            except Exception:
                await self._mark_ending(marked, undo=True)
                raise
            nodes = dict.fromkeys(n for a in actions for n in a.node_ids)
            async with asyncio.TaskGroup() as tg:
                for node_id in nodes:
                    tg.create_task(self.ports.orchestrator.remove(node_id))
            done = f"terminated (one call for {len(ids)} instance(s)); removed {len(nodes)} node(s)"
            return f"{done}; {note}"

        # Once TerminateInstances went out the step runs to its end, even past the deadline: it was
        # re-checked, and cut short it would leave nodes behind and report as undone what was done.
        return Job(tuple(actions), perform, finish_past_deadline=True)

    async def _mark_ending(self, actions: Sequence[Terminate], undo: bool = False) -> list[Terminate]:
        """Write the marks the terminations carry (with `undo`: their node's marks without the
        `termination_started` they set), concurrently, best effort: a failed write is no reason to keep
        a machine the plan ends (EC2 lists it as shutting down soon), nor to hide the call's failure.
        Returns the terminations whose marks were written."""

        async def write(action: Terminate) -> Terminate | None:
            node_id, marks = action.node_ids[0], action.marks
            assert marks is not None
            with contextlib.suppress(Exception):
                if undo:  # (written even when equal to the snapshot's: the node carries the mark now)
                    before = self._marks.get(node_id, NodeMarks()).termination_started
                    undone = dataclasses.replace(marks, termination_started=before)
                    await self.ports.orchestrator.mark(node_id, undone)
                else:
                    await self._write(node_id, marks, {})
                return action
            return None

        carrying = [a for a in actions if a.marks is not None and len(a.node_ids) == 1]
        return [a for a in await asyncio.gather(*(write(a) for a in carrying)) if a is not None]

    def stop_batch(self, actions: Sequence[Stop], note: str = "") -> Job:
        """Every Stop of the act in ONE `Cloud.stop_instances` call, then their nodes removed (a stopped machine
        joins afresh when started), run to its end past the deadline as a termination batch is."""

        async def perform() -> str:
            ids = list(dict.fromkeys(i for a in actions for i in a.instance_ids))
            await self.ports.cloud.stop_instances(ids)
            nodes = dict.fromkeys(n for a in actions for n in a.node_ids)
            async with asyncio.TaskGroup() as tg:
                for node_id in nodes:
                    tg.create_task(self.ports.orchestrator.remove(node_id))
            done = f"stopped into the warm pool (one call for {len(ids)} instance(s)); removed {len(nodes)} node(s)"
            return f"{done}; {note}" if note else done

        return Job(tuple(actions), perform, finish_past_deadline=True)

    async def perform(self, action: Action) -> str:
        match action:
            case Launch(type_name=type_name, count=count, pool=pool, labels=extra):
                return await self._launch(type_name, count, pool, dict(extra))
            case Start(instance_ids=ids, type_name=type_name):
                return await self._start(ids, type_name)
            case Stop():
                return await self.stop_batch([action]).perform()
            case RetireWorkers(addresses=addresses):
                retired = await self.ports.workload.retire(addresses)
                kept = sorted(set(addresses) - set(retired))
                self.kept.update(kept)
                if kept:
                    # dask may leave a worker it refused to retire closing_gracefully: it would take no
                    # task and never be retired again. Set it running; a later plan retires it once idle.
                    await self.ports.workload.uncordon(kept)
                    return f"retired {len(retired)}; scheduler kept {', '.join(kept)} (set running again)"
                return f"retired {len(retired)}"
            case Cordon(node_id=node_id, addresses=addresses, marks=marks):
                if marks is not None:  # first: a restart must see it
                    await self._write(node_id, marks, {})
                return f"cordoned {len(await self.ports.workload.cordon(addresses))}"
            case Uncordon(node_id=node_id, addresses=addresses, marks=marks):
                done = await self.ports.workload.uncordon(addresses)
                if marks is not None:
                    await self._write(node_id, marks, {})
                return f"uncordoned {len(done)}"
        return await self._perform_on_node(action)

    async def _perform_on_node(self, action: Action) -> str:
        orchestrator = self.ports.orchestrator
        match action:
            case ActivateNode(node_id=node_id):
                await orchestrator.set_availability(node_id, Availability.ACTIVE)
                return "activated"
            case DrainNode(node_id=node_id, marks=marks):
                # its marks with its availability, in ONE node update: written only when the drain goes
                # ahead, and never without it
                if marks is None or marks == self._marks.get(node_id):
                    await orchestrator.set_availability(node_id, Availability.DRAIN)
                    return "drained"
                await orchestrator.mark(node_id, marks, None, Availability.DRAIN)
                return "marked and drained (one node update)"
            case NodeUpdate(node_id=node_id, marks=marks, labels=labels):
                return await self._write(node_id, marks, dict(labels))
            case RemoveNode(node_id=node_id):
                await orchestrator.remove(node_id)
                return "removed"
        raise ActionRefused("error", f"unknown action {action!r}")  # pragma: no cover - exhaustive above

    async def _start(self, ids: tuple[str, ...], type_name: str) -> str:
        result = await self.ports.cloud.start_instances(ids)
        got = len(result.instances)
        if result.error:
            raise ActionRefused("error", f"started {got}/{len(ids)}: {result.error}")
        if got < len(ids) and result.refused:
            # backed off per (type, subnet): the next plan launches new machines instead
            raise ActionRefused("capacity", f"started {got}/{len(ids)}; EC2 refused {type_name} for capacity")
        return f"started {got} from the warm pool: {', '.join(i.id for i in result.instances)}"

    async def _launch(
        self, type_name: str, count: int, pool: bool = False, extra: dict[str, str] | None = None
    ) -> str:
        labels = {**(extra or {}), TYPE_LABEL: type_name}
        if self.cluster_name:
            labels[OWNERSHIP_LABEL] = self.cluster_name
        cloud = self.ports.cloud
        # (`pool` only when set: a launch to work calls the port exactly as before pools existed)
        result = await (
            cloud.launch(type_name, count, labels, pool=True)
            if pool
            else cloud.launch(type_name, count, labels)
        )
        got = len(result.instances)
        if result.error:
            raise ActionRefused("error", f"launched {got}/{count}: {result.error}")
        if got < count and result.refused:
            raise ActionRefused("capacity", f"launched {got}/{count}; no capacity for {type_name}")
        return f"launched {got}: {', '.join(i.id for i in result.instances)}"
