"""A keeper cluster booted from the keeper's DEFAULT primary boot script on real dockerd nodes.

The keeper, deployed with `docker stack deploy` from docker/keeper-stack.yml (and keeper-stack.local.yml:
the host's network, the API's port in host mode) as one replica (with redis) on the keeper's swarm (the session swarm's manager), with AUTOSCALER_KEEPER_IMAGE the image docker/Dockerfile
builds, creates a cluster. Its primary instance (moto) boots from its real user data,
the default script, on a dockerd node of its own (`localcloud.userdata.UserDataBoot`): it fetches its
TLS files from the keeper with its one-time token, over HTTPS verified with the CA in its user data (the
keeper's default: a certificate it makes for its public URL's host), runs `docker swarm init` (a swarm of its own, not the
keeper's), and creates the TLS scheduler, the cluster's autoscaler and the worker global service as swarm
services. The cluster is created with a profile whose scheduler and worker image is a team's
(docker/worker.Dockerfile: `distributed`, nothing of swarm-autoscaler): the scheduler runs the packing
preload from the file the script mounts, and neither it nor a worker can import swarm_autoscaler.
A user's client, with the TLS files from `GET .../credentials`, submits work to the API's
`scheduler_url`; the cluster's autoscaler (the image's `swarm-autoscaler run`, a swarm task on the
primary) has the keeper launch worker machines (`POST /v1/primaries/<id>/launches`: the primaries'
role launches nothing), each boots from the user data that autoscaler rendered and joins the
primary's swarm, where swarm starts the worker service's task; the work completes; heartbeats stop and
the keeper's idle end terminates the primary and every worker. Each phase's duration is printed.

What stands in for AWS here (see docs/keeper.md, "What the end-to-end test stands in for"):
- EC2: moto over HTTP; a machine is a dockerd in its own UTS and mount namespaces whose address is the
  instance's private IP (the VPC is carved from 127.0.0.0/8) and whose `/etc/swarm-autoscaler` and
  `/var/run/docker.sock` are its own (`dockerd.MACHINE_MOUNTS`); cloud-init itself does not run: the
  user data is decoded as cloud-init would and run by bash (`userdata`).
- The AMI's images: no registry, so the image tarballs (the autoscaler's, the team's) are `docker
  load`ed into each new node first.
- The metadata service of each boot (its private IP, which its credentials fetch comes from: the keeper
  answers the one-time token only there): `localcloud.metadata`.
- The instance profile: the autoscaler service's boto3 reads credentials from an instance metadata
  service, here moto's on loopback (the docker shim of the user data adds
  `AWS_EC2_METADATA_SERVICE_ENDPOINT` to the services it creates; on EC2 it is 169.254.169.254).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from distributed import Client
from tests.e2e.helpers import IMAGE_WORKERS_DIFFER, hostname_of, phase, short_names, wait_for
from tests.e2e.keeper_helpers import primaries_of, wait_gone, wait_state, workers_of

from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.keeper.adapters.tags import WORKER_KEEPER_TAG
from swarm_autoscaler_lab.demo.clusters import KeeperApi
from swarm_autoscaler_lab.localcloud.cloud import LocalCloud
from swarm_autoscaler_lab.localcloud.dockerd import LocalNode, LocalSwarm, _cli_env, _docker_cli
from swarm_autoscaler_lab.localcloud.dockerd_joiner import DockerdJoiner
from swarm_autoscaler_lab.localcloud.image import (
    IMAGE,
    ROOT,
    WORKER_IMAGE,
    ensure_image,
    ensure_worker_image,
    image_tarball,
)
from swarm_autoscaler_lab.localcloud.keepercloud import KeeperCloud, KeeperCloudOptions, primary_tags
from swarm_autoscaler_lab.localcloud.machines import MachineEmulator
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.localcloud.metadata import MetadataService
from swarm_autoscaler_lab.localcloud.redis_server import free_port
from swarm_autoscaler_lab.localcloud.userdata import UserDataBoot, address_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.swarm,
    pytest.mark.timeout(900),
    IMAGE_WORKERS_DIFFER,
]

KEEPER_STACK = "keeper"
IDLE = 20.0  # the keeper's idle timeout, seconds
TEAM_IMAGE = "localhost/team-dask-worker:local"  # the cluster profile's scheduler and worker image
TASKS = 3


async def _keeper_ca(kc: KeeperCloud) -> str | None:
    """The CA the keeper made for its API, from its redis key (unsealed here: no secrets key is set),
    as an operator takes it for the users' clients; None until the keeper wrote it."""
    assert kc.redis is not None
    client: Any = aioredis.from_url(kc.redis.url)
    try:
        stored = await client.get(f"swarm-autoscaler:keeper:{kc.keeper_name}:api-tls")
    finally:
        await client.aclose()
    return None if stored is None else str(json.loads(stored)["ca_pem"])


@contextlib.asynccontextmanager
async def _deployed_keeper(
    kc: KeeperCloud, swarm: LocalSwarm, extra: dict[str, str], replicas: int = 1
) -> AsyncIterator[tuple[str, str]]:
    """The keeper as the service of docker/keeper-stack.yml (with keeper-stack.local.yml: the host's
    network, a replica on 127.0.2.<slot>; one replica per node, as its port is published in host mode: the
    keeper's swarm here has one node), deployed with `docker stack deploy` on the keeper's swarm
    (the session swarm's manager), with its default API: HTTPS with a certificate it makes for the public
    URL's host, its CA in redis and in the primaries' user data. Yields replica 1's API URL and that CA
    once every replica answers /healthz to a client that trusts it (the image's health check too)."""
    port = free_port()
    url = f"https://127.0.2.1:{port}"
    env = {
        **kc.keeper_env(idle_timeout_s=IDLE, http_port=port),
        **extra,
        "AUTOSCALER_KEEPER_PUBLIC_URL": url,
    }
    env.pop("AUTOSCALER_HTTP_HOST")  # keeper-stack.local.yml gives each replica its own address
    env.pop("AUTOSCALER_KEEPER_PLAIN_HTTP")  # the lab's in-process keepers' choice; not the default
    env_file = kc.write_env("keeper-stack.env", {})
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))  # docker reads values verbatim
    cli_env = {
        **_cli_env(),
        "DOCKER_HOST": swarm.manager_url,
        "AUTOSCALER_IMAGE": IMAGE,
        "KEEPER_ENV_FILE": str(env_file),
        "KEEPER_REPLICAS": str(replicas),
        "KEEPER_PUBLISHED_PORT": str(port),
    }
    files = [
        "-c",
        str(ROOT / "docker" / "keeper-stack.yml"),
        "-c",
        str(ROOT / "docker" / "keeper-stack.local.yml"),
    ]
    done = await asyncio.to_thread(
        subprocess.run,
        [_docker_cli(), "stack", "deploy", *files, KEEPER_STACK],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    try:
        ca: list[str] = []

        async def made() -> bool:
            ca[:] = [pem for pem in [await _keeper_ca(kc)] if pem]
            return bool(ca)

        await wait_for(made, 120, "the keeper made its API's CA", step=0.5)
        for slot in range(1, replicas + 1):  # the certificate names 127.0.2.1, the public URL's host
            api = KeeperApi(f"https://127.0.2.{slot}:{port}", kc.token, ca[0])
            try:

                async def healthy(api: KeeperApi = api) -> bool:
                    with contextlib.suppress(OSError, asyncio.TimeoutError, ValueError):
                        status, _ = await api.call("GET", "/healthz")
                        return status == 200
                    return False

                await wait_for(healthy, 120, f"keeper replica {slot} answers /healthz", step=0.5)
            finally:
                await api.close()
        yield url, ca[0]
    finally:
        with contextlib.suppress(Exception):
            print(
                await swarm.manager.docker("service", "ps", "--no-trunc", f"{KEEPER_STACK}_keeper"),
                flush=True,
            )
        await swarm.manager.docker("stack", "rm", KEEPER_STACK)


def _emulator(
    kc: KeeperCloud, tags: dict[str, str], boot: UserDataBoot, swarm: LocalSwarm
) -> MachineEmulator:
    """Machines carrying `tags` boot from their user data on their own dockerd nodes (the emulator starts
    no worker; a terminated machine's dockerd stops)."""
    assert kc.network is not None
    return MachineEmulator(
        ec2_endpoint=kc.moto.endpoint,
        region=kc.network.region,
        tag_filters=tags,
        orchestrator=MemorySwarm(),  # read only for the shortcut's workers, which the real boot never starts
        joiner=DockerdJoiner(swarm),
        scheduler_address="",
        catalogue=CATALOGUE,
        boot_delay=0.5,
        user_data_boot=boot,
    )


async def test_a_keeper_cluster_boots_from_the_default_script_computes_scales_and_ends(
    cloud: LocalCloud, tmp_path: Path
) -> None:
    swarm = cloud.local_swarm
    phases: dict[str, float] = {}
    t = time.monotonic()
    await asyncio.to_thread(ensure_image, swarm.manager)
    tarball = image_tarball()
    assert tarball.exists()
    team = await asyncio.to_thread(_team_image, swarm, tmp_path)
    t = phase("image", t, phases)

    async with (
        KeeperCloud(KeeperCloudOptions(fast=True, max_workers=2)) as kc,
        contextlib.AsyncExitStack() as stack,
    ):
        metadata = await MetadataService().start()  # each boot's private IP: its credentials fetch's source
        stack.push_async_callback(metadata.close)
        boot = UserDataBoot(
            swarm,
            preload=[tarball, team],
            machine_addresses=True,
            machine_mounts=True,
            service_env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": kc.moto.endpoint},
            metadata=metadata,
        )
        emulators = [
            _emulator(kc, primary_tags(kc.keeper_name), boot, swarm),
            _emulator(kc, {WORKER_KEEPER_TAG: kc.keeper_name}, boot, swarm),
        ]
        tasks = [asyncio.create_task(e.run(0.5)) for e in emulators]
        try:
            extra = {
                "AUTOSCALER_KEEPER_IMAGE": IMAGE,
                "AUTOSCALER_KEEPER_MAX_START_TIME": "300s",
                "AUTOSCALER_KEEPER_PROFILES": json.dumps(
                    {"team": {"worker_image": TEAM_IMAGE, "scheduler_image": TEAM_IMAGE}}
                ),
            }
            async with _deployed_keeper(kc, swarm, extra) as (url, ca):
                t = phase("deploy the keeper (docker stack deploy, /healthz)", t, phases)
                api = KeeperApi(url, kc.token, ca)
                try:
                    await _life(kc, api, swarm, tmp_path, phases, t)
                finally:
                    await api.close()
        finally:
            for e in emulators:
                e.stopping = True
            for task in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 60)
            for e in emulators:
                await e.close()  # stops every node still running (the machines' dockerds)
    print("phases:", {k: round(v, 1) for k, v in phases.items()}, flush=True)


async def _life(
    kc: KeeperCloud, api: KeeperApi, swarm: LocalSwarm, tmp_path: Path, phases: dict[str, float], t: float
) -> None:
    path = "/v1/clusters/alice/w-boot"
    status, body = await api.call("PUT", path, {"profile": "team"})
    assert status == 201 and body["profile"] == "team", body
    cid = body["id"]
    try:
        body = await wait_state(api, path, "running", 300)
    finally:
        _print_services(swarm, kc, cid)
    (primary,) = primaries_of(kc, cid)
    ip = primary["PrivateIpAddress"]
    assert body["scheduler_url"] == f"tls://{ip}:{kc.scheduler_port}"
    primary_node = _node_of(swarm, primary)
    assert primary_node is not None, sorted(swarm.nodes)
    assert primary_node.address == ip and address_of(primary_node.hostname) == ip

    async def all_services() -> bool:  # the boot script creates them (detached) after the scheduler
        services = await primary_node.docker("service", "ls", "--format", "{{.Name}}")
        return set(services.split()) == {"dask-scheduler", "autoscaler", "dask-worker"}

    await wait_for(all_services, 120, "the scheduler, autoscaler and worker services on the primary")
    for service, image in (
        ("dask-scheduler", TEAM_IMAGE),
        ("dask-worker", TEAM_IMAGE),
        ("autoscaler", IMAGE),
    ):
        spec = "{{.Spec.TaskTemplate.ContainerSpec.Image}}"
        ran = await primary_node.docker("service", "inspect", "--format", spec, service)
        assert ran.strip().split("@")[0] == image, (service, ran)  # the profile's images, the keeper's own
    t = phase("primary boots from the default script (running)", t, phases)

    security = await api.security(path, tmp_path / "client")
    try:
        async with Client(body["scheduler_url"], asynchronous=True, security=security) as client:  # type: ignore[no-untyped-call]
            futures = [
                client.submit(pow, 2, 10 + i, key=f"pow-{i}", pure=False, resources={"CPU": 1.0})
                for i in range(TASKS)
            ]
            gathered = asyncio.ensure_future(client.gather(futures))
            peak = 0
            seen: dict[str, dict[str, Any]] = {}
            deadline = time.monotonic() + 420
            while not gathered.done():
                live = workers_of(kc, cid)
                seen.update(live)
                peak = max(peak, len(live))
                await api.call("POST", path + "/heartbeat")
                assert time.monotonic() < deadline, "the work did not complete"
                await asyncio.sleep(1.0)
            assert await gathered == [2 ** (10 + i) for i in range(TASKS)]
            # the default script starts the scheduler with the packing preload (its plugin, by name),
            # from the file it mounts: the team's image has no swarm_autoscaler to import
            # (lambdas: cloudpickle sends them by value; a function of this module would need it there)
            assert not await client.run_on_scheduler(
                lambda: importlib.util.find_spec("swarm_autoscaler") is not None
            )
            assert not any(
                (await client.run(lambda: importlib.util.find_spec("swarm_autoscaler") is not None)).values()
            )
            assert await client.run_on_scheduler(
                lambda dask_scheduler: "dask-packing-queued" in dask_scheduler.plugins
            )
            ran_on = {a for addrs in (await client.who_has(futures)).values() for a in addrs}
            # each worker's name, as the worker service set it ({{.Node.Hostname}}), read on the worker
            named = await client.run(os.getenv, "DASK_WORKER_NAME")
            names = short_names(str(named[a]) for a in ran_on)  # half the machines: the full DNS name
    finally:
        _print_services(swarm, kc, cid)
    t = phase("work over TLS: the cluster's autoscaler launches workers, they boot and compute", t, phases)
    every = kc.instances(("pending", "running", "terminated", "shutting-down"))
    hostnames = {hostname_of(i) for iid, i in every.items() if iid != primary["InstanceId"]}
    assert 1 <= peak <= 2 and names and names <= hostnames, (peak, names, hostnames)
    # the workers joined the primary's swarm, not the keeper's (the session swarm's manager)
    on_primary = await primary_node.docker("node", "ls", "--format", "{{.Hostname}}")
    assert names <= short_names(on_primary.split()), on_primary
    on_keeper = await swarm.manager.docker("node", "ls", "--format", "{{.Hostname}}")
    assert not names & short_names(on_keeper.split()), on_keeper
    await _joined_by_ticket(kc, primary_node, ip, {i: w for i, w in seen.items() if hostname_of(w) in names})
    t = phase("the workers joined through the primary's join desk (tickets)", t, phases)

    await wait_gone(api, path, IDLE + 120)
    await _wait_no_instances(kc)
    t = phase("idle end: the keeper terminates the primary and every worker", t, phases)
    mine = "ip-" + kc.prefix.replace(".", "-") + "-"

    def nodes_left() -> set[str]:
        return {h for h in swarm.nodes if h.startswith(mine)}

    # and each terminated machine's dockerd is stopped (its swarm with it)
    await wait_for(lambda: not nodes_left(), 60, "every cluster machine's dockerd stopped")


async def _joined_by_ticket(
    kc: KeeperCloud, primary_node: LocalNode, primary_ip: str, workers: dict[str, dict[str, Any]]
) -> None:
    """The workers that ran work joined the primary's swarm through its join desk (the autoscaler's
    `POST /v1/join` over TLS at the primary's private IP: the default boot script sets
    `AUTOSCALER_EC2_JOIN_URL=auto`), never with the join token in user data: each one's user data, read back
    from moto as a read-only principal reads it (DescribeInstanceAttribute, base64-decoded once), holds
    no swarm join token (the primary's, read from its swarm) but a ticket for that URL, and the keeper
    tagged its nonce; the desk logged a grant for each; and the ticket, replayed now from the worker's
    own address (its node joined) and from another, gets 403."""
    assert workers
    token = (await primary_node.docker("swarm", "join-token", "-q", "worker")).strip()
    assert token.startswith("SWMTKN")
    url = f"https://{primary_ip}:8443/v1/join"  # `auto`: the primary's advertised address, the join port
    for iid, inst in workers.items():
        attr = kc.ec2().describe_instance_attribute(InstanceId=iid, Attribute="userData")
        user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", ())}
        assert token not in user_data and "SWMTKN" not in user_data, iid
        assert not [v for v in tags.values() if "SWMTKN" in v] and JOIN_NONCE_TAG in tags
        assert url in user_data
        found = re.search(r'"ticket": "([0-9a-f]{64})"', user_data)
        assert found is not None
        ip = inst["PrivateIpAddress"]
        other = ip.rsplit(".", 1)[0] + (".250" if not ip.endswith(".250") else ".251")
        for source in (ip, other):
            connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as http,
                # its key is pinned in the user data; the replay needs no verification to be refused
                http.post(url, json={"ticket": found.group(1)}, ssl=False) as answer,
            ):
                assert answer.status == 403, (source, answer.status)
    # the service's log lines are its tasks' stderr, which docker service logs writes to its own stderr
    cmd = [_docker_cli(), "-H", primary_node.docker_url, "service", "logs", "--raw", "autoscaler"]
    done = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, env=_cli_env(), timeout=60
    )
    logs = done.stdout + done.stderr
    granted = [line for line in logs.splitlines() if "join granted" in line]
    assert len(granted) >= len(workers), logs[-2000:]


def _team_image(swarm: LocalSwarm, tmp_path: Path) -> Path:
    """The team's image (docker/worker.Dockerfile: distributed, no swarm_autoscaler) under the profile's
    name, which names its registry (`localhost/`: a profile refuses a name Docker Hub would resolve), saved
    for each new node to load (the AMI's images, as the autoscaler's)."""
    ensure_worker_image(swarm.manager)
    swarm.manager.docker_sync("tag", WORKER_IMAGE, TEAM_IMAGE)
    saved = tmp_path / "team-image.tar"
    swarm.manager.docker_sync("save", "-o", str(saved), TEAM_IMAGE, timeout=300)
    return saved


async def _wait_no_instances(kc: KeeperCloud) -> None:
    await wait_for(lambda: kc.instances() == {}, 120, "every cluster machine terminated", step=1.0)


def _node_of(swarm: LocalSwarm, inst: dict[str, Any]) -> LocalNode | None:
    """The machine's dockerd node, named as its OS reports its hostname: short or the full DNS name."""
    full = str(inst["PrivateDnsName"])
    return swarm.nodes.get(full) or swarm.nodes.get(full.split(".", 1)[0])


def _print_services(swarm: LocalSwarm, kc: KeeperCloud, cid: str) -> None:
    """What the primary's services said (for a failure's report)."""
    for inst in primaries_of(kc, cid):
        node = _node_of(swarm, inst)
        if node is None:
            continue
        for service in ("dask-scheduler", "autoscaler", "dask-worker"):
            with contextlib.suppress(Exception):
                print(f"--- {service}:", node.docker_sync("service", "ps", "--no-trunc", service), flush=True)
                print(node.docker_sync("service", "logs", "--tail", "30", service), flush=True)
