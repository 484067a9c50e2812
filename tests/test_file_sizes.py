"""No source module grows past about 400 lines without saying at its top why it is one file."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIMIT = 420  # "about 400"
REASON = "Why one file of this size:"


def test_every_long_module_gives_its_reason() -> None:
    long = {}
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text().count("\n")
        if lines > LIMIT:
            long[path.relative_to(SRC).as_posix()] = ast.get_docstring(ast.parse(path.read_text())) or ""
    missing = [name for name, doc in long.items() if REASON not in doc]
    assert not missing, f"over {LIMIT} lines without '{REASON}' in the module docstring: {missing}"
