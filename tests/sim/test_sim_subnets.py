"""The simulator's cloud follows the EC2 adapter's rule for capacity refusals: a refusal blocks its
(type, subnet) only, launches go to the subnets still open, and the planner keeps the type while one
is open."""

from __future__ import annotations

import asyncio
import dataclasses

from tests.sim.test_sim_world import CATALOGUE, KNOBS

from swarm_autoscaler.config.settings import TimingSettings
from swarm_autoscaler_lab.sim.config import SimEc2Settings, build_sim_settings
from swarm_autoscaler_lab.sim.engine import Ours, simulate
from swarm_autoscaler_lab.sim.faults import ScriptedFaults
from swarm_autoscaler_lab.sim.runner import default_options
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import EPOCH, SimCloud, World

SUBNETS = ("subnet-a", "subnet-b")


async def test_a_refused_subnet_is_skipped_and_the_others_launch() -> None:
    faults = ScriptedFaults(refused_in=frozenset({("m5.large", "subnet-a")}))
    world = World(CATALOGUE, {}, {}, KNOBS, faults)
    cloud = SimCloud(world, SUBNETS)
    first = await cloud.launch("m5.large", 2, {})
    assert [i.subnet_id for i in first.instances] == ["subnet-b", "subnet-b"]
    assert [(u.subnet_id, u.until) for u in first.refused] == [("subnet-a", EPOCH + 30)]
    assert world.launch_calls == 2
    second = await cloud.launch("m5.large", 1, {})  # subnet-a is in back-off: not even tried
    assert [i.subnet_id for i in second.instances] == ["subnet-b"] and second.refused == ()
    assert world.launch_calls == 3
    refused_everywhere = ScriptedFaults(refused_in=frozenset({("m5.large", s) for s in SUBNETS}))
    cloud = SimCloud(World(CATALOGUE, {}, {}, KNOBS, refused_everywhere), SUBNETS)
    both = await cloud.launch("m5.large", 1, {})
    assert both.instances == () and {u.subnet_id for u in both.refused} == set(SUBNETS)


def test_a_simulated_run_keeps_the_cheap_type_while_one_subnet_has_capacity() -> None:
    ec2 = SimEc2Settings.model_validate(
        {"allowed_types": {"m5.large": {}, "m5.xlarge": {}}, "max_instances": 4}
    )
    settings = build_sim_settings(TimingSettings(poll_interval=10.0), ec2)
    policy = dataclasses.replace(settings.policy, subnets=SUBNETS)
    jobs = tuple(Job(i, 10.0 * i, 120.0, 1.0, 2.0, 0) for i in range(4))
    runs = {}
    for name, refused in (("one zone refuses", {"subnet-a"}), ("every zone refuses", set(SUBNETS))):
        faults = ScriptedFaults(refused_in=frozenset(("m5.large", s) for s in refused))
        run = asyncio.run(
            simulate(jobs, policy, settings.catalogue, Ours(), default_options(settings), faults)
        )
        assert run.finished, name
        runs[name] = sorted({i.type_name for i in run.world.instances.values()})
    assert runs == {"one zone refuses": ["m5.large"], "every zone refuses": ["m5.xlarge"]}
