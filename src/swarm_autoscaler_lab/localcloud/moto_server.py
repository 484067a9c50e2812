"""A local EC2: moto's server, in-process, on 127.0.0.1 and a free port, with fault injection.

`MotoServer` serves the same WSGI application as `moto.server.ThreadedMotoServer` (moto's
`DomainDispatcherApplication` over `create_backend_app`, with `MotoRequestHandler`), but wrapped in a
`FaultInjector` (see `ec2_faults`). ThreadedMotoServer offers no way to wrap its application, and a
separate proxy would add an HTTP hop to every call, so this module builds the threaded werkzeug server
itself from the same public pieces `moto.server` exports.

EC2 instance-type validation is switched ON (moto's `MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION`,
read into `moto.settings` at import, so it is set in both places): RunInstances of a type moto does
not know fails with `InvalidInstanceType`, as on real EC2. ModifyInstanceAttribute's user data is read
as EC2 reads it (`moto_user_data`: moto itself refuses the correctly encoded value).

moto keeps its state in process-wide backends: every `MotoServer` in one process shares the same
EC2 world. Tests isolate themselves by cluster name (the ownership tag) or by `reset()`.

`provision_network()` creates what a launch needs: a VPC, one subnet per zone, a security group, a
key pair, an AMI and (optionally) an IAM instance profile, and returns their ids.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import botocore.session
import moto.settings
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server

from swarm_autoscaler_lab.localcloud import moto_user_data
from swarm_autoscaler_lab.localcloud.ec2_faults import FaultInjector

LOCAL_ACCESS_KEY = "testing"
LOCAL_SECRET_KEY = "testing"  # moto accepts any credentials; these are not secrets
_VALIDATION_ENV = "MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION"


class _SkewedDateHandler(MotoRequestHandler):
    """moto's request handler whose own `Date` header follows the fault injector's clock skew."""

    def date_time_string(self, timestamp: float | None = None) -> str:
        if timestamp is None:
            timestamp = time.time() + getattr(self.server.app, "clock_skew", 0.0)
        return super().date_time_string(timestamp)


class _QuietHandler(_SkewedDateHandler):
    """moto's request handler without a log line per request."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def enable_instance_type_validation() -> None:
    """Make moto reject unknown EC2 instance types, in this process and in moto servers it starts."""
    os.environ[_VALIDATION_ENV] = "true"
    moto.settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = True


class MotoServer:
    """moto's server on `host` and a free port (or `port`), run in a daemon thread.

    Use as a context manager, or call `start()` / `stop()`. `endpoint` is the URL to give SDK clients;
    `faults` controls refusals and injected errors at run time.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, seed: int = 0, quiet: bool = True) -> None:
        self._host = host
        self._port = port
        self._quiet = quiet
        self.faults = FaultInjector(DomainDispatcherApplication(create_backend_app), seed=seed)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("MotoServer is not started: call start() or use it as a context manager")
        return f"http://{self._server.host}:{self._server.port}"

    def start(self) -> MotoServer:
        if self._server is not None:
            return self
        enable_instance_type_validation()
        moto_user_data.install()
        handler = _QuietHandler if self._quiet else _SkewedDateHandler
        self._server = make_server(
            self._host, self._port, self.faults, threaded=True, request_handler=handler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="moto-server", kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=10)

    def reset(self) -> None:
        """Forget every resource in moto's backends (process-wide) and every fault rule."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        self.faults.reset()

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------ provisioning


@dataclass(frozen=True, slots=True)
class LocalNetwork:
    """Ids of the resources `provision_network` created: everything `Ec2Cloud` needs to launch."""

    region: str
    vpc_id: str
    subnet_ids: tuple[str, ...]
    security_group_id: str
    key_name: str
    ami_id: str
    instance_profile: str | None


def _local_client(service: str, endpoint: str, region: str) -> Any:
    return botocore.session.get_session().create_client(
        service,
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id=LOCAL_ACCESS_KEY,
        aws_secret_access_key=LOCAL_SECRET_KEY,
    )


def provision_network(
    endpoint: str,
    *,
    region: str = "us-east-1",
    name: str = "swarm-autoscaler-local",
    zones: tuple[str, ...] = ("a", "b", "c"),
    instance_profile: bool = True,
    prefix: str = "10.0",
) -> LocalNetwork:
    """Create a VPC with one subnet per zone suffix, a security group, a key pair, an AMI and an IAM
    instance profile on the EC2 (and IAM) at `endpoint`. Names get a random suffix, so it can be
    called many times against the same server. `prefix` is the VPC's first two octets (its CIDR is
    `<prefix>.0.0/16`): the keeper's local cloud carves it from loopback (`127.N`), so that a primary's
    private IP is an address its emulated scheduler can listen on."""
    unique = f"{name}-{uuid.uuid4().hex[:8]}"
    ec2 = _local_client("ec2", endpoint, region)
    vpc_id = ec2.create_vpc(CidrBlock=f"{prefix}.0.0/16")["Vpc"]["VpcId"]
    subnet_ids = tuple(
        ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"{prefix}.{i}.0/24", AvailabilityZone=f"{region}{zone}")[
            "Subnet"
        ]["SubnetId"]
        for i, zone in enumerate(zones)
    )
    group_id = ec2.create_security_group(
        GroupName=unique, Description="swarm-autoscaler local workers", VpcId=vpc_id
    )["GroupId"]
    ec2.create_key_pair(KeyName=unique)
    ami_id = ec2.register_image(
        Name=unique,
        Architecture="x86_64",
        RootDeviceName="/dev/xvda",
        VirtualizationType="hvm",
        Description="local worker image (docker preinstalled on a real one)",
    )["ImageId"]
    profile = None
    if instance_profile:
        profile = unique
        _local_client("iam", endpoint, region).create_instance_profile(InstanceProfileName=profile)
    return LocalNetwork(region, vpc_id, subnet_ids, group_id, unique, ami_id, profile)
