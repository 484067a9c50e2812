"""The lean runtime: `pip install .` brings what `run`, `plan` and `status` need, and a command whose
optional part is missing says in one line which extra installs it (exit 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from swarm_autoscaler import cli

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"moto", "boto3", "matplotlib", "debugpy", "werkzeug", "flask", "pytest", "nbclient", "ipykernel"}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=90,
        check=False,
    )


def test_the_runtime_requirements_name_no_optional_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\[=<>~! ]", req, maxsplit=1)[0].lower() for req in project["dependencies"]}
    assert names and not names & OPTIONAL, names & OPTIONAL
    extras = project["optional-dependencies"]
    assert {"local", "sim", "debug", "dev"} <= set(extras)


def test_the_run_path_imports_no_optional_module() -> None:
    # Everything `run`, `plan` and `status` import, in a fresh interpreter; then what got loaded.
    code = """
import json, sys
from swarm_autoscaler import cli
cli._parser()
import swarm_autoscaler.daemon.commands, swarm_autoscaler.daemon.app, swarm_autoscaler.daemon.loop
import swarm_autoscaler.adapters.ec2, swarm_autoscaler.adapters.swarm, swarm_autoscaler.adapters.dask
import swarm_autoscaler.adapters.redis_lock, swarm_autoscaler.daemon.debug
print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert "aiobotocore" in loaded and "swarm_autoscaler" in loaded  # the probe did import the run path
    assert not loaded & OPTIONAL, loaded & OPTIONAL


BLOCK = """
import sys
for name in sys.argv[1].split(','):
    sys.modules[name] = None  # `import name` now fails as if the package were not installed
from swarm_autoscaler.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_demo_without_the_local_extra_says_which_extra_in_one_line() -> None:
    done = _python(BLOCK, "moto,boto3", "demo", "--fast")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "[local]" in lines[0] and "pip install 'swarm-autoscaler[local]'" in lines[0]


def test_simulate_plot_without_the_sim_extra_says_which_extra_in_one_line(tmp_path: Path) -> None:
    trace = ROOT / "scenarios" / "pinned_mix.csv"
    done = _python(BLOCK, "matplotlib", "simulate", "--trace", str(trace), "--plot", str(tmp_path / "x.png"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "[sim]" in lines[0], done.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_late_import_of_a_missing_extra_is_one_line_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The up-front check passed, but an optional module fails to import later, inside the command.
    def handler(args: object) -> int:
        raise ModuleNotFoundError("No module named 'matplotlib.pyplot'", name="matplotlib.pyplot")

    monkeypatch.setattr(cli, "_cmd_env_template", handler)
    assert cli.main(["env-template"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[sim]" in err, err


def test_a_missing_module_of_no_extra_is_not_blamed_on_an_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(args: object) -> int:
        raise ModuleNotFoundError("No module named 'nosuch'", name="nosuch")

    monkeypatch.setattr(cli, "_cmd_env_template", handler)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["env-template"])
