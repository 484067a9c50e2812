"""Durations as operators write them (`30`, `30s`, `5m`, `1h30m`, `250ms`) and as the core uses them
(floats, in seconds).

A bare number means seconds. Units may be combined from largest to smallest (`1h30m`, `2m30s`), each at
most once. Negative values, empty strings and anything else are rejected with `ValueError`.
"""

from __future__ import annotations

import math
import re

# Largest first: the order units must appear in when combined.
_UNITS: dict[str, float] = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

_NUMBER = r"\d+(?:\.\d+)?|\.\d+"
_BARE = re.compile(rf"(?:{_NUMBER})")
_PART = re.compile(rf"({_NUMBER})(ms|d|h|m|s)")

EXPECTED = "expected a duration like 30, 30s, 5m or 1h30m"


def parse_duration(value: str | float) -> float:
    """Seconds for `value`: a non-negative number of seconds, or a string such as `90`, `1.5s`, `5m`,
    `1h30m` or `250ms`. Raises `ValueError` (its message starts with `EXPECTED`) for anything else."""
    if isinstance(value, bool):  # bool is an int: never a duration
        raise ValueError(EXPECTED)
    if isinstance(value, int | float):
        return _check_number(float(value))
    text = value.strip().lower()
    if _BARE.fullmatch(text):
        return _check_number(float(text))
    return _parse_units(text)


def _check_number(seconds: float) -> float:
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(EXPECTED)
    return seconds


def _parse_units(text: str) -> float:
    total = 0.0
    position = 0
    last_rank = -1
    ranks = list(_UNITS)
    for match in _PART.finditer(text):
        rank = ranks.index(match.group(2))
        # Parts must be contiguous and in decreasing unit order (1h30m, not 30m1h nor 1h1h).
        if match.start() != position or rank <= last_rank:
            raise ValueError(EXPECTED)
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position, last_rank = match.end(), rank
    if position == 0 or position != len(text):
        raise ValueError(EXPECTED)
    return _check_number(total)


def format_duration(seconds: float) -> str:
    """The shortest readable form that parses back to `seconds`: `5s`, `10m`, `1h30m`, `1m2s500ms`, `0`."""
    if seconds < 0 or math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"cannot format {seconds!r} as a duration")
    if seconds == 0:
        return "0"
    millis = round(seconds * 1000)
    if abs(millis - seconds * 1000) > 1e-6:  # finer than a millisecond: plain seconds
        return format(seconds, ".9f").rstrip("0").rstrip(".") + "s"
    parts = []
    remaining = millis
    for unit, unit_seconds in _UNITS.items():
        size = round(unit_seconds * 1000)
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
