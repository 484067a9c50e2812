"""The README's configuration table is generated from the settings model; it must not drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module() -> object:
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_configuration_table_matches_the_settings_model() -> None:
    module = _module()
    text = (ROOT / "README.md").read_text()
    assert module.render(text) == text, "run: .venv/bin/python scripts/update_readme.py"  # type: ignore[attr-defined]
    assert "`AUTOSCALER_POLL_INTERVAL`" in text and "`AUTOSCALER_EC2_ALLOWED_TYPES`" in text
