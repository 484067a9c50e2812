"""Instance types as the region offers them, for `Ec2Cloud`: DescribeInstanceTypes (by name, or every
type the region offers, page by page) and the architecture check of each type against its AMI.

What a type is comes from EC2, never from a list in this package: vCPUs, memory, GPUs and their memory
(published as the `VRAM` resource, see `core.catalogue.VRAM`), and the architectures its processors
run (x86_64, arm64). A name EC2 does not know is a configuration error, named in one line; so is an AMI
whose architecture the type cannot run (a Graviton type with an x86_64 AMI would never boot).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.ec2_support import (
    UNKNOWN_TYPE_CODES,
    chunks,
    error_code,
    error_message,
    to_endpoint_error,
    to_instance_type,
)
from swarm_autoscaler.core.model import InstanceType
from swarm_autoscaler.errors import ConfigurationError

SETTING = "AUTOSCALER_EC2_ALLOWED_TYPES"
DESCRIBE_TYPES_BATCH = 100  # EC2's limit on names in one DescribeInstanceTypes
TYPES_PAGE = 100  # EC2's largest page of DescribeInstanceTypes


@dataclass(frozen=True, slots=True)
class DescribedType:
    """One type as EC2 describes it: the model's view, and the architectures it runs."""

    itype: InstanceType
    architectures: tuple[str, ...]


class TypesHost(Protocol):
    """What these calls need of `Ec2Cloud` (its transport)."""

    endpoint: str
    _region: str

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]: ...

    async def _pages(
        self, operation: str, key: str, page_size: int | None = None, **params: Any
    ) -> list[dict[str, Any]]: ...


def described(raw: Mapping[str, Any]) -> DescribedType:
    archs = tuple(raw.get("ProcessorInfo", {}).get("SupportedArchitectures", ()))
    return DescribedType(to_instance_type(raw, None), archs)


async def describe_types(host: TypesHost, names: Sequence[str]) -> dict[str, DescribedType]:
    """The named types, in batches of EC2's limit. Raises ConfigurationError naming the types the region
    does not offer, EndpointError when EC2 cannot be asked."""
    out: dict[str, DescribedType] = {}
    for batch in chunks(list(dict.fromkeys(names)), DESCRIBE_TYPES_BATCH):
        try:
            result = await host._call("describe_instance_types", InstanceTypes=batch)
        except ClientError as exc:
            if error_code(exc) in UNKNOWN_TYPE_CODES:
                raise _not_offered(host, _named_in(error_message(exc), batch)) from None
            raise to_endpoint_error(host.endpoint, "DescribeInstanceTypes", exc) from None
        except BotoCoreError as exc:
            raise to_endpoint_error(host.endpoint, "DescribeInstanceTypes", exc) from None
        out.update({raw["InstanceType"]: described(raw) for raw in result.get("InstanceTypes", ())})
    missing = [n for n in names if n not in out]
    if missing:
        raise _not_offered(host, missing)
    return out


async def offered_types(host: TypesHost) -> dict[str, DescribedType]:
    """Every type the region offers (hundreds: every page of DescribeInstanceTypes)."""
    try:
        raws = await host._pages("describe_instance_types", "InstanceTypes", page_size=TYPES_PAGE)
    except (ClientError, BotoCoreError) as exc:
        raise to_endpoint_error(host.endpoint, "DescribeInstanceTypes", exc) from None
    return {raw["InstanceType"]: described(raw) for raw in raws}


def _named_in(message: str, batch: Sequence[str]) -> list[str]:
    """The names of `batch` that EC2's error message quotes (all of them when it quotes none)."""
    quoted = [n for n in batch if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", message)]
    return quoted or list(batch)


def _not_offered(host: TypesHost, names: Sequence[str]) -> ConfigurationError:
    return ConfigurationError(
        f"{SETTING}: EC2 in {host._region} ({host.endpoint}) does not offer instance type(s) "
        f"{', '.join(names)}: use types that `aws ec2 describe-instance-types` lists there"
    )


async def check_images(host: TypesHost, amis: Mapping[str, str], types: Mapping[str, DescribedType]) -> None:
    """Each type's AMI exists and is built for an architecture the type runs; else ConfigurationError,
    one line naming the type and the AMI. `amis`: type name -> AMI id. An AMI whose architecture EC2
    does not say is not judged."""
    ids = sorted(set(amis.values()))
    try:
        images = await host._pages("describe_images", "Images", ImageIds=ids) if ids else []
    except ClientError as exc:
        if error_code(exc).startswith("InvalidAMIID"):
            raise ConfigurationError(f"{SETTING}: {error_message(exc)}: check each type's ami_id") from None
        raise to_endpoint_error(host.endpoint, "DescribeImages", exc) from None
    except BotoCoreError as exc:
        raise to_endpoint_error(host.endpoint, "DescribeImages", exc) from None
    arch = {image["ImageId"]: str(image.get("Architecture") or "") for image in images}
    for name, ami in amis.items():
        if ami not in arch:
            raise ConfigurationError(f"{SETTING}: the AMI {ami} of {name} does not exist in {host._region}")
        runs = types[name].architectures if name in types else ()
        if arch[ami] and runs and arch[ami] not in runs:
            raise ConfigurationError(
                f"{SETTING}: {name} runs {'/'.join(runs)} but its AMI {ami} is built for {arch[ami]}: "
                f"give {name} an {runs[0]} AMI"
            )
