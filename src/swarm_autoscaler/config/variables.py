"""Every documented variable, of the daemon and of the keeper: the one list the env template, the
settings reference and the unknown-variable warnings are made from.

It sits above `settings` and `keeper` (the keeper's settings build on the daemon's), so that neither
of them needs to import the other late.
"""

from __future__ import annotations

import difflib
import os

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from swarm_autoscaler.config.keeper import KeeperSettings
from swarm_autoscaler.config.settings import GROUPS, PREFIX, Settings, env_name


def variables() -> list[tuple[str, type[BaseSettings], str, FieldInfo]]:
    """Every documented variable as (environment name, group class, field name, field), in order."""
    out: list[tuple[str, type[BaseSettings], str, FieldInfo]] = []
    classes: list[type[BaseSettings]] = [Settings, *GROUPS.values(), KeeperSettings]
    for cls in classes:
        for name, field in cls.model_fields.items():
            if cls is Settings and name in GROUPS:
                continue
            out.append((env_name(cls, name), cls, name, field))
    return out


def unknown_variables(env_file: str | os.PathLike[str] | None = None) -> list[str]:
    """Warnings for `AUTOSCALER_*` variables that no setting reads (usually typos), with a suggestion."""
    from dotenv import dotenv_values

    names = {key.upper() for key in os.environ}
    if env_file is not None and os.path.isfile(env_file):
        names |= {key.upper() for key in dotenv_values(env_file)}
    known = {name for name, *_ in variables()}
    warnings = []
    for name in sorted(n for n in names if n.startswith(PREFIX) and n not in known):
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.append(f"{name} is not a known variable and is ignored{hint}")
    return warnings
