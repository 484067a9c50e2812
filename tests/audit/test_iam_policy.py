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

from swarm_autoscaler.adapters.ec2 import OWNER_TAG, OWNER_VALUE
from swarm_autoscaler_lab.localcloud.aws_actions import AWS_ACTION_LOG_ENV, read_action_log

pytestmark = pytest.mark.audit
DOCKER = Path(__file__).resolve().parents[2] / "docker"
POLICY = DOCKER / "iam-policy.json"
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
