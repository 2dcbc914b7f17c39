"""
How the gateway keeps its log readable under a flood: lines of one kind are
limited, and what was left out is counted and said.

- ``Throttle``: at most one line per interval (an ignored frame, a refused
  connection), the next saying how many were not logged.
- ``Budget``: at most so many lines a second, then one summary of the rest
  once the second is over (``computer_lines``: a fleet reconnecting at once
  would write thousands of connect lines, and a hello's log line costs as
  much as a tenth of the hello).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from trapsandbox import limits

log = Logger()


class Throttle:
    """Say yes at most once per ``interval``, with how many noes came in between."""

    def __init__(self, clock: IReactorTime, interval: float) -> None:
        self._clock = clock
        self._interval = interval
        self._next = 0.0
        self._suppressed = 0

    def allow(self) -> int | None:
        """None: not now.  Otherwise the number of calls refused since the last yes."""
        now = self._clock.seconds()
        if now < self._next:
            self._suppressed += 1
            return None
        self._next = now + self._interval
        suppressed, self._suppressed = self._suppressed, 0
        return suppressed


class Budget:
    """
    At most ``limit`` lines a second; the rest are counted, and ``summary``
    is called with their number once that second is over.
    """

    def __init__(self, clock: IReactorTime, limit: int, summary: Any) -> None:
        self._clock = clock
        self._limit = limit
        self._summary = summary
        self._second = 0
        self._used = 0
        self._suppressed = 0
        self._timer: Any = None

    def allow(self) -> bool:
        now = self._clock.seconds()
        second = int(now)
        if second != self._second:
            self._second = second
            self._used = 0
        if self._used < self._limit:
            self._used += 1
            return True
        self._suppressed += 1
        if self._timer is None:
            self._timer = self._clock.callLater(second + 1 - now, self.flush)
        return False

    def flush(self) -> None:
        """Say what was counted now (also when the gateway stops)."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            self._summary(suppressed)


def computer_lines(clock: IReactorTime, what: str) -> Budget:
    """The budget of "<traposId> <what>" lines (connected, disconnected), summed up past it."""
    return Budget(clock, limits.CONNECT_LINES_PER_SECOND, lambda count: _more(count, what))


def _more(count: int, what: str) -> None:
    log.info(
        "{count} more computers {what} in the last second (at most {limit} such lines a second)",
        count=count,
        what=what,
        limit=limits.CONNECT_LINES_PER_SECOND,
    )
