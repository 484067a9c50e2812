"""The env file given with `--env-file`, checked before any setting is read from it.

pydantic-settings reads it with python-dotenv once per settings group; a line dotenv cannot parse (an
unterminated quote, usually) is skipped with a warning each time, and the variables it swallowed are then
reported as "required but not set". A file that is not UTF-8 ends in a `UnicodeDecodeError`. Checking the
file once first turns both into one line that names the file and the line.
"""

from __future__ import annotations

import io
from pathlib import Path


def problem(path: Path) -> str | None:
    """None when `path` is a readable UTF-8 env file that dotenv parses whole; else one line saying what
    is wrong and where."""
    if not path.is_file():
        return f"env file {str(path)!r} not found"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        return f"env file {str(path)!r}: line {line} is not UTF-8 text; save it as UTF-8"
    except OSError as exc:
        return f"env file {str(path)!r} cannot be read: {exc.strerror}"
    from dotenv.parser import parse_stream

    broken = next((b for b in parse_stream(io.StringIO(text)) if b.error), None)
    if broken is not None:
        return (
            f"env file {str(path)!r}: line {broken.original.line} cannot be parsed (an unterminated quote?); "
            "fix or remove it"
        )
    return None
