"""What the keeper's API reads from a request, checked before anything uses it: every malformed input
becomes a `BadInput` (a 4xx with a message), never an exception from deep inside (a 500).

- **Bearer tokens** are ASCII by construction (`access.new_token`, the admin's setting, the primaries'
  hex HMACs); a header with anything else (bytes that are not UTF-8 arrive as surrogates) is no token,
  so it gets 401 like a wrong one, before any comparison.
- **Epoch seconds** (`since`, `until`) must be finite numbers: `nan`, `inf` and `1e400` are 400.
- **A create's body** is empty or `{"profile": "<name>"}` and nothing else (400); whether the keeper
  knows the name is the service's to say (422, naming the known ones; 409 when the pair's live cluster
  has another profile).
- **JSON bodies** are small objects: over `BODY_LIMIT` bytes (the launch route's: its own limit), not UTF-8, not JSON, nested deeper than
  `DEPTH_LIMIT` (a deep body used to reach `RecursionError`) or not an object: 400.
"""

from __future__ import annotations

import json
import math
from typing import Any

BODY_LIMIT = 4096  # bytes: the budget body, {"budget_usd": <number>}, and a create's {"profile": "<name>"}
DEPTH_LIMIT = 8
_BEARER = "Bearer "


class BadInput(Exception):
    """A request input that breaks its rule; `status` is the 4xx to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when there is none or it cannot be
    a token (not printable ASCII)."""
    if not header or not header.startswith(_BEARER):
        return None
    token = header[len(_BEARER) :]
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        return None
    return token


def epoch_seconds(name: str, text: str | None) -> float | None:
    """A query value in epoch seconds (None when absent); `BadInput` (400) unless a finite number."""
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise BadInput(400, f"{name} must be epoch seconds (a finite number), got {text[:40]!r}")
    return value


def _depth(value: Any, limit: int) -> int:
    """How deep `value` nests, stopping early past `limit`."""
    if limit < 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(item, limit - 1) for item in items), default=0)


def _nesting(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not count), read
    before the parser recurses."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def json_object(body: bytes, expected: str, limit: int = BODY_LIMIT) -> dict[str, Any]:
    """A JSON object of at most `limit` bytes from a request body; `BadInput` (400, saying `expected`)
    otherwise."""
    if len(body) > limit:
        raise BadInput(400, f"body over {limit} bytes; expected {expected}")
    if _nesting(body) > DEPTH_LIMIT:  # before the parser recurses
        raise BadInput(400, f"body nested too deep; expected {expected}")
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadInput(400, f"body is not JSON; expected {expected}") from None
    if not isinstance(value, dict) or _depth(value, DEPTH_LIMIT) > DEPTH_LIMIT:
        raise BadInput(400, f"expected {expected}")
    return value


def profile_of(body: bytes) -> str | None:
    """The profile a create names: None for an empty body; `BadInput` (400) unless the body is exactly
    `{"profile": "<name>"}`."""
    if not body.strip():
        return None
    expected = 'no body, or {"profile": "<name>"}'
    value = json_object(body, expected)
    name = value.get("profile")
    if set(value) != {"profile"} or not isinstance(name, str):
        raise BadInput(400, f"expected {expected}")
    return name
