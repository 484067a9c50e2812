"""The real loop and EC2 adapter over moto servers whose clocks disagree with this host's by up to an
hour either way: every decision is the one taken with the clocks in agreement.

Each skew runs against its own moto server (its fault injector skews its Date header and LaunchTime),
all at once, so the real seconds the scenario needs are spent once; moto's backend is process-wide, so
they share the session's network. The scenario: a pending task
launches a machine; the next tick must not find it "broken" (a host an hour ahead used to); a machine
that never joins must be terminated as broken once `max_start_time` has passed on EC2's clock (a host
an hour behind used to wait an hour more).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time

from tests.adapters.ec2.ec2_helpers import BOOT_SCRIPT, join_command
from tests.fakes import CATALOGUE, FakeLock, FakeWorkload, small_policy

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler.core.model import GIB, Resources, Task
from swarm_autoscaler.daemon.loop import Daemon, InFlightCloud
from swarm_autoscaler.daemon.tick import Ports, TickResult
from swarm_autoscaler_lab.localcloud import LocalNetwork, MotoServer
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.localcloud.moto_server import LOCAL_ACCESS_KEY, LOCAL_SECRET_KEY

SKEWS = (-3600.0, -600.0, 600.0, 3600.0)  # EC2's clock minus this host's
# LaunchTime carries whole seconds and the clock is within about half a second of EC2's (more on a
# loaded machine): a 4 s start time cannot be mistaken for a fraction of a second, nor 6 s for 4 s.
MAX_START = 4.0
WAIT = MAX_START + 2.0
_clusters = itertools.count(1)


def decisions(result: TickResult | None) -> list[str]:
    assert result is not None and result.acted
    return sorted(f"{type(a).__name__}:{getattr(a, 'type_name', '')}" for a in result.plan.actions)


async def scenario(skew: float, network: LocalNetwork) -> tuple[list[list[str]], list[float]]:
    """The decisions of three ticks, and by how much each tick's `now` was further from EC2's real time
    than the clock's own uncertainty said."""
    with MotoServer() as server:
        server.faults.skew_clock(skew)
        async with Ec2Cloud(
            cluster_name=f"skew-{next(_clusters)}",
            region=network.region,
            endpoint=server.endpoint,
            access_key_id=LOCAL_ACCESS_KEY,
            secret_access_key=LOCAL_SECRET_KEY,
            allowed_types={name: (network.ami_id, BOOT_SCRIPT) for name in CATALOGUE},
            subnet_ids=network.subnet_ids,
            security_group_ids=[network.security_group_id],
            join_command=join_command,
        ) as ec2:
            await ec2.instance_types(list(CATALOGUE))  # what open_daemon does first: syncs the clock
            # A settled daemon's clock: on this loaded test machine the first answers can take seconds,
            # which leaves EC2's time loosely bounded until quick ones narrow it (as every tick does).
            for _ in range(20):
                if (ec2.ec2_clock.uncertainty() or 9.0) <= 0.6:
                    break
                await ec2.list_instances()
            workload = FakeWorkload(unrunnable=[Task("t1", Resources(1, GIB))])
            daemon = Daemon(
                cluster_name="skew",
                ports=Ports(InFlightCloud(ec2), MemorySwarm(), workload),
                lock=FakeLock("a"),
                policy=dataclasses.replace(small_policy(5), max_start_time=MAX_START),
                catalogue=CATALOGUE,
                poll_interval=1.0,
            )
            results: list[TickResult | None] = []
            errors: list[float] = []
            for pause in (0.0, 0.0, WAIT):
                await asyncio.sleep(pause)
                started = time.time()
                results.append(await daemon.tick_once())
                error = results[-1].snapshot.now - (started + skew) if results[-1] else float("nan")
                errors.append(abs(error) - (ec2.ec2_clock.uncertainty() or 0.0))
            return [decisions(r) for r in results], errors


async def test_a_skew_of_up_to_an_hour_either_way_changes_no_decision(network: LocalNetwork) -> None:
    runs = await asyncio.gather(*(scenario(skew, network) for skew in SKEWS))
    expected = [
        ["Launch:m5.large"],  # the pending task buys a machine
        [],  # just launched: in flight, neither broken nor launched again
        ["Launch:m5.large", "Terminate:"],  # never joined within max_start_time: broken, replaced
    ]
    for skew, (got, errors) in zip(SKEWS, runs, strict=True):
        assert got == expected, f"EC2's clock {skew:+g}s from the host's: {got}"
        assert all(e < 1.0 for e in errors), (
            f"skew {skew:+g}s: tick clocks off by more than they knew: {errors}"
        )
