"""Re-checking a disruptive action against a fresh read, right before it runs. Pure; used by `act`.

The plan was made on a snapshot that is seconds old (under load, tens of seconds) when its actions
run: a machine planned as broken may have joined since, a worker planned as idle may have received
tasks. Each disruptive action carries in `expect` the checks it was planned on (see the check types
in `model`); `violations(action, fresh)` says which of them no longer hold on `fresh`, a read of the
swarm nodes and the scheduler's workers taken just before the action. An action with a violation is
skipped, and the next tick plans again from what is then true.

A check fails closed: anything it cannot confirm (a node missing from a read that should show it) is
a violation, except where absence is what is checked (`NotJoined`, `NodeDown`, `NoWorker`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from swarm_autoscaler.core.actions import (
    Action,
    Check,
    HostIdle,
    NodeDown,
    NodeOurs,
    NodePaused,
    NoTasks,
    NothingWaits,
    NotJoined,
    NoWorker,
    Retired,
)
from swarm_autoscaler.core.model import Availability, Node, NodeStatus, Worker


@dataclass(frozen=True)
class Fresh:
    """A read of the swarm nodes and the scheduler's workers taken right before acting."""

    nodes: tuple[Node, ...]
    workers: tuple[Worker, ...]

    @property
    def nodes_by_id(self) -> Mapping[str, Node]:
        return {n.id: n for n in self.nodes}

    @property
    def hostnames(self) -> frozenset[str]:
        return frozenset(n.hostname for n in self.nodes)

    @property
    def workers_by_host(self) -> Mapping[str, tuple[Worker, ...]]:
        out: dict[str, list[Worker]] = defaultdict(list)
        for w in self.workers:
            out[w.hostname].append(w)
        return {host: tuple(ws) for host, ws in out.items()}


def violated(check: Check, fresh: Fresh) -> str | None:
    """Why `check` no longer holds on `fresh`, or None when it holds."""
    match check:
        case HostIdle(hostname=host) | NoTasks(hostname=host):
            results = isinstance(check, HostIdle)  # NoTasks allows results (retire_workers moves them)
            busy = [
                w.name for w in fresh.workers_by_host.get(host, ()) if (w.busy if results else w.processing)
            ]
            what = "work or unique results" if results else "work"
            return f"worker {', '.join(busy)} on {host} has {what} now" if busy else None
        case NoWorker(hostname=host):
            names = [w.name for w in fresh.workers_by_host.get(host, ())]
            return f"a worker connected on {host} since the plan ({', '.join(names)})" if names else None
        case NotJoined(hostname=host):
            return f"{host} joined the swarm since the plan" if host in fresh.hostnames else None
        case NodeOurs(node_id=node_id):
            return _not_ours(fresh.nodes_by_id.get(node_id), node_id)
        case NodePaused(node_id=node_id):
            return _not_paused(fresh.nodes_by_id.get(node_id), node_id)
        case NodeDown(node_id=node_id):
            node = fresh.nodes_by_id.get(node_id)
            if node is not None and node.status == NodeStatus.READY:
                return f"node {node_id} ({node.hostname}) is ready again"
            return None
        case NothingWaits(hostname=host):
            waiting = sum(
                1 for w in fresh.workers_by_host.get(host, ()) for t in w.processing if not t.executing
            )
            return f"{waiting} task(s) now wait on the worker of {host}" if waiting else None
        case Retired(hostname=host):
            kept = [w.name for w in fresh.workers_by_host.get(host, ()) if not w.retiring]
            return f"the scheduler kept worker {', '.join(kept)} on {host}" if kept else None
    raise AssertionError(f"unknown check {check!r}")  # pragma: no cover - exhaustive above


def _not_ours(node: Node | None, node_id: str) -> str | None:
    """Why a node is not (or no longer) ours (`NodeOurs`), or None."""
    if node is None:
        return f"node {node_id} is no longer in the swarm"
    if node.is_manager or not node.ours:
        return f"node {node_id} ({node.hostname}) does not carry our ownership label"
    return None


def _not_paused(node: Node | None, node_id: str) -> str | None:
    """Why a node to take in (`NodePaused`) is no longer one, or None."""
    if node is None:
        return f"node {node_id} is no longer in the swarm"
    if node.status != NodeStatus.READY or node.availability != Availability.PAUSE:
        return (
            f"node {node_id} ({node.hostname}) is {node.status}/{node.availability} now, not ready and paused"
        )
    if node.marks.ready or node.marks.termination_started is not None:
        return f"node {node_id} ({node.hostname}) was taken in or its termination began since the plan"
    return None


def violations(action: Action, fresh: Fresh) -> tuple[str, ...]:
    """Every reason `action`'s expectations fail on `fresh` (empty: safe to carry out)."""
    expect: tuple[Check, ...] = getattr(action, "expect", ())
    return tuple(reason for check in expect if (reason := violated(check, fresh)) is not None)
