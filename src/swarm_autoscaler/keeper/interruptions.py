"""The keeper's clusters and EC2's interruption notices.

A cluster's autoscaler holds no queue of its own: with `AUTOSCALER_KEEPER_INTERRUPTION_QUEUE_URL` set, the
keeper long-polls the account's interruption queue (`adapters.ec2_interruptions.SqsInterruptions`, as the
daemon does) and tags each worker of its clusters that a notice names; the cluster's autoscaler reads the
tag with its instances through the keeper's listing (`keeper.listing`), and its planner handles the
notice as the daemon's does (core/interrupt.py: a warning replaces and lets go, a rebalance
recommendation cordons and replaces early). Every replica polls: the tag, not the poller, carries the
notice. A failing poll is logged and retried; the keeper's start checks that the queue can be read.
"""

from __future__ import annotations

import asyncio
import contextlib

from swarm_autoscaler.adapters.ec2_interruptions import SqsInterruptions
from swarm_autoscaler.config.keeper import KeeperConfig
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries

SETTING = "AUTOSCALER_KEEPER_INTERRUPTION_QUEUE_URL"


async def read_interruptions(
    stack: contextlib.AsyncExitStack, hosts: Ec2Primaries, config: KeeperConfig
) -> None:
    """Start polling the queue in the background for as long as `stack` lives (nothing when unset)."""
    url = config.keeper.interruption_queue_url
    if not url:
        return
    ec2 = config.ec2
    reader = SqsInterruptions(
        queue_url=url,
        cloud=hosts,
        region=ec2.region,
        access_key_id=None if ec2.access_key_id is None else ec2.access_key_id.get_secret_value(),
        secret_access_key=None if ec2.secret_access_key is None else ec2.secret_access_key.get_secret_value(),
    )
    await stack.enter_async_context(reader)
    try:
        await reader.check()
    except EndpointError as exc:
        raise EndpointError(exc.endpoint, exc.detail, SETTING) from None
    task = asyncio.create_task(reader.run(), name="keeper-interruption-queue")

    async def _stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(_stop)
