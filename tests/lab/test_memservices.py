"""The dynamic demo's in-memory services: swarm's placement rules, and JSON the daemon's own swarm services
adapter reads back into the same values it reads from a real engine."""

from __future__ import annotations

import asyncio

from swarm_autoscaler.adapters.swarm_services import resources_of, task_from_api
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import GIB, Availability, NodeStatus, Resources
from swarm_autoscaler_lab.localcloud.memservices import MemoryServices
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.sim.servicetrace import ServiceSpec

GPU = ServiceSpec("viewer", 2.0, 8.0, 1, ("node.labels.instance-type==g4dn.xlarge",))
WEB = ServiceSpec("web", 1.5, 2.0, 0)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make() -> tuple[MemorySwarm, MemoryServices, Clock]:
    swarm = MemorySwarm(cluster_name="demo")
    types = {"h-large": "m5.large", "h-gpu": "g4dn.xlarge"}
    clock = Clock()
    services = MemoryServices(swarm, types.get, CATALOGUE, clock=clock)
    swarm.join("h-large", swarm.join_token, {"instance-type": "m5.large"})
    swarm.join("h-gpu", swarm.join_token)  # not labelled yet: the GPU constraint does not match
    return swarm, services, clock


def test_tasks_go_where_their_constraints_and_room_allow() -> None:
    swarm, services, clock = make()
    services.scale(WEB, 2)
    services.scale(GPU, 1)
    services.step()
    where = {
        t.spec.name: sorted(x.hostname for x in services.tasks.values() if x.spec.name == t.spec.name)
        for t in services.tasks.values()
    }
    assert where == {"web": ["h-gpu", "h-large"], "viewer": [""]}  # spread; the GPU node lacks its label
    gpu_node = next(n for n in swarm.nodes.values() if n.hostname == "h-gpu")
    asyncio.run(swarm.add_labels(gpu_node.id, {"instance-type": "g4dn.xlarge"}))
    clock.t = 1.0
    services.step()
    viewer = next(t for t in services.tasks.values() if t.spec.name == "viewer")
    assert viewer.hostname == "h-gpu" and viewer.state == "assigned"
    assert [t.state for t in services.tasks.values() if t.spec.name == "web"] == ["running", "running"]
    clock.t = 2.0
    services.step()
    assert viewer.state == "running" and services.waits == [
        1.0,
        1.0,
        2.0,
    ]  # created at 0, placed once labelled


def test_a_drained_node_loses_its_task_and_it_is_counted() -> None:
    swarm, services, _ = make()
    services.scale(WEB, 1)
    services.step()
    (task,) = services.tasks.values()
    node = swarm.nodes[task.node_id]
    asyncio.run(swarm.set_availability(node.id, Availability.PAUSE))
    services.step()
    assert not services.disruptions and task.id in services.tasks  # paused: it stays
    asyncio.run(swarm.set_availability(node.id, Availability.DRAIN))
    services.step()
    assert len(services.disruptions) == 1 and "drained" in services.disruptions[0]
    (again,) = services.tasks.values()  # re-created and placed on the other node
    assert again.id != task.id and again.hostname == "h-gpu"
    swarm.set_status("h-gpu", NodeStatus.DOWN)
    services.step()
    assert len(services.disruptions) == 2 and "down" in services.disruptions[1]


def test_the_json_reads_back_through_the_adapter() -> None:
    _, services, _ = make()
    services.scale(GPU, 1)
    services.scale(WEB, 1)
    services.step()
    by_id = {s["ID"]: s for s in services.services_json()}
    tasks = {t.service: t for t in (task_from_api(raw, by_id) for raw in services.tasks_json())}
    assert tasks["viewer"].needs == Resources.of(2.0, 8 * GIB, 1)
    assert tasks["viewer"].constraints == GPU.constraints and tasks["viewer"].waiting
    assert tasks["web"].needs == Resources.of(1.5, 2 * GIB) and tasks["web"].on_node
    assert not tasks["web"].global_service and not tasks["web"].ours
    reported = services.node_resources("h-gpu")
    assert reported is not None and resources_of(reported) == CATALOGUE["g4dn.xlarge"].resources
    assert services.node_resources("unknown") is None
