"""What a plan is made of: the actions the planner decides and `act` carries out, and the checks a
disruptive action carries so that `act` can re-check it against a fresh read right before it runs.

Pure data, like `core.model` (whose observed state these refer to).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm_autoscaler.core.model import NodeMarks

# --------------------------------------------------------------------------------------------- preconditions
#
# A plan ages while it is carried out: under load the snapshot is many seconds old when an action runs.
# Every disruptive action (Terminate, DrainNode, RemoveNode, RetireWorkers, Cordon) therefore carries, in
# `expect`, what must still hold for it to be safe; `act` re-reads the swarm and the scheduler right
# before the disruptive step and skips an action any of whose checks fails (`core.recheck`).


@dataclass(frozen=True, slots=True)
class HostIdle:
    """No dask worker on `hostname` runs or queues a task or holds a result no other worker has. A
    worker that connected since the snapshot counts too."""

    hostname: str


@dataclass(frozen=True, slots=True)
class NoTasks:
    """No dask worker on `hostname` runs or queues a task (results it holds are allowed: this is the
    check of a RetireWorkers of a worker holding results, which dask's `retire_workers` moves to another
    worker before it closes the worker, keeping the worker when it cannot)."""

    hostname: str


@dataclass(frozen=True, slots=True)
class NoWorker:
    """No dask worker is connected on `hostname` (the machine was planned as never having come up)."""

    hostname: str


@dataclass(frozen=True, slots=True)
class NotJoined:
    """No swarm node with `hostname` exists (the instance was planned as never having joined)."""

    hostname: str


@dataclass(frozen=True, slots=True)
class NodeOurs:
    """The swarm node `node_id` exists, is not a manager and carries this cluster's ownership label."""

    node_id: str


@dataclass(frozen=True, slots=True)
class NodePaused:
    """The swarm node `node_id` exists, is ready, is still paused and carries no `ready` and no
    `termination_started` mark: nobody took it in, drained it or began terminating it since the plan."""

    node_id: str


@dataclass(frozen=True, slots=True)
class NodeDown:
    """The swarm node `node_id` is still not ready (down, disconnected or unknown), or is gone."""

    node_id: str


@dataclass(frozen=True, slots=True)
class NothingWaits:
    """No task waits (assigned, not executing) on a worker on `hostname`: a cordoned worker starts no
    new task, so one waiting there would be stuck."""

    hostname: str


@dataclass(frozen=True, slots=True)
class Retired:
    """Every dask worker on `hostname` is gone or retiring: the scheduler really retired it (a worker
    the scheduler kept, because it holds the only copy of a result, runs on). Checked on a read taken
    after the plan's RetireWorkers step."""

    hostname: str


Check = HostIdle | NoTasks | NoWorker | NotJoined | NodeOurs | NodePaused | NodeDown | NothingWaits | Retired


# --------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True, slots=True)
class ActivateNode:
    """Set a drained node's availability back to active, because tasks were assigned to it; or take in
    a node that joined paused (`Policy.join_paused`): that one carries `expect` and is re-checked on a
    fresh read, after its labels are written, right before it runs."""

    node_id: str
    hostname: str
    reason: str
    expect: tuple[Check, ...] = ()


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch `count` new instances of one type. `pool`: into its warm pool (they prepare and stop
    themselves, never joining on that first boot). `labels`: labels the planner adds to the ones act
    gives every launch (the launch spec, drift.py)."""

    type_name: str
    count: int
    reason: str
    pool: bool = False
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Start:
    """Start stopped warm-pool instances of one type, so that they join the swarm on this boot. Not
    disruptive (nothing runs on a stopped machine); a refusal for capacity backs its (type, subnet) off,
    so the next plan launches instead."""

    instance_ids: tuple[str, ...]
    type_name: str
    reason: str


@dataclass(frozen=True, slots=True)
class RetireWorkers:
    """Ask the scheduler to gracefully retire these idle workers (by address). The planner emits one
    action per node (the workers on one host), so that `expect` speaks of one machine."""

    addresses: tuple[str, ...]
    reason: str
    expect: tuple[Check, ...] = ()


@dataclass(frozen=True, slots=True)
class Cordon:
    """Stop the scheduler giving the node's worker new tasks, so that it empties and can be drained;
    its running tasks finish undisturbed. Writes `marks` first (the node's complete marks with
    `cordoned_since` set, filled in by the planner), so that a restart knows the worker was cordoned and
    not retired."""

    node_id: str
    hostname: str
    addresses: tuple[str, ...]
    reason: str
    expect: tuple[Check, ...] = ()
    marks: NodeMarks | None = None


@dataclass(frozen=True, slots=True)
class Uncordon:
    """Let a cordoned node's worker take new tasks again, then write `marks` (the node's complete marks
    with `cordoned_since` cleared, filled in by the planner)."""

    node_id: str
    hostname: str
    addresses: tuple[str, ...]
    reason: str
    marks: NodeMarks | None = None


@dataclass(frozen=True, slots=True)
class DrainNode:
    """Set an empty node's availability to drain, after writing `marks` (the node's complete new marks,
    None: unchanged): the node's update of the disruptive phase. Its marks wait for the drain: skipped
    with it (a drain's marks written without it would outlive a drain that did not happen)."""

    node_id: str
    hostname: str
    reason: str
    expect: tuple[Check, ...] = ()
    marks: NodeMarks | None = None


@dataclass(frozen=True, slots=True)
class Terminate:
    """Terminate instances (and remove their swarm nodes, if any). The planner emits one instance per
    action, so that `expect` speaks of one machine; `act` may batch several into one cloud call.
    `marks`: its node's complete new marks, `termination_started` set (filled in by the planner; None:
    nothing to write), written once the termination goes ahead, right before TerminateInstances, and
    taken back if that call fails: a termination skipped on its re-check leaves no mark (one left
    behind would end the machine later as "a termination that did not take")."""

    instance_ids: tuple[str, ...]
    reason: str
    node_ids: tuple[str, ...] = ()
    expect: tuple[Check, ...] = ()
    marks: NodeMarks | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop an instance into its type's warm pool (and remove its swarm node, so that no down node
    lingers). Disruptive like Terminate: one instance per action, `expect` re-checked and the host
    fenced right before; `act` may batch several into one cloud call."""

    instance_ids: tuple[str, ...]
    reason: str
    node_ids: tuple[str, ...] = ()
    expect: tuple[Check, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeUpdate:
    """A node's bookkeeping for one phase, written in ONE orchestrator call: `marks` is the node's
    complete new NodeMarks (its marks in the snapshot with the plan's changes applied; None: unchanged),
    `labels` the labels its instance was launched with that it lacks (other labels are kept). The
    planner emits at most one per node (`core.updates`); a node whose marks must wait for its drain
    carries them in its DrainNode instead, and a Cordon or Uncordon of the node carries the marks it
    leaves (its `cordoned_since` changed on top of these)."""

    node_id: str
    reason: str
    marks: NodeMarks | None = None
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RemoveNode:
    """Remove a swarm node whose machine is gone (terminated instance, or down too long)."""

    node_id: str
    hostname: str
    reason: str
    expect: tuple[Check, ...] = ()


Action = (
    ActivateNode
    | Launch
    | RetireWorkers
    | DrainNode
    | Terminate
    | NodeUpdate
    | RemoveNode
    | Cordon
    | Uncordon
    | Start
    | Stop
)


def fields_of(value: object) -> dict[str, object]:
    """The fields of an action or of NodeMarks, for logs and tables (an action's `reason` excluded)."""
    return {name: getattr(value, name) for name in getattr(type(value), "__slots__", ()) if name != "reason"}


@dataclass(frozen=True, slots=True)
class Held:
    """A machine whose disruption for `reason` ("empty", "consolidation", "drift", "expiry") the plan
    holds back, `by` a "budget" or "do-not-disrupt", and why."""

    hostname: str
    reason: str
    by: str
    why: str


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """A task no allowed instance type can ever run, with the reason."""

    task_key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What one tick decided. `actions` are in the order they should be carried out.

    `pending` counts the tasks waiting for capacity (unrunnable plus the estimated queue);
    `placed` maps each bucket name to how many pending tasks were virtually assigned there
    (`own-worker`: left queued on their busy worker, expected to start there within `tolerated_wait`).
    `halted`: why scale-down halts in this plan (the safety stop, `core.safety`; "" when it runs).
    `held`: the machines whose disruption this plan holds back (a budget, or do-not-disrupt).
    """

    actions: tuple[Action, ...] = ()
    unplaceable: tuple[Unplaceable, ...] = ()
    pending: int = 0
    placed: tuple[tuple[str, int], ...] = ()
    halted: str = ""
    held: tuple[Held, ...] = ()

    def of_kind(self, kind: type[Action]) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if isinstance(a, kind))

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for action in self.actions:
            key = type(action).__name__
            out[key] = out.get(key, 0) + (action.count if isinstance(action, Launch) else 1)
        return out
