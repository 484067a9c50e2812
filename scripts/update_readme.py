"""Regenerate the README's configuration table from the settings model: `python scripts/update_readme.py`.
With `--check`, exit 1 when the README's table differs (the test suite runs this check)."""

from __future__ import annotations

import sys
from pathlib import Path

from swarm_autoscaler.config.doc import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- config:start -->", "<!-- config:end -->"


def render(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{markdown_table().rstrip()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = README.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print(
                "README.md's configuration table is stale: run python scripts/update_readme.py",
                file=sys.stderr,
            )
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
