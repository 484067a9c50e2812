"""The committed .env.template and docs/reference/settings.md must be exactly what the settings models
give (regenerate both with `.venv/bin/python scripts/gen_env_template.py`), and the template must load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from swarm_autoscaler.config.doc import env_template
from swarm_autoscaler.config.reference import REGENERATE, settings_reference, type_of
from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.config.variables import variables

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / ".env.template"
REFERENCE = REPO / "docs" / "reference" / "settings.md"
STALE = f"is out of date with the settings models: run `{REGENERATE}`"


def test_committed_template_matches_the_generator() -> None:
    assert TEMPLATE.read_text() == env_template(), f".env.template {STALE}"


def test_committed_settings_reference_matches_the_generator() -> None:
    assert REFERENCE.read_text() == settings_reference(), f"docs/reference/settings.md {STALE}"


def test_generator_script_check_mode_agrees() -> None:
    script = REPO / "scripts" / "gen_env_template.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_every_variable_is_documented_with_its_type_default_and_example() -> None:
    text = env_template()
    reference = settings_reference()
    for name, _, _, field in variables():
        assert field.description, f"{name} has no description"
        assert f"{name}=" in text
        section = reference.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        assert field.description in section
        assert f"- Type: {type_of(field)}" in section
        assert "- Default: " in section
        assert f"- Example: `{name}=" in section or f"- Example: `` {name}=" in section, (
            f"{name} has no example: give its field json_schema_extra={{'example': ...}}"
        )
    assert "# AUTOSCALER_POLL_INTERVAL=5s" in text
    assert "(duration; default 10m)" in text
    assert "| [`AUTOSCALER_HTTP_PORT`](#autoscaler_http_port) | integer, 0 to 65535 | `8000` |" in reference
    assert "| [`AUTOSCALER_CLUSTER_NAME`](#autoscaler_cluster_name) | string | **required** |" in reference
    assert (
        "| [`AUTOSCALER_KEEPER_LOCK_TTL`](#autoscaler_keeper_lock_ttl) | duration, more than 0 | `15s` |"
        in reference
    )


def test_template_as_env_file_gives_valid_settings(clean_env: None) -> None:
    settings = load_settings(TEMPLATE)
    assert settings.cluster_name == "analytics"
    assert list(settings.ec2.allowed_types) == ["m5.large"]
    assert settings.timing.poll_interval == 5.0


def test_every_variable_the_readme_and_the_manual_name_exists() -> None:
    """A hand-written page may name a setting too: each `AUTOSCALER_*` it names is a setting of the models,
    a group of them (`AUTOSCALER_EC2_*`), or a variable a stack file in docker/ reads at deploy time."""
    import re

    known = {name for name, _, _, _ in variables()}
    deploy_time = {
        m.group(1)
        for path in (REPO / "docker").glob("*.yml")
        for m in re.finditer(r"\$\{(AUTOSCALER_[A-Z0-9_]+)", path.read_text())
    }
    unknown = []
    for path in [REPO / "README.md", *(REPO / "docs").rglob("*.md")]:
        for m in re.finditer(r"\bAUTOSCALER_[A-Z0-9_]+\*?", path.read_text()):
            name = m.group(0)
            group = name.endswith(("*", "_")) and any(k.startswith(name.rstrip("*")) for k in known)
            if name not in known and name not in deploy_time and not group:
                unknown.append(f"{path.relative_to(REPO)}: {name}")
    assert not unknown, "not a setting, a group of settings or a stack file's variable:\n" + "\n".join(
        unknown
    )
