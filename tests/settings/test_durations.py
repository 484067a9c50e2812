"""Durations: the forms operators write, the forms that are refused, and formatting back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm_autoscaler.config.durations import EXPECTED, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2m30s", 150.0),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("0.5", 0.5),
        ("1d", 86400.0),
        (" 10M ", 600.0),
        ("0", 0.0),
        (12, 12.0),
        (2.5, 2.5),
    ],
)
def test_parses(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        "banana",
        "",
        "   ",
        "-5",
        "-5s",
        "5x",
        "s",
        "30m1h",
        "1h1h",
        "1.2.3s",
        "5 m",
        "1h 30m",
        "nan",
        "inf",
        -1,
        True,
    ],
)
def test_rejects(text: str | float) -> None:
    with pytest.raises(ValueError, match=EXPECTED):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5.0, "5s"),
        (600.0, "10m"),
        (5400.0, "1h30m"),
        (0.25, "250ms"),
        (1.5, "1s500ms"),
        (62.25, "1m2s250ms"),
        (0.0001, "0.0001s"),
        (0.0, "0"),
        (86400.0, "1d"),
    ],
)
def test_formats(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**9))
def test_format_then_parse_round_trips(millis: int) -> None:
    seconds = millis / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
