"""Reading what a refused start prints on standard error (`logs.startup_line`)."""

from __future__ import annotations

import json


def startup_events(stderr: str) -> list[str]:
    """The events of a refused start's lines in the json log format (the default), in order. Each line
    must be one JSON object with the keys of every log line and nothing else (no traceback)."""
    events = []
    for line in stderr.splitlines():
        record = json.loads(line)  # raises on a line that is not JSON
        assert set(record) == {"event", "level", "timestamp"}, line
        assert record["level"] == ("warning" if "warning" in record["event"].split(":")[0] else "error"), line
        events.append(record["event"])
    return events
