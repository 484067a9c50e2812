"""The local EC2 records which IAM actions the product's own requests need (the input of the IAM policy's
audit in tests/audit), and only the product's: the lab's helper clients are not counted."""

from __future__ import annotations

from pathlib import Path

import botocore.session
import pytest
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, join_command

from swarm_autoscaler.adapters.ec2 import Ec2Cloud
from swarm_autoscaler_lab.localcloud import MotoServer, provision_network
from swarm_autoscaler_lab.localcloud.aws_actions import AWS_ACTION_LOG_ENV, actions_of, read_action_log


def test_a_launch_with_an_instance_profile_also_needs_pass_role() -> None:
    assert actions_of("RunInstances", {"IamInstanceProfile.Arn": "arn:aws:iam::1:instance-profile/x"}) == {
        "ec2:RunInstances",
        "iam:PassRole",
    }
    assert actions_of("RunInstances", {"InstanceType": "m5.large"}) == {"ec2:RunInstances"}


async def test_the_product_s_requests_are_recorded_once_each_and_the_lab_s_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "actions.log"
    monkeypatch.setenv(AWS_ACTION_LOG_ENV, str(log))
    with MotoServer() as server:
        network = provision_network(server.endpoint)  # the lab's client: many actions, none recorded
        lab = botocore.session.get_session().create_client(
            "ec2", region_name=network.region, endpoint_url=server.endpoint,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        )  # fmt: skip
        lab.describe_regions()
        async with Ec2Cloud(
            cluster_name="audit",
            region=network.region,
            endpoint=server.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            allowed_types={"m5.large": (network.ami_id, "")},
            subnet_ids=network.subnet_ids,
            security_group_ids=[network.security_group_id],
            join_command=join_command,
        ) as cloud:
            await cloud.list_instances()
            await cloud.list_instances()
            await cloud.instance_types(["m5.large"])

    lines = log.read_text().splitlines()
    assert sorted(lines) == ["ec2:DescribeInstanceTypes", "ec2:DescribeInstances"]
    assert read_action_log(log) == set(lines)
