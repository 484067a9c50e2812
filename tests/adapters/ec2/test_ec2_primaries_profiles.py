"""A keeper cluster's profile at the wire: the keeper's own EC2 adapter, built from its settings as
`swarm-autoscaler keeper` builds it (`keeper.app.primaries`), launches a primary against a real moto
server over HTTP. Each RunInstances is captured as it arrives (the fault injector's call log, in front
of moto) and its `UserData` decoded once, strictly, as EC2 decodes it: what remains is the script
cloud-init runs on the primary, and it must run the profile's scheduler image and create the worker
service from the profile's worker image. The instance type and the profile tag are read from the same
request; the profile read back from the tags alone (a restarted keeper) is the one asked for.

Stands in for: EC2's API decoding the blob and cloud-init on the primary's AMI reading it (no assertion
reads the user data back through moto)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY, tags_in

from swarm_autoscaler.config.keeper import KeeperConfig, load_keeper_settings
from swarm_autoscaler.keeper.adapters.tags import PROFILE_TAG
from swarm_autoscaler.keeper.app import primaries
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer
from swarm_autoscaler_lab.localcloud.moto_user_data import as_ec2_decodes

IMAGE = "registry.example.com/swarm-autoscaler:0.1.0"
GEO = {
    "worker_image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/geo/dask-worker:1.4.0",
    "scheduler_image": "registry.example.com/geo/dask-scheduler:1.4.0",
    "primary_type": "m5.xlarge",
    "worker_types": {"c5.xlarge": {"ami_id": "ami-0123456789abcdef0"}},
}


def _config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto: MotoServer, network: LocalNetwork
) -> KeeperConfig:
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    env = {
        "AUTOSCALER_KEEPER_TOKEN": "a-Keeper-token-0123456789",
        "AUTOSCALER_KEEPER_NAME": "profiles-keeper",
        "AUTOSCALER_KEEPER_PUBLIC_URL": "https://10.0.0.5:8080",
        "AUTOSCALER_KEEPER_IMAGE": IMAGE,
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": network.ami_id,
        "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps({"m5.large": {"ami_id": network.ami_id}}),
        "AUTOSCALER_KEEPER_PROFILES": json.dumps({"geo": GEO}),
        "AUTOSCALER_EC2_ENDPOINT": moto.endpoint,
        "AUTOSCALER_EC2_REGION": network.region,
        "AUTOSCALER_EC2_ACCESS_KEY_ID": ACCESS_KEY,
        "AUTOSCALER_EC2_SECRET_ACCESS_KEY": SECRET_KEY,
        "AUTOSCALER_EC2_SUBNET_IDS": ",".join(network.subnet_ids),
    }
    path = tmp_path / "keeper.env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    return load_keeper_settings(path)


async def test_a_profile_s_images_type_and_tag_leave_the_process_in_its_primary_s_launch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    moto_server: MotoServer,
    network: LocalNetwork,
    faults: FaultInjector,
) -> None:
    config = _config(tmp_path, monkeypatch, moto_server, network)
    async with primaries(config) as hosts:
        faults.record()
        geo = await hosts.create(ClusterKey("alice", "w1"), hosts.now(), "geo")
        plain = await hosts.create(ClusterKey("bob", "w1"), hosts.now())
        sent = [call.params for call in faults.recorded() if call.action == "RunInstances"]
        assert len(sent) == 2
        for params, worker, scheduler, kind, types in (
            (sent[0], GEO["worker_image"], GEO["scheduler_image"], "m5.xlarge", ["c5.xlarge"]),
            (sent[1], IMAGE, IMAGE, "m5.large", ["m5.large"]),
        ):
            script = as_ec2_decodes(params["UserData"])
            assert script.startswith("#!/bin/bash\n")
            assert f"--entrypoint /usr/local/bin/swarm-autoscaler-worker {worker} $TLS_WORKER" in script
            assert re.search(rf"--entrypoint dask {re.escape(str(scheduler))} scheduler ", script)
            assert f'--env-file "$D/cluster.env" {IMAGE} run' in script  # the autoscaler: the keeper's
            (allowed,) = re.findall(r"^AUTOSCALER_EC2_ALLOWED_TYPES=(.*)$", script, re.MULTILINE)
            assert list(json.loads(allowed)) == types
            assert params["InstanceType"] == kind
        assert tags_in(sent[0], "instance")[PROFILE_TAG] == "geo"
        assert tags_in(sent[1], "instance")[PROFILE_TAG] == "default"
        assert (geo.profile, plain.profile) == ("geo", "default")
        listed = {c.cluster_id: c.profile for c in await hosts.list_clusters()}  # from the tags alone
        assert listed[geo.cluster_id] == "geo" and listed[plain.cluster_id] == "default"
