"""Fencing the hosts of the terminations right before the EC2 call: the last re-check, made atomic.

`act` re-checks every disruptive action on a fresh read, but between that read and TerminateInstances
(seconds: the ownership check EC2 does first, a slow API) a machine planned as broken can join, its
worker connect and the scheduler hand it tasks. So, as Kubernetes taints a node before it re-checks and
deletes it, `act` first fences the hosts of its terminations (`Workload.fence`: one atomic scheduler
call; from then on no worker there, connected now or later, gets a task), re-checks each Terminate
against the workers the fence saw at that instant, and terminates only the machines that are still
idle. A host the fence refused (a busy worker there) skips its Terminate. The hosts whose termination
is then skipped, or fails, are unfenced at once; a fence nobody lifts (the daemon was killed in
between) expires on the scheduler after minutes.

Stops into the warm pool are fenced the same way (a stopped machine's worker dies as a terminated
one's does). Drains and node removals are not fenced: a drained node can be activated again within the fence's
lifetime (its new worker would stay cordoned), and a removed node is already down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence

from swarm_autoscaler.core.actions import Action, Stop, Terminate
from swarm_autoscaler.core.ports import Workload
from swarm_autoscaler.core.recheck import Fresh, violations

HostsOf = Callable[[Action], set[str]]
Ending = Terminate | Stop  # a Stop into the warm pool is fenced exactly as a termination


async def fence_terminations(
    workload: Workload,
    terminations: Sequence[Ending],
    fresh: Fresh,
    hosts_of: HostsOf,
    within: float | None,
) -> tuple[list[tuple[Ending, str]], list[Ending], str]:
    """Fence the hosts of `terminations` in one call, then re-check each on that call's workers (the
    nodes come from `fresh`). Returns (skipped, each with its reasons; those to carry out; a note on
    the fence for the log). Fails
    closed: when the fence cannot be confirmed (error, or no time left), every termination is skipped
    and the hosts are unfenced (best effort: the call may have taken effect)."""
    hosts = sorted({h for a in terminations for h in hosts_of(a)})
    try:
        async with asyncio.timeout(within):
            fence = await workload.fence(hosts)
    except Exception as exc:  # any adapter failure (or the deadline) is data; the loop never dies
        why = (
            "the tick's deadline passed" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        )
        await unfence(workload, hosts)
        return [(a, f"could not fence its host before terminating ({why})") for a in terminations], [], ""
    seen = Fresh(fresh.nodes, fence.workers)
    refused = set(fence.refused)
    skipped: list[tuple[Ending, str]] = []
    runnable: list[Ending] = []
    for action in terminations:
        reasons = violations(action, seen)
        reasons += tuple(
            f"the fence refused {host}: a worker there is busy" for host in sorted(hosts_of(action) & refused)
        )
        if reasons:
            skipped.append((action, "; ".join(reasons)))
        else:
            runnable.append(action)
    await unfence(workload, lifted([a for a, _ in skipped], runnable, hosts_of))
    kept = {h for a in runnable for h in hosts_of(a)}
    note = (
        f"{len(kept)} host(s) fenced first, {sum(w.hostname in kept for w in fence.workers)} worker(s) there"
    )
    return skipped, runnable, note


def lifted(dropped: Iterable[Action], kept: Iterable[Action], hosts_of: HostsOf) -> list[str]:
    """The hosts of the `dropped` actions that no `kept` action still needs fenced."""
    still = {h for a in kept for h in hosts_of(a)}
    return sorted({h for a in dropped for h in hosts_of(a)} - still)


async def unfence(workload: Workload, hosts: Sequence[str]) -> None:
    """Lift these fences, best effort: a fence left in place expires on the scheduler."""
    if hosts:
        with contextlib.suppress(Exception):
            await workload.unfence(hosts)
