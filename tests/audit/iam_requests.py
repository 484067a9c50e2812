"""One EC2 query request (its action and form parameters, as it reached the local EC2) turned into the
authorizations AWS makes for it, each with its request context, as the EC2 and IAM documentation
describe them:

- `RunInstances` is authorized once per resource it uses or creates: the instance and its volumes (with
  `aws:RequestTag/*` and `aws:TagKeys` from that resource type's tag specification), its network
  interface, subnet, security groups, image, key pair, and the spot request for a spot launch; tags given
  at launch are also a `CreateTags` on the instance and the volume with `ec2:CreateAction=RunInstances`;
  an instance profile is an `iam:PassRole` of its role with `iam:PassedToService=ec2.amazonaws.com`;
- `CreateTags` on existing instances: one per resource, with its current tags (`aws:ResourceTag/*`),
  the requested ones and their keys;
- `TerminateInstances`, `StopInstances`, `StartInstances`, `ModifyInstanceAttribute`: one per instance,
  with its current tags; a `ModifyInstanceAttribute` also carries the attribute it sets as
  `ec2:Attribute/<Name>` = the value (the Service Authorization Reference: "ec2:Attribute/${AttributeName}:
  filters access by an attribute being set on a resource"), whether sent as `<Name>.Value` or as the
  generic `Attribute=<name>&Value=...`; user data too, so a policy is shown to allow the warm pool's
  rewrite even when AWS puts that key in the context;
- `Describe*`: resource `*`, no condition key.

`tags_of(instance_id)` gives an instance's tags at the time of the request (from moto).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from tests.audit.iam_eval import Request

REGION, ACCOUNT = "us-east-1", "123456789012"
EC2 = f"arn:aws:ec2:{REGION}:{ACCOUNT}:"
TagsOf = Callable[[str], Mapping[str, str]]


def _numbered(params: Mapping[str, str], prefix: str) -> list[str]:
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)$")
    found = sorted((int(m.group(1)), v) for k, v in params.items() if (m := pattern.match(k)))
    return [v for _, v in found]


def _tags(params: Mapping[str, str], prefix: str) -> dict[str, str]:
    keys = {
        k[len(prefix) :].split(".")[1]: v
        for k, v in params.items()
        if re.match(re.escape(prefix) + r"\.\d+\.Key$", k)
    }
    return {v: params.get(f"{prefix}.{n}.Value", "") for n, v in keys.items()}


def _spec_tags(params: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Tag specifications by resource type."""
    specs: dict[str, dict[str, str]] = {}
    for key, kind in params.items():
        m = re.match(r"TagSpecification\.(\d+)\.ResourceType$", key)
        if m:
            specs[kind] = _tags(params, f"TagSpecification.{m.group(1)}.Tag")
    return specs


def tag_context(prefix: str, tags: Mapping[str, str]) -> dict[str, list[str]]:
    context = {f"{prefix}/{k}": [v] for k, v in tags.items()}
    if prefix == "aws:RequestTag":
        context["aws:TagKeys"] = list(tags)
    return context


def _run_instances(params: Mapping[str, str], role_of: Callable[[str], str]) -> list[Request]:
    specs = _spec_tags(params)
    out = []
    for kind in ("instance", "volume"):
        tags = specs.get(kind, {})
        out.append(Request("ec2:RunInstances", f"{EC2}{kind}/*", tag_context("aws:RequestTag", tags)))
        if tags:
            context = {**tag_context("aws:RequestTag", tags), "ec2:CreateAction": ["RunInstances"]}
            out.append(Request("ec2:CreateTags", f"{EC2}{kind}/*", context))
    out.append(Request("ec2:RunInstances", f"{EC2}network-interface/*"))
    out.append(Request("ec2:RunInstances", f"{EC2}subnet/{params.get('SubnetId', '*')}"))
    for group in _numbered(params, "SecurityGroupId") or ["*"]:
        out.append(Request("ec2:RunInstances", f"{EC2}security-group/{group}"))
    out.append(Request("ec2:RunInstances", f"arn:aws:ec2:{REGION}::image/{params.get('ImageId', '*')}"))
    if "KeyName" in params:
        out.append(Request("ec2:RunInstances", f"{EC2}key-pair/{params['KeyName']}"))
    if params.get("InstanceMarketOptions.MarketType") == "spot":
        out.append(Request("ec2:RunInstances", f"{EC2}spot-instances-request/*"))
    profile = (
        params.get("IamInstanceProfile.Name") or params.get("IamInstanceProfile.Arn", "").rpartition("/")[2]
    )
    if profile:
        role = f"arn:aws:iam::{ACCOUNT}:role/{role_of(profile)}"
        out.append(Request("iam:PassRole", role, {"iam:PassedToService": ["ec2.amazonaws.com"]}))
    return out


# ModifyInstanceAttribute's attributes of one value (`<Name>.Value` on the wire); block devices are a list.
_ATTRIBUTES = (
    "InstanceType", "UserData", "DisableApiTermination", "DisableApiStop", "InstanceInitiatedShutdownBehavior",
    "SourceDestCheck", "EbsOptimized", "EnaSupport", "SriovNetSupport", "Kernel", "Ramdisk",
)  # fmt: skip


def attribute_context(params: Mapping[str, str]) -> dict[str, list[str]]:
    """The `ec2:Attribute/<Name>` keys of one ModifyInstanceAttribute request (see the module docstring)."""
    context = {f"ec2:Attribute/{n}": [params[f"{n}.Value"]] for n in _ATTRIBUTES if f"{n}.Value" in params}
    devices = [v for k, v in params.items() if re.match(r"BlockDeviceMapping\.\d+\.DeviceName$", k)]
    if devices:
        context["ec2:Attribute/BlockDeviceMapping"] = devices
    generic = params.get("Attribute")
    if generic:
        context[f"ec2:Attribute/{generic[:1].upper()}{generic[1:]}"] = [params.get("Value", "")]
    return context


def authorizations(
    action: str, params: Mapping[str, str], tags_of: TagsOf, role_of: Callable[[str], str] = lambda p: p
) -> list[Request]:
    """What AWS authorizes for one EC2 request (see the module docstring). `role_of(profile)`: the role
    an instance profile holds."""
    if action == "RunInstances":
        return _run_instances(params, role_of)
    if action == "CreateTags":
        requested = _tags(params, "Tag")
        return [
            Request(
                "ec2:CreateTags",
                f"{EC2}instance/{rid}",
                {**tag_context("aws:ResourceTag", tags_of(rid)), **tag_context("aws:RequestTag", requested)},
            )
            for rid in _numbered(params, "ResourceId")
        ]
    if action in ("TerminateInstances", "StopInstances", "StartInstances", "ModifyInstanceAttribute"):
        ids = _numbered(params, "InstanceId") or [params["InstanceId"]]
        setting = attribute_context(params) if action == "ModifyInstanceAttribute" else {}
        return [
            Request(
                f"ec2:{action}",
                f"{EC2}instance/{i}",
                {**tag_context("aws:ResourceTag", tags_of(i)), **setting},
            )
            for i in ids
        ]
    if action.startswith("Describe"):
        return [Request(f"ec2:{action}", "*")]
    raise ValueError(f"no IAM translation for ec2:{action}: add one before the product sends it")
