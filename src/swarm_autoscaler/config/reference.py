"""The settings reference page (`docs/reference/settings.md`), generated from the settings models.

Every `AUTOSCALER_*` and `AUTOSCALER_KEEPER_*` variable with its type (and bounds), default, meaning and
an example, grouped as the models group them. `scripts/gen_env_template.py` writes it with
`.env.template`; a test fails when either differs from the models.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from swarm_autoscaler.config.doc import _default, _example, _title, required_when, template_value
from swarm_autoscaler.config.types import DurationMark
from swarm_autoscaler.config.variables import variables

REGENERATE = ".venv/bin/python scripts/gen_env_template.py"

# Examples of variables whose model gives none and whose default says little (unset or empty).
EXAMPLES = {
    "AUTOSCALER_EC2_ENDPOINT": "http://127.0.0.1:5000",
    "AUTOSCALER_EC2_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AUTOSCALER_EC2_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AUTOSCALER_EC2_SUBNET_IDS": "subnet-0a1b2c3d,subnet-4e5f6a7b",
    "AUTOSCALER_EC2_SECURITY_GROUP_IDS": "sg-0123456789abcdef0",
    "AUTOSCALER_EC2_KEY_NAME": "ops",
    "AUTOSCALER_EC2_IAM_INSTANCE_PROFILE": "swarm-worker",
    "AUTOSCALER_EC2_CUSTOM_TAGS": '{"team": "data", "cost-center": "42"}',
    "AUTOSCALER_REDIS_URL": "redis://:password@redis:6379/0",
    "AUTOSCALER_DEBUGPY_PORT": "5678",
    "AUTOSCALER_KEEPER_PRIMARY_BOOT_TEMPLATE": '"$(cat primary-boot.sh)"',
    "AUTOSCALER_KEEPER_PRIMARY_IAM_INSTANCE_PROFILE": "swarm-primary",
}

_HEADER = f"""\
# Settings reference

<!-- Generated from the settings models by `{REGENERATE}`: do not edit by hand. -->

Every setting is an environment variable, or a line of an env file (`--env-file .env`; the environment
wins). This page, `.env.template` and `swarm-autoscaler env-template` are generated from the settings
models, so they cannot drift from the code: a test fails when they differ. After adding or changing a
setting, regenerate both files with `{REGENERATE}`.

Durations accept `30`, `30s`, `5m`, `1h30m` or `250ms`. JSON values are written as they are in the
environment; in an env file read by docker (`env_file:` of a stack), write them without the surrounding
quotes that `.env.template` shows. How the values are checked at start-up: [Configuration](../configuration.md).

The daemon (`run`, `plan`, `status`) reads every group but the keeper's. The keeper reads its own
`AUTOSCALER_KEEPER_*` group, the EC2 access variables (endpoint, region, credentials, subnets, security
groups, key, instance profile, custom tags), `AUTOSCALER_REDIS_URL`, `AUTOSCALER_LOG_*` and
`AUTOSCALER_HTTP_HOST`, and nothing else.
"""


def _unwrapped(annotation: Any) -> Any:
    """The annotation without `None` alternatives and without `Annotated` metadata."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = rest[0] if len(rest) == 1 else annotation
            if len(rest) != 1:
                return annotation
        else:
            return annotation


_NAMES: dict[Any, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    SecretStr: "secret",
}


def _base_type(field: FieldInfo) -> str:
    if any(isinstance(mark, DurationMark) for mark in field.metadata):
        return "duration"
    annotation = _unwrapped(field.annotation)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin is tuple:
        return "JSON list of objects"
    if origin is list:
        return "list of strings (JSON list or comma separated)"
    if origin is dict:
        value = typing.get_args(annotation)[1]
        return "JSON object of strings" if value is str else "JSON object: instance type name -> its options"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def type_of(field: FieldInfo) -> str:
    """The type as the reference shows it, with its bounds (`integer, 0 to 10000`)."""
    low = high = None
    for mark in field.metadata:
        if isinstance(mark, annotated_types.Ge):
            low = f"{mark.ge}"
        elif isinstance(mark, annotated_types.Gt):
            low = f"more than {mark.gt}"
        elif isinstance(mark, annotated_types.Le):
            high = f"{mark.le}"
    base = _base_type(field)
    if low is not None and high is not None and not low.startswith("more"):
        return f"{base}, {low} to {high}"
    if low is not None:
        return f"{base}, {low if low.startswith('more') else 'at least ' + low}"
    if high is not None:
        return f"{base}, at most {high}"
    return base


def example_of(name: str, field: FieldInfo) -> str:
    return _example(field) or EXAMPLES.get(name) or (_default(field) or "")


def _code(value: str) -> str:
    return f"`` {value} ``" if "`" in value else f"`{value}`"


def settings_reference() -> str:
    """The Markdown text of `docs/reference/settings.md`."""
    rows = ["| Variable | Type | Default |", "| --- | --- | --- |"]
    sections: list[str] = []
    group = None
    for name, cls, _, field in variables():
        if cls is not group:
            group = cls
            sections.append(f"## {_title(cls)}\n")
        default = _default(field)
        shown = "**required**" if default is None else (_code(default) if default else "unset")
        if when := required_when(field):
            shown = f"**required** when {_code(when)}"
        anchor = name.lower()
        rows.append(f"| [`{name}`](#{anchor}) | {type_of(field)} | {shown} |")
        example = example_of(name, field)
        lines = [f"### `{name}`", "", field.description or "", "", f"- Type: {type_of(field)}"]
        preset = template_value(field)
        lines.append(f"- Default: {shown}" + (f" (`.env.template` sets {_code(preset)})" if preset else ""))
        if example:
            lines.append(f"- Example: {_code(f'{name}={example}')}")
        sections.append("\n".join(lines) + "\n")
    summary = "## Every variable\n\n" + "\n".join(rows) + "\n"
    return "\n".join([_HEADER, summary, *sections]).rstrip("\n") + "\n"
