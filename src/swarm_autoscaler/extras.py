"""Optional parts of the package and the extra that installs each.

The runtime (`run`, `plan`, `status`) needs none of them. A command that needs one checks first with
`require_extras` and, when a module is missing, exits with status 2 after one line naming the extra to
install; `missing_extra_of` turns a late `ModuleNotFoundError` into the same line.
"""

from __future__ import annotations

import importlib.util
import sys

EXIT_MISSING_EXTRA = 2

# extra -> the top-level modules it brings
EXTRAS: dict[str, tuple[str, ...]] = {
    "local": ("moto", "boto3"),
    "sim": ("matplotlib",),
    "debug": ("debugpy",),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: blocked with sys.modules[name] = None
        return False


def missing_extras(*extras: str) -> list[str]:
    """The extras among `extras` of which some module cannot be imported (finds, never imports)."""
    return [extra for extra in extras if not all(_importable(m) for m in EXTRAS[extra])]


def install_line(command: str, extras: list[str]) -> str:
    names = ",".join(extras)
    return f"error: `swarm-autoscaler {command}` needs the [{names}] extra: pip install 'swarm-autoscaler[{names}]'"


def require_extras(command: str, *extras: str) -> None:
    """Return when every module of `extras` is importable; else print one line and exit 2."""
    missing = missing_extras(*extras)
    if missing:
        print(install_line(command, missing), file=sys.stderr)
        raise SystemExit(EXIT_MISSING_EXTRA)


def missing_extra_of(exc: ModuleNotFoundError) -> str | None:
    """The extra that would have provided the module `exc` failed to import, if any."""
    top = (exc.name or "").split(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)
