"""The committed .env.template must be exactly what the generator produces, and must be loadable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from swarm_autoscaler.config.doc import env_template, markdown_table
from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.config.variables import variables

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / ".env.template"


def test_committed_template_matches_the_generator() -> None:
    assert TEMPLATE.read_text() == env_template(), (
        ".env.template is out of date: run `.venv/bin/python scripts/gen_env_template.py`"
    )


def test_generator_script_check_mode_agrees() -> None:
    script = REPO / "scripts" / "gen_env_template.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_every_variable_is_documented_with_its_default() -> None:
    text = env_template()
    table = markdown_table()
    for name, _, _, field in variables():
        assert field.description, f"{name} has no description"
        assert f"{name}=" in text
        assert f"| `{name}` |" in table
    assert "# AUTOSCALER_POLL_INTERVAL=5s" in text
    assert "(duration; default 10m)" in text
    assert "| `AUTOSCALER_HTTP_PORT` | `8000` |" in table
    assert "| `AUTOSCALER_CLUSTER_NAME` | **required** |" in table


def test_template_as_env_file_gives_valid_settings(clean_env: None) -> None:
    settings = load_settings(TEMPLATE)
    assert settings.cluster_name == "analytics"
    assert list(settings.ec2.allowed_types) == ["m5.large"]
    assert settings.timing.poll_interval == 5.0
