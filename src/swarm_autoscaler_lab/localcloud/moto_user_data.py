"""moto made to read a rewritten user data as EC2 does (ModifyInstanceAttribute `UserData.Value`).

On the wire `UserData.Value` is a blob: the client base64-encodes the raw script once and EC2 decodes it
once, storing the script (DescribeInstanceAttribute then returns it base64-encoded). moto (5.2) decodes the
blob and then insists that what it got is base64 *again*: it refuses the correctly encoded value
(`InvalidUserData.Malformed`) and accepts a doubly encoded one, storing base64 text that cloud-init would
not run. That is how a double encoding in the warm pool once passed every test.

`install()` replaces moto's handling of that one attribute (every other attribute, and RunInstances'
`UserData`, which is a plain base64 string on the wire, are left to moto): the decoded blob is stored as
it is, like EC2. A doubly encoded value is then stored as base64 text, and a machine booting from it runs
nothing, as on a real AMI. Idempotent; it patches moto's class for the whole process.
"""

from __future__ import annotations

import base64
from typing import Any

from moto.core.types import Base64EncodedString
from moto.ec2.responses.instances import InstanceResponse

_MARK = "_swarm_autoscaler_strict_user_data"


def _stored(value: Any) -> Base64EncodedString:
    """What EC2 keeps for a decoded blob (moto keeps user data base64-encoded)."""
    raw = value if isinstance(value, bytes) else str(value).encode()
    return Base64EncodedString(base64.b64encode(raw).decode("ascii"))


def install() -> None:
    """Patch moto's ModifyInstanceAttribute so that `UserData.Value` is read as EC2 reads it."""
    if getattr(InstanceResponse, _MARK, False):
        return
    original = InstanceResponse._dot_value_instance_attribute_handler

    def handler(self: InstanceResponse) -> bool:
        value = self._get_param("UserData.Value")
        if value is None:
            return bool(original(self))
        self.error_on_dryrun()
        instance_id = self._get_param("InstanceId")
        self.ec2_backend.modify_instance_attribute(instance_id, "user_data", _stored(value))
        return True

    InstanceResponse._dot_value_instance_attribute_handler = handler  # type: ignore[method-assign]
    setattr(InstanceResponse, _MARK, True)


def as_ec2_decodes(wire_value: str) -> str:
    """The user data EC2 stores for `wire_value` (a request's `UserData` or `UserData.Value` parameter,
    as it arrived): base64-decoded once, strictly (EC2 answers `InvalidUserData.Malformed` otherwise).
    This is what cloud-init then reads; a test compares it with what the machine must run."""
    return base64.b64decode(wire_value, validate=True).decode()
