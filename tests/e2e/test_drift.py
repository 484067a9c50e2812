"""End to end on the local cloud with real dockerd swarm nodes: an operator changes a type's AMI under load
(a security patch) and the busy fleet rolls to it, replacement first, one machine at a time (a drift budget
of 1), never disrupting a busy machine and never touching one labelled do-not-disrupt.

The daemon is the real one (`lc.daemon()`, built from settings as `swarm-autoscaler run` builds it), against
moto over HTTP (which stands in for EC2: the AMI is an image registered there, each instance's ImageId is
what RunInstances sent), a real dask scheduler and a real dockerd swarm. Every machine boots as EC2 boots it
(the `real_boot` fixture): its own user data on its own dockerd node, its worker the worker service's task.
The operator's moves are the operator's tools: `docker node update --label-add` on the manager, and the
daemon restarted with new settings. The jobs wait on dask Events the test sets, so each phase takes only as
long as the daemon needs, not a guessed sleep.
"""

from __future__ import annotations

import pytest
from tests.daemon.test_drift_roll import roll_to_a_new_ami
from tests.e2e.helpers import REAL_BOOT

from swarm_autoscaler.core.budgets import DO_NOT_DISRUPT_LABEL
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud

pytestmark = [*REAL_BOOT, pytest.mark.timeout(420)]


async def test_a_new_ami_rolls_the_busy_fleet_one_at_a_time_replacement_first_sparing_do_not_disrupt(
    cloud: LocalCloud, foreign_instance: str
) -> None:
    manager = cloud.local_swarm.manager

    async def label(node_id: str, on: bool) -> None:
        """As an operator does it, on the swarm's manager."""
        change = (
            ("--label-add", f"{DO_NOT_DISRUPT_LABEL}=true") if on else ("--label-rm", DO_NOT_DISRUPT_LABEL)
        )
        await manager.docker("node", "update", *change, node_id)

    await roll_to_a_new_ami(cloud, foreign_instance, label)
