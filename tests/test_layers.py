"""The folders are the layers. `ls src/` shows the product (`swarm_autoscaler`) apart from its lab
(`swarm_autoscaler_lab`); import-linter's contracts in pyproject.toml hold the direction of imports
(the product never imports the lab; shells over adapters over runtime and config over the core); the
core imports nothing outside itself (no SDK, no I/O); vendor SDKs are imported by the adapters and the
lab alone."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "swarm_autoscaler"
STDLIB_FOR_CORE = {"__future__", "collections", "dataclasses", "enum", "heapq", "math", "types", "typing"}
VENDORS = {"aiobotocore", "botocore", "boto3", "aiodocker", "distributed", "redis", "moto"}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=src,
        timeout=60,
        check=False,
    )


def test_src_shows_the_product_apart_from_its_lab() -> None:
    assert {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.endswith(".egg-info")} == {
        "swarm_autoscaler",
        "swarm_autoscaler_lab",
    }
    product = {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert product == {"core", "config", "adapters", "runtime", "daemon", "keeper"}
    lab = {p.name for p in (SRC / "swarm_autoscaler_lab").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert lab == {"localcloud", "sim", "demo"}


def test_the_import_contracts_hold() -> None:
    done = _lint_imports(SRC)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout, done.stdout


def test_the_import_contracts_catch_an_upward_import(tmp_path: Path) -> None:
    # The check can fail: a copy of the tree whose core imports the lab, and whose adapter imports the daemon.
    shutil.copytree(SRC, tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    model = tmp_path / "src" / "swarm_autoscaler" / "core" / "model.py"
    model.write_text(model.read_text() + "\nimport swarm_autoscaler_lab.sim  # noqa\n")
    swarm = tmp_path / "src" / "swarm_autoscaler" / "adapters" / "swarm.py"
    swarm.write_text(swarm.read_text() + "\nimport swarm_autoscaler.daemon.tick  # noqa\n")
    done = _lint_imports(tmp_path / "src")
    assert done.returncode != 0
    assert "3 kept" not in done.stdout
    assert "swarm_autoscaler.core.model -> swarm_autoscaler_lab.sim" in done.stdout, done.stdout
    assert "swarm_autoscaler.adapters.swarm -> swarm_autoscaler.daemon.tick" in done.stdout, done.stdout


def test_the_core_imports_only_itself_and_plain_stdlib() -> None:
    files = sorted((PKG / "core").glob("*.py"))
    assert len(files) > 10
    for path in files:
        for name in _imports(path):
            ok = name.startswith("swarm_autoscaler.core") or name.split(".")[0] in STDLIB_FOR_CORE
            assert ok, f"{path.name} imports {name}: the core stays pure"


def test_vendor_sdks_only_in_adapters_and_the_lab() -> None:
    checked = 0
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).parts
        in_adapters = "adapters" in parts[1:-1]
        for name in _imports(path):
            if name.split(".")[0] in VENDORS:
                assert parts[0] == "swarm_autoscaler_lab" or in_adapters, (
                    f"{path.relative_to(SRC)} imports {name}"
                )
        checked += 1
    assert checked > 100
