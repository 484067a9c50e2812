"""The folders are the layers: the core imports nothing outside itself (no SDK, no I/O), and vendor SDKs
are imported by the adapters and the local cloud (and the demo, a dask user) alone."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "swarm_autoscaler"
STDLIB_FOR_CORE = {"__future__", "collections", "dataclasses", "enum", "heapq", "math", "types", "typing"}
VENDORS = {"aiobotocore", "botocore", "boto3", "aiodocker", "distributed", "redis", "moto"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_core_imports_only_itself_and_plain_stdlib() -> None:
    files = sorted((PKG / "core").glob("*.py"))
    assert len(files) > 10
    for path in files:
        for name in _imports(path):
            ok = name.startswith("swarm_autoscaler.core") or name.split(".")[0] in STDLIB_FOR_CORE
            assert ok, f"{path.name} imports {name}: the core stays pure"


def test_vendor_sdks_only_in_adapters_and_localcloud() -> None:
    # The demo is a dask user (it submits work), and the CLI quiets distributed's loggers for the demo.
    allowed = {"adapters", "localcloud", "demo", "cli.py"}
    checked = 0
    for path in sorted(PKG.rglob("*.py")):
        layer = path.relative_to(PKG).parts[0]
        for name in _imports(path):
            if name.split(".")[0] in VENDORS:
                assert layer in allowed, f"{path.relative_to(PKG)} imports {name}"
        checked += 1
    assert checked > 50
