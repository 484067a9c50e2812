"""The primaries' emulator: boots the keeper's primary instances (in a moto server) into clusters.

It watches the cloud for instances carrying the keeper's ownership tags. `boot_delay` seconds after it
first saw one (pending or running), the instance boots into a `LocalPrimary` (its own swarm, a real
dask scheduler on its private IP, that cluster's autoscaler and its workers' emulator). When the
instance is terminated, its primary stops: the autoscaler, the workers, the scheduler. A boot that
fails is tried again at the next step, as a real machine's cloud-init would retry.

Each primary boots in its own task, so one slow boot never delays the others (EC2 boots machines
concurrently).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3
import structlog

from swarm_autoscaler_lab.localcloud.primary import LocalPrimary, PrimaryBoot, PrimaryOptions

log = structlog.get_logger("swarm_autoscaler_lab.localcloud.primaries")

DaemonEnv = Callable[[PrimaryBoot], Mapping[str, str]]

# The cluster's autoscaler settings in the primary's boot script (`{{autoscaler_env}}`: docker's
# env-file format, one NAME=value line each, verbatim).
ENV_LINE = re.compile(r"^(AUTOSCALER_[A-Z0-9_]+)=(.*)$", re.MULTILINE)


# The default boot script's fetch of its TLS files: the one-time token and the keeper's URL.
FETCH_LINE = re.compile(r'Authorization: Bearer ([0-9A-Za-z_-]+)" "(https?://\S+/credentials)"')


def credentials_fetch(user_data: str) -> tuple[str, str]:
    """(URL, one-time token) of the boot script's credentials fetch; ("", "") when it has none (a
    hand-written script: the cluster then speaks plain tcp)."""
    match = FETCH_LINE.search(user_data)
    return (match.group(2), match.group(1)) if match else ("", "")


def autoscaler_env(user_data: str) -> dict[str, str]:
    """The AUTOSCALER_* lines of a boot script, by name (a later line wins, as in an env file)."""
    return {name: value for name, value in ENV_LINE.findall(user_data)}


@dataclass
class PrimaryEmulator:
    """Boots and stops the keeper's primaries. `tag_filters` are the keeper's ownership tags;
    `cluster_tag` is the tag that names an instance's cluster. `daemon_env(boot)` gives the settings
    of that cluster's autoscaler (from `boot.user_env`, what the keeper wrote in its boot script, and
    what the local cloud adds: its endpoints and, in fast mode, short delays). Call `step()` periodically, or `run()` as a task, and `close()`."""

    options: PrimaryOptions
    tag_filters: Mapping[str, str]
    cluster_tag: str
    daemon_env: DaemonEnv
    boot_delay: float = 1.0
    primaries: dict[str, LocalPrimary] = field(default_factory=dict)
    booted_total: int = 0
    stopped_total: int = 0
    stopping: bool = False
    _booting: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._ec2: Any = boto3.client(
            "ec2",
            endpoint_url=self.options.ec2_endpoint,
            region_name=self.options.region,
            aws_access_key_id="local",
            aws_secret_access_key="local",  # the local moto server accepts any credentials
        )

    async def run(self, interval: float = 0.5) -> None:
        while not self.stopping:
            try:
                await self.step()
            except Exception as exc:  # keeps going, as real machines would
                log.warning("primary emulator step failed", error=str(exc))
            await asyncio.sleep(interval)

    async def step(self) -> None:
        """Boot the primaries seen for the first time (after `boot_delay`); stop the terminated ones."""
        live = await asyncio.to_thread(self._describe)
        for iid, boot in live.items():
            if iid not in self.primaries and iid not in self._booting:
                self._booting[iid] = asyncio.create_task(self._boot(boot), name=f"boot:{boot.cluster_id}")
        for iid in [i for i in {*self.primaries, *self._booting} if i not in live]:
            await self._stop(iid)

    async def close(self) -> None:
        self.stopping = True
        for iid in list({*self.primaries, *self._booting}):
            await self._stop(iid)

    def by_cluster(self, cluster_id: str) -> LocalPrimary | None:
        return next((p for p in self.primaries.values() if p.boot.cluster_id == cluster_id), None)

    async def _boot(self, boot: PrimaryBoot) -> None:
        try:
            await asyncio.sleep(self.boot_delay)
            user_data = await asyncio.to_thread(self._user_data, boot.instance_id)
            url, token = credentials_fetch(user_data)
            boot = dataclasses.replace(
                boot, user_env=autoscaler_env(user_data), credentials_url=url, credentials_token=token
            )
            primary = LocalPrimary(boot, self.options, self.daemon_env(boot))
            await primary.start()
            self.primaries[boot.instance_id] = primary
            self.booted_total += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next step boots it again
            log.warning("primary boot failed", cluster=boot.cluster_id, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._booting.pop(boot.instance_id, None)

    async def _stop(self, iid: str) -> None:
        booting = self._booting.pop(iid, None)
        if booting is not None:
            booting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await booting
        primary = self.primaries.get(iid)
        if primary is not None:
            await primary.close()  # listed until it is down: `by_cluster` None means stopped
            self.primaries.pop(iid, None)
            self.stopped_total += 1

    def _user_data(self, instance_id: str) -> str:
        attr = self._ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        raw = attr.get("UserData", {}).get("Value", "")
        return base64.b64decode(raw).decode() if raw else ""

    def _describe(self) -> dict[str, PrimaryBoot]:
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in self.tag_filters.items()]
        filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
        out: dict[str, PrimaryBoot] = {}
        for page in self._ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    cluster_id = tags.get(self.cluster_tag)
                    ip = inst.get("PrivateIpAddress")
                    if not cluster_id or not ip:
                        continue
                    hostname = (inst.get("PrivateDnsName") or inst["InstanceId"]).split(".")[0]
                    out[inst["InstanceId"]] = PrimaryBoot(inst["InstanceId"], cluster_id, hostname, ip)
        return out
