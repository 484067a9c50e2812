"""`Ec2Clock`: EC2's clock as seen from this host, the daemon's only clock.

Why EC2's clock: an instance's age is `now - LaunchTime`, and EC2 stamps LaunchTime with its own
clock. Measured against this host's wall clock, a host 5 minutes ahead finds every new machine
"broken" at birth (older than `max_start_time`) and relaunches it endlessly; a host behind stretches
every delay by the skew. So the daemon takes `now` from EC2 itself: every EC2 response carries an
HTTP `Date` header (RFC 7231, whole seconds), and between responses the clock advances with this host's
*monotonic* clock, which no wall-clock step (NTP, an operator, a VM resume) moves. The lifecycle marks
the planner writes into node labels are stamped with the same `now`, so every replica, whatever its
own wall clock says, writes and reads marks in one time base: a host whose clock is off or steps
changes no decision.

Accuracy: the `Date` header is the server's time floored to the second, stamped between the moment the
request left and the moment the answer arrived. So each answer bounds the offset between EC2's clock
and the monotonic one: `Date - received <= offset < Date + 1 - sent`. The clock keeps the intersection
of these bounds over successive answers and reads the middle of it (as NTP's intersection algorithm
does): a slow answer only gives loose bounds that change nothing, quick ones narrow it to well under a
second. When a new answer contradicts the bounds (EC2's clock or the monotonic one drifted), the bounds
restart from that answer. The error is at most half the width of the bounds, about half a second,
far below any delay the planner applies.

Before EC2 has answered once (`synced` False) the clock falls back to the host's wall clock; the daemon
reads the instance-type catalogue from EC2 before its first tick, so in practice a tick never runs
unsynced.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable


def parse_http_date(value: str | None) -> float | None:
    """Seconds since the epoch for an HTTP `Date` header value, or None when absent or unparsable."""
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if parsed.tzinfo is None:  # RFC 7231 dates are GMT; a naive parse means the zone was "-0000"
        return None
    return parsed.timestamp()


class Ec2Clock:
    """EC2's current time: the offset between EC2's clock and a monotonic clock, bounded by the `Date`
    of EC2's answers (see the module docstring). `wall` (this host's clock) is used only before the
    first answer and to report the `offset`; `monotonic` and `wall` are injectable for tests."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self.monotonic = monotonic
        self._bounds: tuple[float, float] | None = None  # EC2 time minus monotonic time: (low, high)
        self.samples = 0
        self.restarts = 0

    @property
    def synced(self) -> bool:
        """True once an EC2 answer with a `Date` header was seen."""
        return self._bounds is not None

    def uncertainty(self) -> float | None:
        """Half the width of the bounds: how far `now()` may be from EC2's clock (None until synced)."""
        return None if self._bounds is None else (self._bounds[1] - self._bounds[0]) / 2

    def now(self) -> float:
        """EC2's current time in seconds since the epoch (the host's wall clock until synced)."""
        if self._bounds is None:
            return self._wall()
        low, high = self._bounds
        return self.monotonic() + (low + high) / 2

    def offset(self) -> float | None:
        """EC2's clock minus this host's wall clock, in seconds (None until synced)."""
        return None if self._bounds is None else self.now() - self._wall()

    def observe(self, date_header: str | None, sent: float, received: float) -> None:
        """Learn from an answer: its `Date` header (ignored when absent), and the monotonic times at
        which its request was sent and it was received."""
        date = parse_http_date(date_header)
        if date is None:
            return
        self.samples += 1
        low, high = date - received, date + 1.0 - min(sent, received)
        if self._bounds is not None:
            known_low, known_high = self._bounds
            if low < known_high and high > known_low:  # consistent: narrow
                self._bounds = (max(low, known_low), min(high, known_high))
                return
        self._bounds = (low, high)
        self.restarts += 1
