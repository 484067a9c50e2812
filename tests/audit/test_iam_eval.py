"""The policy evaluator (`iam_eval`) on both sides of each rule it implements, with the outcomes AWS
documents (IAM User Guide: policy evaluation logic, condition operators, multivalued context keys)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.audit.iam_eval import ALLOW, DENY, IMPLICIT, Request, decide

R = "arn:aws:ec2:us-east-1:123456789012:instance/i-1"


def allow(
    condition: dict[str, Any] | None = None, action: str = "ec2:CreateTags", resource: str = "*"
) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": "Allow", "Action": action, "Resource": resource}
    if condition is not None:
        statement["Condition"] = condition
    return {"Statement": [statement]}


@pytest.mark.parametrize(
    ("condition", "context", "expected"),
    [
        ({"StringEquals": {"aws:RequestTag/owner": "us"}}, {"aws:RequestTag/owner": ["us"]}, ALLOW),
        ({"StringEquals": {"aws:RequestTag/owner": "us"}}, {"aws:RequestTag/owner": ["them"]}, IMPLICIT),
        ({"StringEquals": {"aws:RequestTag/owner": "us"}}, {}, IMPLICIT),  # missing key: no match
        (
            {"StringEquals": {"aws:requesttag/owner": "us"}},
            {"aws:RequestTag/owner": ["us"]},
            ALLOW,
        ),  # key case
        (
            {"StringEquals": {"aws:RequestTag/owner": "us"}},
            {"aws:RequestTag/owner": ["US"]},
            IMPLICIT,
        ),  # value case
        (
            {"StringEquals": {"aws:RequestTag/owner": ["a", "us"]}},
            {"aws:RequestTag/owner": ["us"]},
            ALLOW,
        ),  # OR
        ({"StringEquals": {"a": "1", "b": "2"}}, {"a": ["1"], "b": ["3"]}, IMPLICIT),  # AND across keys
        ({"StringNotEquals": {"a": "1"}}, {"a": ["2"]}, ALLOW),
        ({"StringNotEquals": {"a": "1"}}, {"a": ["1"]}, IMPLICIT),
        ({"StringNotEquals": {"a": "1"}}, {}, ALLOW),  # a negated operator on a missing key matches
        ({"StringLike": {"a": "kc-*"}}, {"a": ["kc-12"]}, ALLOW),
        ({"StringLike": {"a": "kc-*"}}, {"a": ["xkc-12"]}, IMPLICIT),
        ({"StringLike": {"a": "k?"}}, {"a": ["k1"]}, ALLOW),
        ({"StringLike": {"a": "k?"}}, {"a": ["k12"]}, IMPLICIT),
        ({"StringLike": {"a": "[ab]"}}, {"a": ["a"]}, IMPLICIT),  # no character classes in IAM
        ({"StringEqualsIfExists": {"a": "1"}}, {}, ALLOW),
        ({"StringEqualsIfExists": {"a": "1"}}, {"a": ["2"]}, IMPLICIT),
        ({"Null": {"a": "true"}}, {}, ALLOW),
        ({"Null": {"a": "true"}}, {"a": ["x"]}, IMPLICIT),
        ({"Null": {"a": "false"}}, {"a": ["x"]}, ALLOW),
        ({"Null": {"a": "false"}}, {}, IMPLICIT),  # the key absent: "false" (it is present) fails
        (
            {"Null": {"ec2:Attribute/InstanceType": "false"}},
            {"EC2:attribute/instancetype": ["p5.48xlarge"]},
            ALLOW,
        ),
        ({"ForAllValues:StringLike": {"aws:TagKeys": "sa/*"}}, {"aws:TagKeys": ["sa/x", "sa/y"]}, ALLOW),
        ({"ForAllValues:StringLike": {"aws:TagKeys": "sa/*"}}, {"aws:TagKeys": ["sa/x", "Name"]}, IMPLICIT),
        ({"ForAllValues:StringLike": {"aws:TagKeys": "sa/*"}}, {}, ALLOW),  # vacuously true
        ({"ForAllValues:StringNotEquals": {"aws:TagKeys": "sa/cluster"}}, {"aws:TagKeys": ["sa/x"]}, ALLOW),
        (
            {"ForAllValues:StringNotEquals": {"aws:TagKeys": "sa/cluster"}},
            {"aws:TagKeys": ["sa/x", "sa/cluster"]},
            IMPLICIT,
        ),
        (
            {"ForAnyValue:StringEquals": {"aws:TagKeys": "sa/cluster"}},
            {"aws:TagKeys": ["x", "sa/cluster"]},
            ALLOW,
        ),
        ({"ForAnyValue:StringEquals": {"aws:TagKeys": "sa/cluster"}}, {"aws:TagKeys": ["x"]}, IMPLICIT),
        ({"ForAnyValue:StringEquals": {"aws:TagKeys": "sa/cluster"}}, {}, IMPLICIT),
        (
            {"ArnLike": {"aws:SourceArn": "arn:aws:sqs:*:*:q"}},
            {"aws:SourceArn": ["arn:aws:sqs:eu-west-1:1:q"]},
            ALLOW,
        ),
    ],
)
def test_condition_operators(condition: dict[str, Any], context: dict[str, list[str]], expected: str) -> None:
    assert decide(allow(condition), Request("ec2:CreateTags", R, context)) == expected


def test_actions_are_case_insensitive_and_resources_match_their_wildcards() -> None:
    assert (
        decide(
            allow(action="ec2:createtags", resource="arn:aws:ec2:*:*:instance/*"),
            Request("ec2:CreateTags", R),
        )
        == ALLOW
    )
    assert decide(allow(action="ec2:Create*"), Request("ec2:CreateTags", R)) == ALLOW
    assert decide(allow(action="ec2:CreateTags"), Request("ec2:DeleteTags", R)) == IMPLICIT
    assert decide(allow(resource="arn:aws:ec2:*:*:volume/*"), Request("ec2:CreateTags", R)) == IMPLICIT


def test_an_explicit_deny_wins_over_any_allow() -> None:
    policy = allow()
    policy["Statement"].append(
        {"Effect": "Deny", "Action": "ec2:*", "Resource": "*", "Condition": {"StringNotEquals": {"a": "1"}}}
    )
    assert decide(policy, Request("ec2:CreateTags", R, {"a": ["2"]})) == DENY
    assert decide(policy, Request("ec2:CreateTags", R, {"a": ["1"]})) == ALLOW


def test_an_operator_the_evaluator_does_not_implement_is_an_error_not_a_verdict() -> None:
    with pytest.raises(ValueError, match="NumericLessThan"):
        decide(allow({"NumericLessThan": {"a": "1"}}), Request("ec2:CreateTags", R, {"a": ["0"]}))
    with pytest.raises(ValueError, match="single-valued"):
        decide(
            allow({"StringEquals": {"aws:TagKeys": "x"}}),
            Request("ec2:CreateTags", R, {"aws:TagKeys": ["x", "y"]}),
        )


A_ARN = "arn:aws:ec2:us-east-1:123456789012:instance/i-a"
B_ARN = "arn:aws:ec2:us-east-1:123456789012:instance/i-b"
SAME_PRIMARY = {"StringEquals": {"aws:ResourceTag/sa/primary": "${ec2:SourceInstanceARN}"}}


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"ec2:SourceInstanceARN": [A_ARN], "aws:ResourceTag/sa/primary": [A_ARN]}, ALLOW),
        ({"ec2:SourceInstanceARN": [A_ARN], "aws:ResourceTag/sa/primary": [B_ARN]}, IMPLICIT),
        ({"ec2:sourceinstancearn": [A_ARN], "aws:ResourceTag/sa/primary": [A_ARN]}, ALLOW),  # key case
        ({"ec2:SourceInstanceARN": [A_ARN]}, IMPLICIT),  # the resource carries no such tag
        # Credentials that are not an instance's: the variable resolves to nothing, whatever the tag says
        # (even a tag holding the variable's literal text).
        ({"aws:ResourceTag/sa/primary": [A_ARN]}, IMPLICIT),
        ({"aws:ResourceTag/sa/primary": ["${ec2:SourceInstanceARN}"]}, IMPLICIT),
        ({"ec2:SourceInstanceARN": [A_ARN.upper()], "aws:ResourceTag/sa/primary": [A_ARN]}, IMPLICIT),
    ],
)
def test_a_policy_variable_is_the_request_s_own_value(context: dict[str, list[str]], expected: str) -> None:
    assert decide(allow(SAME_PRIMARY), Request("ec2:CreateTags", R, context)) == expected


def test_a_policy_variable_use_the_evaluator_does_not_implement_is_an_error() -> None:
    context = {"ec2:SourceInstanceARN": [A_ARN], "a": [A_ARN]}
    for value in ("x-${ec2:SourceInstanceARN}", "${ec2:SourceInstanceARN, 'none'}"):
        with pytest.raises(ValueError, match="policy variable"):
            decide(allow({"StringEquals": {"a": value}}), Request("ec2:CreateTags", R, context))
