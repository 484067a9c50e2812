"""Contract tests of Ec2Cloud against a real moto server over HTTP (moto stands in for EC2's RunInstances,
DescribeInstances, TerminateInstances and DescribeInstanceTypes): launch, list, terminate, types."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import BOOT_SCRIPT, MANAGER, TOKEN, CloudFactory

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, OWNER_TAG, OWNER_VALUE
from swarm_autoscaler.adapters.ec2_support import HOSTNAME_TAG, node_labels, to_instance
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import OWNERSHIP_LABEL, InstanceState
from swarm_autoscaler.core.ports import Cloud
from swarm_autoscaler.errors import ConfigurationError, EndpointError
from swarm_autoscaler_lab.localcloud import LocalNetwork


async def _describe(raw_ec2: Any, instance_id: str) -> dict[str, Any]:
    result = await raw_ec2.describe_instances(InstanceIds=[instance_id])
    instance: dict[str, Any] = result["Reservations"][0]["Instances"][0]
    return instance


async def test_launch_tags_and_lists_owned_instances(
    make_cloud: CloudFactory, network: LocalNetwork, raw_ec2: Any
) -> None:
    cloud = await make_cloud()
    port: Cloud = cloud  # statically, and at run time below
    assert isinstance(port, Cloud)

    result = await cloud.launch("t3.micro", 2, {"pool": "cpu", "tier": "a"})

    assert result.error is None and result.refused == ()
    assert len(result.instances) == 2
    listed = await cloud.list_instances()
    assert {i.id for i in listed} == {i.id for i in result.instances}
    # spread over the zones by default: one in each of the first two subnets
    assert sorted(i.subnet_id for i in listed) == sorted(network.subnet_ids[:2])
    assert sorted(i.zone for i in listed) == ["us-east-1a", "us-east-1b"]
    for instance in listed:
        assert instance.type_name == "t3.micro"
        assert instance.state in (InstanceState.PENDING, InstanceState.RUNNING)
        assert instance.hostname.startswith("ip-10-0-") and "." not in instance.hostname
        assert instance.tags[OWNER_TAG] == OWNER_VALUE
        assert instance.tags[CLUSTER_TAG] == result.instances[0].tags[CLUSTER_TAG]
        assert instance.tags["team"] == "science"
        assert node_labels(instance.tags) == {"pool": "cpu", "tier": "a"}
        # what the planner gives the node: the launch's labels, and the ownership label its tags prove
        cluster = instance.tags[CLUSTER_TAG]
        assert instance.labels == {"pool": "cpu", "tier": "a", OWNERSHIP_LABEL: cluster}
    raw = await _describe(raw_ec2, result.instances[0].id)  # moto sets the profile on the first only
    assert raw["ImageId"] == network.ami_id
    assert raw["KeyName"] == network.key_name
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [network.security_group_id]
    assert raw["IamInstanceProfile"]["Arn"].endswith(f"/{network.instance_profile}")
    assert cloud.stats.launch_calls == 2  # one per subnet
    assert cloud.stats.instances_requested == 2
    assert cloud.stats.instances_launched == 2
    assert cloud.stats.api_calls["RunInstances"] == 2


async def test_user_data_runs_boot_script_then_joins_the_swarm(
    make_cloud: CloudFactory, raw_ec2: Any
) -> None:
    cloud = await make_cloud()
    (instance,) = (await cloud.launch("m5.large", 1, {})).instances

    attribute = await raw_ec2.describe_instance_attribute(InstanceId=instance.id, Attribute="userData")
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()

    assert user_data.startswith("#!/bin/bash\n")
    join = f"docker swarm join --token {TOKEN} {MANAGER}"
    assert BOOT_SCRIPT in user_data and join in user_data
    assert user_data.index(BOOT_SCRIPT) < user_data.index(join)


async def test_list_follows_pages(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud(page_size=5)
    launched = set()
    for _ in range(7):  # moto pages by reservation: one launch call = one reservation
        launched |= {i.id for i in (await cloud.launch("t3.micro", 1, {})).instances}

    listed = await cloud.list_instances()

    assert {i.id for i in listed} == launched and len(launched) == 7
    assert cloud.stats.api_calls["DescribeInstances"] == 2


async def test_instances_of_others_are_never_listed_nor_terminated(
    make_cloud: CloudFactory, network: LocalNetwork, raw_ec2: Any
) -> None:
    cloud = await make_cloud()
    other_cluster = await make_cloud()
    (mine,) = (await cloud.launch("t3.micro", 1, {})).instances
    (theirs,) = (await other_cluster.launch("t3.micro", 1, {})).instances
    untagged = await raw_ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        SubnetId=network.subnet_ids[0],
    )
    untagged_id = untagged["Instances"][0]["InstanceId"]

    assert [i.id for i in await cloud.list_instances()] == [mine.id]
    for foreign in (untagged_id, theirs.id):
        with pytest.raises(ConfigurationError, match=foreign):
            await cloud.terminate([mine.id, foreign])

    for instance_id in (mine.id, theirs.id, untagged_id):  # nothing was terminated, not even mine
        assert (await _describe(raw_ec2, instance_id))["State"]["Name"] in ("pending", "running")
    assert cloud.stats.api_calls["TerminateInstances"] == 0


async def test_terminate_is_idempotent_and_gone_ids_succeed(make_cloud: CloudFactory, raw_ec2: Any) -> None:
    cloud = await make_cloud()
    ids = [i.id for i in (await cloud.launch("t3.micro", 2, {})).instances]

    await cloud.terminate(ids)

    assert not [i for i in await cloud.list_instances() if i.alive]
    for instance_id in ids:
        assert (await _describe(raw_ec2, instance_id))["State"]["Name"] in ("shutting-down", "terminated")
    calls = cloud.stats.api_calls["TerminateInstances"]
    await cloud.terminate([*ids, "i-0123456789abcdef0"])  # already terminated, and never existed
    await cloud.terminate([])
    assert cloud.stats.api_calls["TerminateInstances"] == calls  # nothing left to terminate


async def test_terminate_goes_in_batches(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud()
    launched = await cloud.launch("t3.micro", 55, {})
    assert len(launched.instances) == 55

    await cloud.terminate([i.id for i in launched.instances])

    assert cloud.stats.api_calls["TerminateInstances"] == 2  # 50 + 5
    assert not [i for i in await cloud.list_instances() if i.alive]


async def test_instance_types_are_described_once_without_prices(make_cloud: CloudFactory) -> None:
    """EC2 returns no prices: the daemon prices the types from one source (`daemon.prices`)."""
    cloud = await make_cloud()

    types = await cloud.instance_types(["m5.large", "g4dn.xlarge", "m5.large"])
    again = await cloud.instance_types(["g4dn.xlarge"])

    assert [t.name for t in types] == ["m5.large", "g4dn.xlarge", "m5.large"]
    assert types[0].resources == CATALOGUE["m5.large"].resources and types[0].price_per_hour is None
    assert types[1].resources.gpus == 1 and types[1].resources.cpus == 4.0
    assert again == (types[1],)
    assert cloud.stats.api_calls["DescribeInstanceTypes"] == 1


async def test_unknown_instance_type_is_a_configuration_error(make_cloud: CloudFactory) -> None:
    cloud = await make_cloud()
    with pytest.raises(ConfigurationError, match=r"m5\.bogus"):
        await cloud.instance_types(["m5.large", "m5.bogus"])


async def test_catalogue_agrees_with_ec2(make_cloud: CloudFactory) -> None:
    """The bundled catalogue's capacities are EC2's (moto's data); p3 is not in moto's data."""
    cloud = await make_cloud()
    names = [name for name in CATALOGUE if not name.startswith("p3")]

    described = await cloud.instance_types(names)

    assert {t.name: t.resources for t in described} == {n: CATALOGUE[n].resources for n in names}
    with pytest.raises(ConfigurationError, match=r"p3\.2xlarge"):
        await cloud.instance_types(["p3.2xlarge"])


async def test_launching_a_bogus_type_is_an_error_not_a_refusal(make_cloud: CloudFactory) -> None:
    """moto runs with instance-type validation on, like EC2."""
    cloud = await make_cloud()

    result = await cloud.launch("m5.bogus", 1, {})

    assert result.instances == () and result.refused == ()
    assert result.error is not None and "InvalidInstanceType" in result.error
    assert cloud.unavailable(0.0) == ()


async def test_launch_reports_configuration_problems_as_data(make_cloud: CloudFactory) -> None:
    async def broken_join() -> tuple[str, str]:
        raise EndpointError("unix:///var/run/docker.sock", "connection refused")

    cloud = await make_cloud(join_command=broken_join)

    not_allowed = await cloud.launch("r5.large", 1, {})
    no_join = await cloud.launch("t3.micro", 1, {})
    too_many_tags = await cloud.launch("t3.micro", 1, {f"label{i}": "x" for i in range(60)})

    assert not_allowed.error is not None and "r5.large" in not_allowed.error
    assert no_join.error is not None and "docker.sock" in no_join.error
    assert too_many_tags.error is not None and "limit of 50" in too_many_tags.error
    assert cloud.stats.launch_calls == 0 and await cloud.list_instances() == ()


async def test_reserved_custom_tags_are_refused(make_cloud: CloudFactory) -> None:
    with pytest.raises(ConfigurationError, match="reserved"):
        await make_cloud(custom_tags={OWNER_TAG: "me"})


async def test_an_owned_instance_launched_without_the_ownership_label_gets_it_for_its_node(
    make_cloud: CloudFactory, network: LocalNetwork, raw_ec2: Any
) -> None:
    """A machine an older daemon launched (ownership tags, no ownership label tag): its EC2 tags prove
    it is ours, so its node is labelled as ours when it joins and can be scaled down."""
    cluster = "upgraded-cluster"
    cloud = await make_cloud(cluster_name=cluster)
    older = await raw_ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        SubnetId=network.subnet_ids[0],
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": OWNER_TAG, "Value": OWNER_VALUE},
                    {"Key": CLUSTER_TAG, "Value": cluster},
                    {"Key": "swarm-autoscaler/label/instance-type", "Value": "t3.micro"},
                ],
            }
        ],
    )
    older_id = older["Instances"][0]["InstanceId"]
    (listed,) = [i for i in await cloud.list_instances() if i.id == older_id]
    assert dict(listed.labels) == {"instance-type": "t3.micro", OWNERSHIP_LABEL: cluster}
    await cloud.terminate([older_id])


async def test_a_terminated_instance_is_listed_with_its_hostname_from_its_tag(
    make_cloud: CloudFactory, raw_ec2: Any
) -> None:
    """EC2 lists a terminated instance for about an hour, without its private DNS name: the hostname
    tagged at launch still names its machine, so a node that joined as it was terminated is recognised."""
    cloud = await make_cloud()
    (launched,) = (await cloud.launch("t3.micro", 1, {})).instances
    assert launched.hostname and cloud.stats.hostname_tag_failures == 0
    raw = await _describe(raw_ec2, launched.id)
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}[HOSTNAME_TAG] == launched.hostname
    await cloud.terminate([launched.id])
    (listed,) = await cloud.list_instances()
    assert listed.state in (InstanceState.SHUTTING_DOWN, InstanceState.TERMINATED)
    assert not listed.alive and listed.hostname == launched.hostname
    # the hostname from the tag alone, as EC2 describes a terminated instance
    raw["PrivateDnsName"] = ""
    raw["Tags"] = [*raw["Tags"]]
    assert to_instance(raw).hostname == launched.hostname  # type: ignore[union-attr]


async def test_replaced_boot_scripts_are_the_ones_launched(make_cloud: CloudFactory, raw_ec2: Any) -> None:
    cloud = await make_cloud()
    cloud.use_boot_scripts({"m5.large": "#!/bin/bash\necho described", "m9.unknown": "ignored"})
    (instance,) = (await cloud.launch("m5.large", 1, {})).instances

    attribute = await raw_ec2.describe_instance_attribute(InstanceId=instance.id, Attribute="userData")
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert "echo described" in user_data and BOOT_SCRIPT not in user_data
    refused = await cloud.launch("m9.unknown", 1, {})  # a name that is not allowed is not added
    assert not refused.instances and "not among the allowed types" in str(refused.error)
