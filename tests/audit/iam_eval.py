"""A small evaluator of IAM identity policies: enough of AWS's rules to decide the requests the product
sends, and forged ones, against `docker/iam/*.json`.

moto evaluates no IAM condition, and no Python package on PyPI evaluates a request context against
conditions (parliament lints, policy-sentry writes, iam-ape flattens; the one full simulator,
@cloud-copilot/iam-simulate, is a Node library). So this implements what AWS documents, for the
operators the policies use, and refuses any other (a policy using one it does not know fails the test,
rather than being judged wrongly):

- a request is allowed when some Allow statement matches it and no Deny statement does (explicit deny
  wins; nothing matching is an implicit deny);
- a statement matches when its Action and Resource patterns match (`*` and `?` wildcards, actions
  case-insensitive) and every condition operator in it matches (AND across operators and keys, OR across
  a key's values);
- `StringEquals`, `StringNotEquals`, `StringLike`, `StringNotLike`, `ArnLike`, `ArnEquals`, `Null`, with
  the `ForAllValues:` / `ForAnyValue:` set qualifiers and the `...IfExists` suffix. A key absent from
  the request fails a positive operator, passes a negated one (`StringNotEquals`: AWS's rule for a
  missing key), passes `ForAllValues:` (vacuously) and fails `ForAnyValue:`;
- condition keys are matched case-insensitively by name (tag keys in `aws:RequestTag/<key>` included, as
  AWS does for the key part), values case-sensitively;
- policy variables in condition values (`${ec2:SourceInstanceARN}`, `${aws:username}`: IAM User Guide,
  "IAM policy elements: Variables and tags") are replaced by the request context's single value of that
  key. A variable whose key the request does not carry (credentials that are not an instance's, for
  `ec2:SourceInstanceARN`) resolves to nothing: that value matches no request value, so a positive
  operator built on it fails (AWS: the condition evaluates to false). A value that is not `${...}` as a
  whole, or a default (`${key, 'x'}`), is refused rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALLOW, DENY, IMPLICIT = "allow", "deny", "implicit-deny"


@dataclass(frozen=True)
class Request:
    """One authorization AWS makes: `action` (service:Name) on `resource` (an ARN or `*`), with the
    condition keys of the request context (each a list of values)."""

    action: str
    resource: str
    context: Mapping[str, Sequence[str]] = field(default_factory=dict)


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _like(pattern: str, value: str, *, case: bool = True) -> bool:
    """IAM's wildcards: `*` any run of characters, `?` one; nothing else is special."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, value, re.DOTALL | (0 if case else re.IGNORECASE)) is not None


def _one(operator: str, wanted: list[str], value: str) -> bool:
    if operator in ("StringEquals", "ArnEquals"):
        return value in wanted
    if operator in ("StringLike", "ArnLike"):
        return any(_like(p, value) for p in wanted)
    raise ValueError(f"condition operator {operator!r} is not one this evaluator implements")


_VARIABLE = re.compile(r"\$\{([^}]*)\}")


def resolve(wanted: list[str], context: Mapping[str, Sequence[str]]) -> list[str]:
    """`wanted` with each `${key}` replaced by the context's single value of `key` (see the module
    docstring); a variable whose key is absent (or multivalued) is dropped: it matches nothing."""
    lowered = {k.lower(): list(v) for k, v in context.items()}
    out = []
    for value in wanted:
        names = _VARIABLE.findall(value)
        if not names:
            out.append(value)
            continue
        whole = _VARIABLE.fullmatch(value)
        if whole is None or "," in whole.group(1) or len(names) != 1:
            raise ValueError(f"policy variable use {value!r} is not one this evaluator implements")
        found = lowered.get(whole.group(1).strip().lower(), [])
        if len(found) == 1:
            out.append(found[0])
    return out


_NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike", "ArnNotLike": "ArnLike"}


def _condition(operator: str, key: str, wanted: list[str], context: Mapping[str, Sequence[str]]) -> bool:
    lowered = {k.lower(): list(v) for k, v in context.items()}
    present = key.lower() in lowered
    values = lowered.get(key.lower(), [])
    qualifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    if base == "Null":
        return (not present) == (wanted[0].lower() == "true")
    if not present:
        if qualifier == "ForAllValues":
            return True
        if qualifier == "ForAnyValue":
            return False
        return if_exists or base in _NEGATED
    positive = _NEGATED.get(base, base)
    negate = base in _NEGATED
    if qualifier == "ForAllValues":
        return all(_one(positive, wanted, v) != negate for v in values)
    if qualifier == "ForAnyValue":
        return any(_one(positive, wanted, v) != negate for v in values)
    if qualifier:
        raise ValueError(f"set qualifier {qualifier!r} is not one this evaluator implements")
    if len(values) != 1:
        raise ValueError(f"{key} has {len(values)} values: a single-valued operator needs a set qualifier")
    return _one(positive, wanted, values[0]) != negate


def statement_matches(statement: Mapping[str, Any], request: Request) -> bool:
    if not any(_like(a, request.action, case=False) for a in _listed(statement["Action"])):
        return False
    if not any(_like(r, request.resource) for r in _listed(statement["Resource"])):
        return False
    for operator, keys in statement.get("Condition", {}).items():
        for key, wanted in keys.items():
            if not _condition(operator, key, resolve(_listed(wanted), request.context), request.context):
                return False
    return True


def decide(policy: Mapping[str, Any], request: Request) -> str:
    """`ALLOW`, `DENY` (an explicit Deny matched) or `IMPLICIT` (no Allow matched)."""
    matched = [s["Effect"] for s in policy["Statement"] if statement_matches(s, request)]
    if "Deny" in matched:
        return DENY
    return ALLOW if "Allow" in matched else IMPLICIT
