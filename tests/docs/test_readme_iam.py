"""The README's quick start names every IAM action of the daemon's policy (`docker/iam-policy.json`) and
no action the policies do not grant, so an operator who reads only the quick start knows what the daemon
will ask AWS for. Which actions the product really sends is checked by `tests/audit/test_iam_policy.py`
(against the requests the suite sends to its local EC2); this one keeps the prose in step with the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCKER = ROOT / "docker"
ACTION = re.compile(r"`((?:ec2|pricing|sqs|iam):[A-Za-z]+)`")


def _actions(policy: Path) -> set[str]:
    out: set[str] = set()
    for statement in json.loads(policy.read_text())["Statement"]:
        action = statement["Action"]
        out.update([action] if isinstance(action, str) else action)
    return out


def _quick_start() -> str:
    text = README.read_text()
    start = text.index("## Quick start on AWS")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_quick_start_names_every_action_of_the_daemon_policy_and_no_other() -> None:
    named = set(ACTION.findall(_quick_start()))
    daemon = _actions(DOCKER / "iam-policy.json")
    granted = set().union(*(_actions(p) for p in DOCKER.glob("iam-*policy.json")))
    assert {"pricing:GetProducts", "ec2:DescribeInstanceTypes", "ec2:DescribeImages"} <= daemon
    assert not daemon - named, f"README quick start: the daemon's actions not named: {sorted(daemon - named)}"
    assert not named - granted, (
        f"README quick start names actions no policy grants: {sorted(named - granted)}"
    )
