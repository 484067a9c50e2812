"""The user data as it leaves the process, read as EC2 reads it: each request's body is captured as it
arrives over HTTP (the fault injector's call log, in front of moto), its `UserData` (RunInstances) or
`UserData.Value` (ModifyInstanceAttribute) is base64-decoded once, strictly, as EC2 does, and what
remains must be what cloud-init runs (a `#!` script, or MIME whose shell part holds the join).

Stands in for: EC2's API decoding the blob, and cloud-init on a real AMI reading the stored value. No
assertion here reads the value back through moto (moto decodes ModifyInstanceAttribute's blob twice;
`localcloud.moto_user_data` makes the local cloud store it as EC2 does, checked last)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import (
    ACCESS_KEY,
    BOOT_SCRIPT,
    MANAGER,
    SECRET_KEY,
    TOKEN,
    CloudFactory,
    join_command,
)

from swarm_autoscaler.adapters.ec2_support import POOL_STOP_LINE
from swarm_autoscaler_lab.localcloud import FaultInjector
from swarm_autoscaler_lab.localcloud.moto_user_data import as_ec2_decodes
from swarm_autoscaler_lab.localcloud.userdata import user_data_scripts

JOIN = f"docker swarm join --token {TOKEN} {MANAGER}"


def _sent(faults: FaultInjector, action: str, key: str) -> list[str]:
    """The user data of every `action` request since `faults.record()`, decoded once as EC2 does."""
    return [as_ec2_decodes(call.params[key]) for call in faults.recorded() if call.action == action]


async def test_a_launch_sends_the_script_encoded_once(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    cloud = await make_cloud()
    faults.record()
    await cloud.launch("m5.large", 1, {})
    [text] = _sent(faults, "RunInstances", "UserData")
    assert text.startswith("#!/bin/bash\n")
    [script] = user_data_scripts(text)  # what cloud-init runs
    assert BOOT_SCRIPT in script and JOIN in script and script.index(BOOT_SCRIPT) < script.index(JOIN)


async def test_a_pool_launch_sends_multipart_encoded_once(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    cloud = await make_cloud()
    faults.record()
    await cloud.launch("m5.large", 1, {}, pool=True)
    [text] = _sent(faults, "RunInstances", "UserData")
    assert text.startswith("Content-Type: multipart/mixed")
    [script] = user_data_scripts(text)
    assert BOOT_SCRIPT in script and POOL_STOP_LINE in script and "swarm join" not in script


async def test_the_pools_rewrite_sends_the_join_encoded_once(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    """The warm pool's ModifyInstanceAttribute before StartInstances: once doubly encoded, EC2 stored
    base64 text and cloud-init ran nothing on the started machine."""
    cloud = await make_cloud()
    [inst] = (await cloud.launch("m5.large", 1, {})).instances
    await cloud.stop_instances([inst.id])
    faults.record()
    result = await cloud.start_instances([inst.id])
    assert [i.id for i in result.instances] == [inst.id]
    [text] = _sent(faults, "ModifyInstanceAttribute", "UserData.Value")
    assert text.startswith("Content-Type: multipart/mixed") and "[scripts-user, always]" in text
    [script] = user_data_scripts(text)
    assert script.startswith("#!/bin/bash\n") and JOIN in script
    assert script.index("docker swarm leave --force") < script.index(JOIN)


@pytest.mark.parametrize("encoded_twice", [False, True])
async def test_the_local_ec2_stores_a_rewrite_as_ec2_does(
    make_cloud: CloudFactory, raw_ec2: Any, encoded_twice: bool
) -> None:
    """The local cloud's moto (patched by `moto_user_data`): the correctly encoded rewrite is accepted
    and read back as the script; a doubly encoded one is stored as the base64 text it decodes to, so a
    machine booting from it runs nothing, as on a real AMI."""
    cloud = await make_cloud()
    [inst] = (await cloud.launch("m5.large", 1, {})).instances
    await raw_ec2.stop_instances(InstanceIds=[inst.id])
    script = b"#!/bin/sh\necho rewritten\n"
    value = base64.b64encode(script) if encoded_twice else script  # botocore encodes the blob once more
    await raw_ec2.modify_instance_attribute(InstanceId=inst.id, UserData={"Value": value})
    attr = await raw_ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")
    stored = base64.b64decode(attr["UserData"]["Value"])
    assert stored == value
    assert user_data_scripts(attr["UserData"]["Value"]) == ([] if encoded_twice else [script.decode()])


async def test_the_daemons_launch_logs_in_to_ecr_before_the_pull_and_the_join(
    moto_server: Any, network: Any, faults: FaultInjector, tmp_path: Path
) -> None:
    """`AUTOSCALER_EC2_PULL_IMAGES` with an ECR image, through the daemon's own wiring (settings ->
    `daemon.app._ec2`): the user data of a launch, as EC2 decodes it, logs in to that ECR registry with
    the instance role (the AWS CLI, `aws ecr get-login-password`), then pulls, after the type's boot script
    and before the join. Stands in for ECR and the AMI's AWS CLI: the lines are only read here; they are
    run with stand-ins in tests/adapters/test_boot_scripts.py."""
    from swarm_autoscaler.config.settings import load_settings
    from swarm_autoscaler.daemon.app import _ec2

    ecr = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/dask-worker:1.4.0"
    env = {
        "AUTOSCALER_CLUSTER_NAME": "ecr-wire",
        "AUTOSCALER_DASK_SCHEDULER_URL": "tcp://127.0.0.1:8786",
        "AUTOSCALER_EC2_ENDPOINT": moto_server.endpoint,
        "AUTOSCALER_EC2_REGION": network.region,
        "AUTOSCALER_EC2_ACCESS_KEY_ID": ACCESS_KEY,
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY": SECRET_KEY,
        "AUTOSCALER_EC2_SUBNET_IDS": network.subnet_ids[0],
        "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps(
            {"m5.large": {"ami_id": network.ami_id, "boot_script": BOOT_SCRIPT}}
        ),
        "AUTOSCALER_EC2_PULL_IMAGES": ecr,
    }
    (tmp_path / "daemon.env").write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    settings = load_settings(tmp_path / "daemon.env")

    class Swarm:
        join_command = staticmethod(join_command)

    cloud = await _ec2(settings, Swarm()).start()  # type: ignore[arg-type]
    try:
        faults.record()
        await cloud.launch("m5.large", 1, {})
    finally:
        await cloud.close()
    [text] = _sent(faults, "RunInstances", "UserData")
    [script] = user_data_scripts(text)
    login = "aws ecr get-login-password --region eu-west-1 | docker login --username AWS --password-stdin"
    steps = [
        BOOT_SCRIPT,
        f"{login} 123456789012.dkr.ecr.eu-west-1.amazonaws.com",
        f"docker pull --quiet {ecr}",
        JOIN,
    ]
    at = [script.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), (at, script)
