"""What a read-only principal reads of a keeper primary: its user data (DescribeInstanceAttribute) and its
tags carry no credential that still works once the primary booted. The cluster token (the bearer of the
keeper's listing and launch routes for that cluster) comes with the one-time credentials fetch instead.

The keeper's real boot script (the default template, rendered by `keeper.app.user_data_of`) is sent by
the keeper's EC2 adapter to a moto server over HTTP; the RunInstances request is captured as it arrives
(the fault injector's call log, in front of moto) and its `UserData` decoded as EC2 does. Stands in for:
EC2 storing the user data, and `ReadOnlyAccess` reading it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import ACCESS_KEY, SECRET_KEY

from swarm_autoscaler.config.keeper import LISTING_TOKEN_SECRET, load_keeper_settings
from swarm_autoscaler.keeper.adapters.ec2_primaries import Ec2Primaries
from swarm_autoscaler.keeper.app import user_data_of
from swarm_autoscaler.keeper.credentials import listing_token, primary_token
from swarm_autoscaler.keeper.model import ClusterKey
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork, MotoServer
from swarm_autoscaler_lab.localcloud.moto_user_data import as_ec2_decodes

TOKEN = "the-keeper-s-own-api-token-0123456789"


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, network: LocalNetwork, endpoint: str) -> Any:
    for name in [n for n in __import__("os").environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    env = {
        "AUTOSCALER_KEEPER_TOKEN": TOKEN,
        "AUTOSCALER_KEEPER_NAME": "keeper-secrets",
        "AUTOSCALER_KEEPER_PUBLIC_URL": "https://10.0.0.5:8080",
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": network.ami_id,
        "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps({"m5.large": {"ami_id": network.ami_id}}),
        "AUTOSCALER_EC2_REGION": network.region,
        "AUTOSCALER_EC2_ENDPOINT": endpoint,
    }
    path = tmp_path / "keeper.env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    return load_keeper_settings(path)


async def test_the_primary_s_user_data_and_tags_carry_no_cluster_token(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    moto_server: MotoServer,
    network: LocalNetwork,
    faults: FaultInjector,
    raw_ec2: Any,
) -> None:
    config = _config(tmp_path, monkeypatch, network, moto_server.endpoint)
    hosts = await Ec2Primaries(
        keeper_name="keeper-secrets", region=network.region, endpoint=moto_server.endpoint,
        access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, primary_type="m5.large",
        ami_id=network.ami_id, user_data=user_data_of(config), subnet_ids=network.subnet_ids,
        security_group_ids=[network.security_group_id], retry_initial=0.01, retry_max=0.05,
    ).start()  # fmt: skip
    try:
        faults.record()
        cluster = await hosts.create(ClusterKey("alice", "w1"), 1_800_000_000.0)
    finally:
        await hosts.close()
    cid = cluster.cluster_id
    [sent] = [as_ec2_decodes(c.params["UserData"]) for c in faults.recorded() if c.action == "RunInstances"]

    assert sent.startswith("#!/bin/bash\n") and f"Bearer {primary_token(TOKEN, cid)}" in sent  # spent at boot
    assert listing_token(TOKEN, cid) not in sent and TOKEN not in sent
    assert "AUTOSCALER_EC2_LISTING_TOKEN=" not in sent
    assert f"AUTOSCALER_EC2_LISTING_TOKEN_FILE={LISTING_TOKEN_SECRET}" in sent
    assert f"AUTOSCALER_EC2_LISTING_URL=https://10.0.0.5:8080/v1/primaries/{cid}/instances" in sent
    # the boot script makes the secret from the fetch's answer and hands it to the autoscaler service
    assert 'docker secret create keeper-listing-token "$D/listing-token"' in sent
    assert "--secret keeper-listing-token" in sent

    raw = await raw_ec2.describe_instances(InstanceIds=[cluster.primary_id])
    tags = json.dumps(raw["Reservations"][0]["Instances"][0].get("Tags", []))
    assert cid in tags and listing_token(TOKEN, cid) not in tags and primary_token(TOKEN, cid) not in tags
