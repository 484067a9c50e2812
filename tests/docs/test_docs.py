"""The documentation: the site builds offline with mkdocs --strict (every relative link and anchor resolves,
every page is in the navigation), the README's links resolve, the command reference names exactly the
commands and options of `swarm-autoscaler --help`, and no internal issue or seed number is left."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMANDS = ROOT / "docs" / "reference" / "commands.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# An internal tracker's numbers mean nothing to a reader: say what the thing is.
# a tracker's number: "issue 15", "issues 12", "seed 4", and the design seeds' zero-padded "seeds 001"
# (plain "seeds 0-4" are random draws, not a tracker's)
INTERNAL = re.compile(r"\b(issues?|seed) #?[0-9]{1,3}\b|\bseeds #?0[0-9]{2}\b", re.I)


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(args, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = _run(sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out))
    log = built.stdout + built.stderr
    assert built.returncode == 0, log
    assert "WARNING" not in log, log
    return out


def _ids(html: Path) -> set[str]:
    parser = _Ids()
    parser.feed(html.read_text())
    return parser.ids


def test_the_site_builds_strict_and_offline(site: Path) -> None:
    assert (site / "index.html").exists() and (site / "reference" / "settings.html").exists()
    assert "autoscaler_poll_interval" in _ids(site / "reference" / "settings.html")
    # offline: no web font or other asset is fetched from elsewhere
    index = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in index and "fonts.gstatic.com" not in index


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md) and [no anchor](#nowhere)\n")
    config = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text().split("\nnav:")[0]
    config.write_text(text.replace("docs_dir: docs", f"docs_dir: {docs}") + "\nnav:\n  - Home: index.md\n")
    built = _run(
        sys.executable, "-m", "mkdocs", "build", "-f", str(config), "--site-dir", str(tmp_path / "s")
    )
    assert built.returncode != 0
    assert "missing.md" in built.stderr and "#nowhere" in built.stderr


def _github_slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _readme_links() -> list[str]:
    return LINK.findall(FENCE.sub("", README.read_text()))


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    head = "\n".join(lines[:6])
    assert "make demo" in head and "make test" in head


def test_every_link_of_the_readme_resolves(site: Path) -> None:
    links = _readme_links()
    assert any(link.startswith("docs/") for link in links)
    anchors = {
        _github_slug(line.lstrip("#")) for line in README.read_text().splitlines() if line.startswith("#")
    }
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        if not path:
            assert anchor in anchors, f"README.md: no heading for #{anchor}"
            continue
        target = ROOT / path
        assert target.exists(), f"README.md links to {path}, which does not exist"
        if anchor:
            assert path.startswith("docs/") and path.endswith(".md"), link
            html = site / Path(path).relative_to("docs").with_suffix(".html")
            assert anchor in _ids(html), f"README.md links to {link}: {path} has no such anchor"


def _help_commands() -> list[str]:
    out = _run(sys.executable, "-m", "swarm_autoscaler", "--help").stdout
    listing = out.split("positional arguments:", 1)[1].split("options:", 1)[0]
    return re.findall(r"^ {4}(\S+)", listing, re.M)


def _documented() -> dict[str, str]:
    """Command -> its section of the command reference."""
    parts = re.split(r"^## `swarm-autoscaler ([a-z-]+)`$", COMMANDS.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_command_reference_names_exactly_the_commands_of_help() -> None:
    commands = _help_commands()
    assert {"run", "plan", "status", "keeper", "demo", "simulate", "env-template", "healthcheck"} <= set(
        commands
    )
    assert sorted(_documented()) == sorted(commands)
    readme = README.read_text()
    assert sorted(set(re.findall(r"^\| `swarm-autoscaler ([a-z-]+)` \|", readme, re.M))) == sorted(commands)


@pytest.mark.parametrize(
    "command", ["run", "plan", "status", "keeper", "demo", "simulate", "env-template", "healthcheck"]
)
def test_the_command_reference_gives_every_option_of_a_command(command: str) -> None:
    out = _run(sys.executable, "-m", "swarm_autoscaler", command, "--help").stdout
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", out)) - {"--help"}
    section = _documented()[command]
    missing = sorted(o for o in options if f"`{o}" not in section)
    assert not missing, f"docs/reference/commands.md, {command}: options not described: {missing}"


def test_no_internal_issue_or_seed_number_in_the_code_or_the_docs() -> None:
    found = []
    files = [
        README,
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "scenarios").rglob("*.md"),
    ]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if INTERNAL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "say what the thing is, not its tracker number:\n" + "\n".join(found)
