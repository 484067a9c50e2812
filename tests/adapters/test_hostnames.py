"""Machines, swarm nodes and dask workers match whether the OS reports the short hostname (Ubuntu,
Debian: `ip-10-0-1-23`) or EC2's full private DNS name (Amazon Linux:
`ip-10-0-1-23.eu-west-1.compute.internal`). Each adapter translates what its service reports (EC2's
DescribeInstances record, docker's `GET /nodes` entry, a dask worker's name) and the core matches the
results; these records stand in for what those services return for one Amazon Linux machine. The e2e
suite runs the same on dockerd nodes, half of which take the full form (`MachineEmulator`)."""

from __future__ import annotations

import datetime as dt

import pytest
from tests.builders import NOW, make_policy, make_snapshot, make_worker

from swarm_autoscaler.adapters.dask import _HostnameMatcher
from swarm_autoscaler.adapters.ec2_support import HOSTNAME_TAG, to_instance
from swarm_autoscaler.adapters.hostnames import machine_hostname
from swarm_autoscaler.adapters.swarm import node_from_api
from swarm_autoscaler.core.cluster import classify

FULL = "ip-10-0-1-23.eu-west-1.compute.internal"


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (FULL, "ip-10-0-1-23"),
        ("ip-10-0-1-23", "ip-10-0-1-23"),
        ("i-0123456789abcdef0.eu-west-1.compute.internal", "i-0123456789abcdef0"),  # resource-name hosts
        ("10.0.1.23", "10.0.1.23"),  # an address has no label to cut
        ("", ""),
    ],
)
def test_machine_hostname(name: str, short: str) -> None:
    assert machine_hostname(name) == short


def _ec2_record(dns: str, tags: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "InstanceId": "i-0abc",
        "InstanceType": "m5.large",
        "State": {"Name": "running"},
        "LaunchTime": dt.datetime.fromtimestamp(NOW - 1000, dt.UTC),
        "PrivateDnsName": dns,
        "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()],
    }


def _docker_node(hostname: str) -> dict[str, object]:
    return {
        "ID": "n1",
        "Spec": {"Role": "worker", "Availability": "active", "Labels": {"swarm-autoscaler.ready": "true"}},
        "Description": {"Hostname": hostname},
        "Status": {"State": "ready"},
    }


@pytest.mark.parametrize("node_name", [FULL, "ip-10-0-1-23"])
def test_an_amazon_linux_machine_is_adopted_with_its_node_and_worker(node_name: str) -> None:
    """The node and the worker (named `{{.Node.Hostname}}`) report `node_name`; EC2 the full DNS name."""
    instance = to_instance(_ec2_record(FULL))
    terminated = to_instance(_ec2_record("", {HOSTNAME_TAG: FULL}))  # EC2 dropped the DNS name
    assert instance is not None and terminated is not None
    assert instance.hostname == terminated.hostname == "ip-10-0-1-23"
    node = node_from_api(_docker_node(node_name))
    worker_host = _HostnameMatcher(r"(?P<hostname>.+)")(node_name)
    worker = make_worker(1, host=worker_host)
    fleet = classify(
        make_snapshot(instances=[instance], nodes=[node], workers=[worker]), make_policy(("m5.large",))
    )
    [member] = fleet.active
    assert member.instance == instance and member.node == node and member.workers == (worker,)
    assert not fleet.broken and not fleet.disconnected and not fleet.unowned
