"""A capacity refusal blocks its (type, subnet) only: a type is out of the plan while every subnet it
could launch in is in back-off, no sooner (backoff.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.builders import NOW, launch_reason, make_policy, make_snapshot, make_tasks

from swarm_autoscaler.core.actions import Launch, Plan
from swarm_autoscaler.core.backoff import CapacityBackoff, launch_subnets, refused_types
from swarm_autoscaler.core.model import Unavailable
from swarm_autoscaler.core.plan import plan

SUBNETS = ("subnet-a", "subnet-b", "subnet-c")
POLICY = replace(make_policy(), subnets=SUBNETS)


def launch(type_name: str) -> Plan:
    return Plan((Launch(type_name, 1, launch_reason(1, type_name)),), pending=1, placed=(("new", 1),))


def refused(*subnets: str, until: float = NOW + 180) -> list[Unavailable]:
    return [Unavailable("m5.large", until, s) for s in subnets]


@pytest.mark.parametrize(
    ("refusals", "expected"),
    [
        pytest.param(refused("subnet-a"), "m5.large", id="refused in one subnet: still the cheapest"),
        pytest.param(refused("subnet-a", "subnet-b"), "m5.large", id="one subnet open is enough"),
        pytest.param(refused(*SUBNETS), "m5.xlarge", id="refused in every subnet: the next best"),
        pytest.param(
            [*refused("subnet-a", "subnet-b"), *refused("subnet-c", until=NOW)],
            "m5.large",
            id="the last subnet's back-off expired",
        ),
        pytest.param(
            refused("subnet-a", "subnet-b", "subnet-old"), "m5.large", id="a subnet no longer configured"
        ),
    ],
)
def test_a_type_is_out_only_while_every_subnet_refuses_it(refusals: list[Unavailable], expected: str) -> None:
    snapshot = make_snapshot(unrunnable=make_tasks(1), unavailable=refusals)
    assert plan(snapshot, POLICY) == launch(expected)


def test_without_configured_subnets_one_refusal_blocks_the_type() -> None:
    """No subnets: EC2 picks the subnet, so its one refusal ("") is a refusal everywhere we can launch."""
    snapshot = make_snapshot(unrunnable=make_tasks(1), unavailable=[Unavailable("m5.large", NOW + 30)])
    assert plan(snapshot, make_policy()) == launch("m5.xlarge")


def test_refused_types_and_open_subnets() -> None:
    assert launch_subnets(()) == ("",)
    assert launch_subnets(("b", "a", "b")) == ("b", "a")
    refusals = [
        Unavailable("x", NOW + 1, "a"),
        Unavailable("x", NOW + 1, "b"),
        Unavailable("y", NOW + 1, "a"),
    ]
    assert refused_types(refusals, ("a", "b"), NOW) == {"x"}
    assert refused_types(refusals, ("a", "b"), NOW + 1) == set()
    backoff = CapacityBackoff(30.0, 120.0)
    backoff.refused("x", "a", NOW)
    assert backoff.open_subnets("x", ("a", "b"), NOW) == ("b",)
    assert backoff.open_subnets("x", ("a", "b"), NOW + 30) == ("a", "b")
    assert backoff.open_subnets("y", ("a", "b"), NOW) == ("a", "b")
