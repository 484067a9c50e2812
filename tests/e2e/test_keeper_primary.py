"""The keeper's local cloud boots primaries into clusters of their own: moto over HTTP, real dask
schedulers and workers, each cluster's real autoscaler (in-memory swarms; no dockerd).

Two primaries are launched by hand here, as the keeper's EC2 adapter would (ownership tags, a cluster
id tag, a boot script carrying the cluster's autoscaler settings), so that this test depends on the
local cloud alone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from tests.e2e.helpers import wait_for

from swarm_autoscaler.adapters.ec2 import owner_tags
from swarm_autoscaler.keeper.adapters.dask_probe import HttpSchedulerProbe
from swarm_autoscaler_lab.localcloud.keepercloud import KeeperCloud, KeeperCloudOptions
from swarm_autoscaler_lab.localcloud.primaries import autoscaler_env

pytestmark = [pytest.mark.e2e, pytest.mark.no_dockerd, pytest.mark.timeout(240)]

OWNER = {"test-keeper": "primaries"}
CLUSTER_TAG = "test-keeper/cluster-id"


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def launch_primary(kc: KeeperCloud, cluster_id: str, max_workers: int) -> dict[str, Any]:
    assert kc.network is not None
    script = (
        "#!/bin/bash\ncat > /etc/cluster.env <<'EOF'\n"
        f"AUTOSCALER_CLUSTER_NAME={cluster_id}\nAUTOSCALER_EC2_MAX_INSTANCES={max_workers}\nEOF\n"
    )
    tags = [{"Key": k, "Value": v} for k, v in {**OWNER, CLUSTER_TAG: cluster_id}.items()]
    reply = kc.ec2().run_instances(
        ImageId=kc.network.ami_id,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        SubnetId=kc.network.subnet_ids[0],
        UserData=script,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return dict(reply["Instances"][0])


def workers_of(kc: KeeperCloud, cluster_id: str) -> dict[str, dict[str, Any]]:
    owned = owner_tags(cluster_id)
    return {
        iid: inst
        for iid, inst in kc.instances().items()
        if owned.items() <= {t["Key"]: t["Value"] for t in inst.get("Tags", [])}.items()
    }


def test_the_boot_script_autoscaler_lines_are_read_verbatim() -> None:
    script = '#!/bin/bash\nAUTOSCALER_A=1\n  AUTOSCALER_B=no\nAUTOSCALER_C={"x": 1}\nAUTOSCALER_A=2\n'
    assert autoscaler_env(script) == {"AUTOSCALER_A": "2", "AUTOSCALER_C": '{"x": 1}'}


async def test_primaries_boot_into_their_own_clusters_that_scale_on_their_own_work() -> None:
    probe = HttpSchedulerProbe()
    try:
        await _two_primaries(probe)
    finally:
        await probe.close()


async def _two_primaries(probe: HttpSchedulerProbe) -> None:
    async with KeeperCloud(KeeperCloudOptions(fast=True, redis=False)) as kc:
        emulator = kc.boot_primaries(OWNER, CLUSTER_TAG)
        first, second = launch_primary(kc, "kc-one", 2), launch_primary(kc, "kc-two", 3)
        await wait_for(lambda: len(emulator.primaries) == 2, 60, "both primaries booted")
        one, two = emulator.by_cluster("kc-one"), emulator.by_cluster("kc-two")
        assert one is not None and two is not None
        # Each scheduler listens on its primary's private IP, on the ports the keeper expects.
        assert one.scheduler_url == f"tcp://{first['PrivateIpAddress']}:{kc.scheduler_port}"
        assert two.dashboard_url == f"http://{second['PrivateIpAddress']}:{kc.dashboard_port}"
        assert (await probe.probe(one.dashboard_url)).answered
        # The boot script's settings reached the cluster's autoscaler.
        assert one.daemon is not None and one.daemon.cluster_name == "kc-one"
        assert one.daemon.policy.max_instances == 2

        from distributed import Client

        async with Client(one.scheduler_url, asynchronous=True) as client:  # type: ignore[no-untyped-call]
            futures = [client.submit(_sleep, 1.5, resources={"CPU": 1.0}, pure=False) for _ in range(8)]
            await wait_for(lambda: one.worker_count() >= 1, 60, "kc-one's workers joined its swarm")
            assert (await probe.probe(one.dashboard_url)).busy
            results = await asyncio.wait_for(client.gather(futures), 90)
            assert results == [1.5] * 8
            peak = len(workers_of(kc, "kc-one"))
            del futures
        # Only kc-one had work: only its autoscaler launched, within its own maximum, and its workers
        # joined its swarm (none joined kc-two's) and connected to its scheduler.
        assert 1 <= peak <= 2
        assert workers_of(kc, "kc-two") == {}
        assert two.worker_count() == 0
        # Its work done, its autoscaler retires and terminates its workers; the primary stays.
        await wait_for(lambda: not workers_of(kc, "kc-one"), 60, "kc-one's workers terminated")
        assert first["InstanceId"] in kc.instances()

        kc.ec2().terminate_instances(InstanceIds=[first["InstanceId"]])
        await wait_for(lambda: emulator.by_cluster("kc-one") is None, 30, "kc-one's primary stopped")
        assert not (await probe.probe(one.dashboard_url)).answered
        assert (await probe.probe(two.dashboard_url)).answered
