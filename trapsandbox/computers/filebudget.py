"""
The bytes of file content on their way to each computer (``FileBudget``): every write
(its parts), and a restore's batches, of one computer share one budget.

A computer takes its messages one at a time; what it has not read waits in its
connection's queue (``outbound.Outbound``, at most ``MAX_QUEUED_BYTES`` while the transport
is paused, past which a send fails ``overloaded``).  One write keeps ``FILE_WINDOW`` parts
in flight, which fits; two large writes to one computer at once did not, and the part that
passed the bound failed its write.  So a part takes its bytes from the computer's budget
before it goes and gives them back once answered (or failed): at most ``most`` bytes wait
for one computer, whatever sends them.  A part waits for room in the order asked, so a
write's parts still go out in order; one larger than the whole budget goes once nothing
else is out.  Cancelling a wait gives up its place.
"""

from __future__ import annotations

from collections import deque

from twisted.internet.defer import Deferred, succeed

Computer = tuple[str, str]  # (accountId, traposId)


class FileBudget:
    def __init__(self, most: int) -> None:
        self._most = most
        self._held: dict[Computer, int] = {}
        self._waiting: dict[Computer, deque[tuple[int, Deferred[None]]]] = {}

    def held(self, computer: Computer) -> int:
        """The bytes out to ``computer`` now (for tests)."""
        return self._held.get(computer, 0)

    def take(self, computer: Computer, size: int) -> Deferred[None]:
        """Fires once ``size`` bytes for ``computer`` fit; ``give`` them back after."""
        if not self._waiting.get(computer) and self._fits(computer, size):
            self._held[computer] = self._held.get(computer, 0) + size
            return succeed(None)
        waiting = self._waiting.setdefault(computer, deque())
        d: Deferred[None] = Deferred(lambda d: self._give_up(computer, entry))
        entry = (size, d)
        waiting.append(entry)
        return d

    def give(self, computer: Computer, size: int) -> None:
        held = self._held.get(computer, 0) - size
        if held > 0:
            self._held[computer] = held
        else:
            self._held.pop(computer, None)
        self._next(computer)

    def _fits(self, computer: Computer, size: int) -> bool:
        held = self._held.get(computer, 0)
        return held == 0 or held + size <= self._most

    def _next(self, computer: Computer) -> None:
        waiting = self._waiting.get(computer)
        # (Each callback may send, fail and give back at once: the loop reads afresh.)
        while waiting and self._fits(computer, waiting[0][0]):
            size, d = waiting.popleft()
            self._held[computer] = self._held.get(computer, 0) + size
            d.callback(None)
        if waiting is not None and not waiting and self._waiting.get(computer) is waiting:
            del self._waiting[computer]

    def _give_up(self, computer: Computer, entry: tuple[int, Deferred[None]]) -> None:
        waiting = self._waiting.get(computer)
        if waiting is not None and entry in waiting:
            waiting.remove(entry)
            self._next(computer)  # (the first in line gone: the next may fit now)
