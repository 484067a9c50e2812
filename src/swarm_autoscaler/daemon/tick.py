"""One tick: observe through the ports -> plan() -> act through the ports.

The daemon, the demo and the simulator all call `run_tick`; none has its own path to the planner.
Observe is all-or-nothing: if any source fails, the tick acts on nothing. Act turns every error into
data (an `Outcome`), so one failing action never stops the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from swarm_autoscaler.core.cluster import OWNED_NODE_LABEL, Cluster, classify
from swarm_autoscaler.core.model import (
    Action,
    ActivateNode,
    Availability,
    Cordon,
    DrainNode,
    InstanceType,
    LabelNode,
    Launch,
    MarkNode,
    NodeMarks,
    Plan,
    Policy,
    RemoveNode,
    RetireWorkers,
    Snapshot,
    Terminate,
    Uncordon,
)
from swarm_autoscaler.core.plan import plan as make_plan
from swarm_autoscaler.core.ports import Cloud, Orchestrator, Workload
from swarm_autoscaler.errors import AutoscalerError, LockLostError

# Label carried by every launched instance (as a tag) and applied to its node: the instance type.
TYPE_LABEL = OWNED_NODE_LABEL


@dataclass(frozen=True, slots=True)
class Ports:
    """The three ports a tick talks through (the lock is the loop's business)."""

    cloud: Cloud
    orchestrator: Orchestrator
    workload: Workload


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one action. `detail` says what happened or what failed."""

    action: Action
    ok: bool
    detail: str = ""
    kind: str = ""

    @property
    def action_kind(self) -> str:
        return type(self.action).__name__


@dataclass(frozen=True)
class TickResult:
    """One tick's snapshot, plan and outcomes, and the snapshot's classification (for logs, metrics and
    views; computed on first use, as a simulation never asks for it)."""

    snapshot: Snapshot
    policy: Policy
    plan: Plan
    outcomes: tuple[Outcome, ...]
    acted: bool

    @functools.cached_property
    def cluster(self) -> Cluster:
        return classify(self.snapshot, self.policy)


class ObserveError(AutoscalerError):
    """One or more sources failed during observe; the tick acts on nothing."""


async def observe(ports: Ports, catalogue: Mapping[str, InstanceType], now: float) -> Snapshot:
    """Read every source concurrently and build one frozen Snapshot; any failure fails the whole read."""
    try:
        async with asyncio.TaskGroup() as tg:
            instances = tg.create_task(ports.cloud.list_instances())
            nodes = tg.create_task(ports.orchestrator.list_nodes())
            workload = tg.create_task(ports.workload.observe())
    except* Exception as group:
        reasons = "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions)
        raise ObserveError(f"observe failed, acting on nothing this tick: {reasons}") from None
    view = workload.result()
    return Snapshot(
        now=now,
        instance_types=tuple(catalogue.values()),
        instances=instances.result(),
        nodes=nodes.result(),
        workers=view.workers,
        unrunnable=view.unrunnable,
        unavailable=ports.cloud.unavailable(now),
        queued=view.queued,
    )


StillLeader = Callable[[], bool]


async def act(
    plan: Plan,
    snapshot: Snapshot,
    ports: Ports,
    still_leader: StillLeader = lambda: True,
) -> tuple[Outcome, ...]:
    """Carry out the plan's actions in order. Every error becomes a failed Outcome. When `still_leader`
    turns False, the remaining actions are cancelled (reported as failed with kind "cancelled")."""
    outcomes: list[Outcome] = []
    marks = {n.id: n.marks for n in snapshot.nodes}
    for action in plan.actions:
        if not still_leader():
            outcomes.append(Outcome(action, False, "leadership lost; cancelled", kind="cancelled"))
            continue
        try:
            detail = await _perform(action, ports, marks, snapshot.now)
            outcomes.append(Outcome(action, True, detail))
        except LockLostError as exc:
            outcomes.append(Outcome(action, False, str(exc), kind="cancelled"))
        except ActionRefused as exc:
            outcomes.append(Outcome(action, False, str(exc), kind=exc.kind))
        except Exception as exc:  # any adapter failure is data; the loop never dies
            outcomes.append(Outcome(action, False, f"{type(exc).__name__}: {exc}", kind="error"))
    return tuple(outcomes)


class ActionRefused(AutoscalerError):
    """An action the far side declined (e.g. a capacity refusal). `kind` classifies it for metrics."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


async def _perform(action: Action, ports: Ports, marks: dict[str, NodeMarks], now: float) -> str:
    match action:
        case Launch(type_name=type_name, count=count):
            return await _launch(ports.cloud, type_name, count)
        case Terminate(instance_ids=ids, node_ids=node_ids):
            await ports.cloud.terminate(ids)
            for node_id in node_ids:
                await ports.orchestrator.remove(node_id)
            return f"terminated {len(ids)}"
        case RetireWorkers(addresses=addresses):
            retired = await ports.workload.retire(addresses)
            kept = sorted(set(addresses) - set(retired))
            if kept:
                return f"retired {len(retired)}; scheduler kept {', '.join(kept)}"
            return f"retired {len(retired)}"
        case Cordon(node_id=node_id, addresses=addresses):
            await _mark(ports, marks, node_id, cordoned_since=now)  # first: a restart must see it
            return f"cordoned {len(await ports.workload.cordon(addresses))}"
        case Uncordon(node_id=node_id, addresses=addresses):
            done = await ports.workload.uncordon(addresses)
            await _mark(ports, marks, node_id, cordoned_since=None)
            return f"uncordoned {len(done)}"
    return await _perform_on_node(action, ports, marks)


async def _perform_on_node(action: Action, ports: Ports, marks: dict[str, NodeMarks]) -> str:
    match action:
        case ActivateNode(node_id=node_id):
            await ports.orchestrator.set_availability(node_id, Availability.ACTIVE)
            return "activated"
        case DrainNode(node_id=node_id):
            await ports.orchestrator.set_availability(node_id, Availability.DRAIN)
            return "drained"
        case MarkNode(node_id=node_id, marks=new):
            await _mark(ports, marks, node_id, **dataclasses.asdict(new))
            return "marked"
        case LabelNode(node_id=node_id, labels=labels):
            await ports.orchestrator.add_labels(node_id, dict(labels))
            return "labelled"
        case RemoveNode(node_id=node_id):
            await ports.orchestrator.remove(node_id)
            return "removed"
    raise ActionRefused("error", f"unknown action {action!r}")  # pragma: no cover - exhaustive above


async def _mark(
    ports: Ports, marks: dict[str, NodeMarks], node_id: str, **changes: float | bool | None
) -> None:
    current = marks.get(node_id)
    if current is None:
        raise ActionRefused("error", f"node {node_id} not in the snapshot")
    updated = dataclasses.replace(current, **changes)  # type: ignore[arg-type]
    await ports.orchestrator.mark(node_id, updated)
    marks[node_id] = updated


async def _launch(cloud: Cloud, type_name: str, count: int) -> str:
    result = await cloud.launch(type_name, count, {TYPE_LABEL: type_name})
    got = len(result.instances)
    if result.error:
        raise ActionRefused("error", f"launched {got}/{count}: {result.error}")
    if got < count and result.refused:
        raise ActionRefused("capacity", f"launched {got}/{count}; no capacity for {type_name}")
    return f"launched {got}: {', '.join(i.id for i in result.instances)}"


async def run_tick(
    ports: Ports,
    policy: Policy,
    catalogue: Mapping[str, InstanceType],
    now: float,
    *,
    leader: bool = True,
    still_leader: StillLeader = lambda: True,
    planner: Callable[[Snapshot, Policy], Plan] = make_plan,
) -> TickResult:
    """Observe, plan and (when `leader`) act. Raises ObserveError when observe fails."""
    snapshot = await observe(ports, catalogue, now)
    plan = planner(snapshot, policy)
    if not leader:
        return TickResult(snapshot, policy, plan, (), acted=False)
    outcomes = await act(plan, snapshot, ports, still_leader)
    return TickResult(snapshot, policy, plan, outcomes, acted=True)
