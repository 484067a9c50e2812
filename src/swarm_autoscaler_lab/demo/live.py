"""What the demos' dashboards share: a rich live view while stdout is a terminal, plain progress lines
otherwise (a CI log, a pipe)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Generic, Self, TypeVar

from rich.console import Console, Group
from rich.live import Live

V = TypeVar("V")


class LiveDashboard(Generic[V]):
    """Shows a view of type V: `render(view)` in a rich `Live` when stdout is a terminal, else
    `plain(view)` prints lines. Use as a context manager (`with Dashboard() as dash: dash.update(view)`);
    the live display is closed on exit. Subclasses write `render` and `plain`; `plain` may call `due()`
    to print its periodic line at most every `plain_every` seconds."""

    def __init__(
        self,
        console: Console | None = None,
        plain_every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console or Console()
        self.live_mode = sys.stdout.isatty()
        self._live: Live | None = None
        self._plain_every = plain_every
        self._clock = clock
        # None until the first line: the monotonic clock starts near 0 at boot, so a start of 0.0 would
        # make the first line wait for `plain_every` seconds of uptime on a freshly booted machine.
        self._last_plain: float | None = None

    def __enter__(self) -> Self:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, view: V) -> None:
        if self._live is not None:
            self._live.update(self.render(view))
        else:
            self.plain(view)

    def due(self) -> bool:
        """True at most once every `plain_every` seconds (the first call is always due)."""
        now = self._clock()
        if self._last_plain is not None and now - self._last_plain < self._plain_every:
            return False
        self._last_plain = now
        return True

    def render(self, view: V) -> Group:
        raise NotImplementedError

    def plain(self, view: V) -> None:
        raise NotImplementedError
