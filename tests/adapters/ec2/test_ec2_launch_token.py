"""The launch-token check's rules (`adapters/ec2_launch_token`), on instance records in DescribeInstances'
shape: no EC2 here. These records stand for what EC2 answers (an instance with its `ClientToken` and
tags); the same rules are exercised against moto's answers in `test_ec2_identity.py` and
`test_keeper_identity.py`. The fail-safe's record stands for an EC2 that would not return a launch's
token with its instance (moto and, per its API reference, EC2 do)."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from swarm_autoscaler.adapters.ec2_launch_token import (
    LAUNCH_TOKEN_TAG,
    LaunchTokens,
    copied,
    with_launch_token,
)


def record(instance_id: str, token: str | None, tag: str | None) -> dict[str, Any]:
    tags = [{"Key": "managed-by", "Value": "swarm-autoscaler"}]
    if tag is not None:
        tags.append({"Key": LAUNCH_TOKEN_TAG, "Value": tag})
    raw: dict[str, Any] = {"InstanceId": instance_id, "Tags": tags}
    if token is not None:
        raw["ClientToken"] = token
    return raw


def test_the_token_goes_in_the_call_and_in_the_instance_s_tags_only() -> None:
    call = {
        "MinCount": 1,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": [{"Key": "managed-by", "Value": "swarm-autoscaler"}]},
            {"ResourceType": "volume", "Tags": [{"Key": "managed-by", "Value": "swarm-autoscaler"}]},
        ],
    }
    sent = with_launch_token(call, "kc-1-t1")
    assert sent["ClientToken"] == "kc-1-t1" and sent["MinCount"] == 1
    instance, volume = sent["TagSpecifications"]
    assert {"Key": LAUNCH_TOKEN_TAG, "Value": "kc-1-t1"} in instance["Tags"]
    assert volume == call["TagSpecifications"][1]  # the volume is never taken for a machine
    assert "ClientToken" not in call and len(call["TagSpecifications"][0]["Tags"]) == 1  # input untouched


def test_a_machine_is_a_copy_only_when_it_carries_the_tag_and_another_token() -> None:
    assert copied(record("i-1", "t1", "t1")) is None  # ours
    assert copied(record("i-2", "ABCDE", None)) is None  # launched before the tag existed
    assert copied(record("i-3", None, None)) is None
    why = copied(record("i-4", "console-42", "t1"))
    assert why is not None and "console-42" in why and "t1" in why
    assert copied(record("i-5", None, "t1")) is not None  # no token at all is not the tag's


def test_each_copy_is_logged_once_and_the_check_turns_itself_off_when_ec2_does_not_echo_tokens() -> None:
    tokens = LaunchTokens()
    with capture_logs() as logs:
        assert tokens.foreign(record("i-4", "console-42", "t1"))
        assert tokens.foreign(record("i-4", "console-42", "t1"))
        assert not tokens.foreign(record("i-1", "t1", "t1"))
        tokens.answered([record("i-1", "t1", "t1")])  # our own launch, echoed: the check stays on
        assert tokens.checking
        tokens.answered([record("i-9", "", "t9")])  # our own launch answered without its token
        assert not tokens.checking
        assert not tokens.foreign(record("i-4", "console-42", "t1"))  # off: tags alone, as before
    assert [(e["log_level"], e.get("instance_id")) for e in logs] == [("warning", "i-4"), ("error", "i-9")]
