"""The IAM policies an operator attaches (`docker/iam-policy.json` for the daemon,
`docker/iam-keeper-policy.json`, `docker/iam-primary-policy.json`) list, together, exactly the AWS actions
the product sent during this test run: none missing (the daemon or keeper would be refused on AWS), none
never used. Their conditions are evaluated against real and forged requests in `test_iam_conditions.py`.

The actions are recorded where they arrive, at the local EC2 of every test (see
`swarm_autoscaler_lab.localcloud.aws_actions`), so this runs after the rest of the suite: `make test`
points its runs at one log and then runs `pytest -m audit`. Run alone it fails, naming how to run it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from swarm_autoscaler.adapters.ec2 import CLUSTER_TAG, OWNER_TAG, OWNER_VALUE, PRIMARY_TAG
from swarm_autoscaler_lab.localcloud.aws_actions import (
    AWS_ACTION_LOG_ENV,
    read_action_log,
    read_request_shapes,
)

pytestmark = pytest.mark.audit
DOCKER = Path(__file__).resolve().parents[2] / "docker"
POLICY = DOCKER / "iam-policy.json"
SOURCE = "ec2:SourceInstanceARN"  # AWS sets it on requests signed with an instance profile's credentials
POLICIES = (POLICY, DOCKER / "iam-keeper-policy.json", DOCKER / "iam-primary-policy.json")


def _statements() -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    for path in POLICIES:
        statements += json.loads(path.read_text())["Statement"]
    return [s for s in statements if s["Effect"] == "Allow"]


def _listed() -> set[str]:
    listed: set[str] = set()
    for statement in _statements():
        action = statement["Action"]
        listed.update([action] if isinstance(action, str) else action)
    return listed


def test_the_policy_lists_every_action_the_suite_sent_and_no_other() -> None:
    path = os.environ.get(AWS_ACTION_LOG_ENV)
    if not path or not Path(path).exists():
        pytest.fail(f"no action log: run the suite through `make test` (it sets {AWS_ACTION_LOG_ENV})")
    sent, listed = read_action_log(Path(path)), _listed()
    print(f"\nactions the product sent: {len(sent)}; listed in {POLICY.name}: {len(listed)}")
    for name in sorted(sent | listed):
        print(f"  {name:32} sent={name in sent} listed={name in listed}")

    names = ", ".join(p.name for p in POLICIES)
    assert not sent - listed, f"sent but missing from {names}: {sorted(sent - listed)}"
    assert not listed - sent, f"listed in {names} but never sent by the suite: {sorted(listed - sent)}"


def test_disruptive_actions_are_allowed_only_on_machines_with_our_ownership_tag() -> None:
    """Names only (the conditions are evaluated in `test_iam_conditions.py`): every statement that allows a
    disruptive action requires the ownership tag on the resource."""
    disruptive = {
        "ec2:TerminateInstances",
        "ec2:StopInstances",
        "ec2:StartInstances",
        "ec2:ModifyInstanceAttribute",
    }
    for statement in _statements():
        actions = statement["Action"]
        if disruptive & set([actions] if isinstance(actions, str) else actions):
            assert statement["Condition"]["StringEquals"][f"aws:ResourceTag/{OWNER_TAG}"] == OWNER_VALUE


def _tags(record: dict[str, Any]) -> dict[str, str]:
    """The tags a recorded request asks for and those of the instances it names."""
    params = record["params"]
    tags: dict[str, str] = {}
    for key, value in params.items():
        if key.endswith(".Key"):
            tags[value] = params.get(key[: -len("Key")] + "Value", "")
    for held in record["resource_tags"].values():
        tags.update(held)
    return tags


def _roles(record: dict[str, Any]) -> tuple[set[str], dict[str, str]]:
    """Which roles may have sent a recorded request (by the tags it asks for or touches), and the names
    that fill their policies' placeholders (taken from those tags: each test has names of its own)."""
    tags = _tags(record)
    names = {
        "CLUSTER_NAME": tags.get(CLUSTER_TAG, "*"),
        "KEEPER_NAME": tags.get("swarm-autoscaler/keeper") or tags.get("swarm-autoscaler-keeper") or "*",
        "QUEUE_NAME": "*",
        "WORKER_ROLE": "*",
        "PRIMARY_ROLE": "*",
    }
    if "swarm-autoscaler/keeper" in tags:
        return {"keeper"}, names
    if "swarm-autoscaler-keeper" in tags:
        return {"keeper", "primary"}, names
    return {"daemon"}, names


def test_every_request_shape_the_suite_sent_is_allowed_by_its_role_s_policy() -> None:
    """The conditions, against the suite's own requests: every kind of EC2 request the product sent
    (recorded with the tags it asked for and the tags of the instances it named, `aws_actions`) is
    allowed by the policy of a role that may send it. The names (cluster, keeper) come from the request,
    so this checks the conditions' shape (ownership tags, tag keys, create action, pass role to EC2);
    `test_iam_conditions.py` checks the names against forged requests."""
    from tests.audit.iam_eval import ALLOW, Request, decide
    from tests.audit.iam_requests import authorizations

    path = os.environ.get(AWS_ACTION_LOG_ENV)
    if not path or not Path(path).exists():
        pytest.fail(f"no action log: run the suite through `make test` (it sets {AWS_ACTION_LOG_ENV})")
    shapes = read_request_shapes(Path(path))
    assert shapes, "the action log has no request shapes beside it: the local EC2 recorded none"
    files = {"daemon": POLICY, "keeper": POLICIES[1], "primary": POLICIES[2]}
    refused = []
    for record in shapes:
        roles, names = _roles(record)
        held = record["resource_tags"]
        for request in authorizations(
            record["action"], record["params"], lambda i, held=held: held.get(i, {})
        ):
            verdicts = {}
            for role in roles:
                text = files[role].read_text()
                for name, value in names.items():
                    text = text.replace(f"@{name}@", value)
                signed = request
                if role == "primary":  # sent by the primary the request names (its autoscaler's own)
                    arn = [_tags(record).get(PRIMARY_TAG, "")]
                    signed = Request(request.action, request.resource, {**request.context, SOURCE: arn})
                verdicts[role] = decide(json.loads(text), signed)
            if ALLOW not in verdicts.values():
                refused.append((request, verdicts))
    print(f"\nrequest shapes evaluated: {len(shapes)}; refused authorizations: {len(refused)}")
    assert not refused, refused[:5]
