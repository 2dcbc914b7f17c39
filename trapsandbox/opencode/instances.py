"""
The opencode instances that asks keep alive, given back (SPEC §11).

opencode keeps one instance per directory, with its own MCP connections and
a few MiB of memory (2.5-8 MiB each, measured on 1.18.33), and never lets one
go by itself.  Each asking computer has a directory, so on a server where a few
hundred players have each asked once, opencode would hold a few GiB until it
restarts.  The gateway therefore gives an instance back
(``POST /instance/dispose?directory=D``):

- when its computer has not asked for ``idle`` seconds;
- when its computer's conversation is forgotten (``give_back``);
- when more than ``bound`` instances are live: the least recently used idle
  one first.  An instance with an ask running is never given back, so the bound
  is exceeded only while more asks than that run at once (the ask queue keeps
  them fewer, ``queue``).

Giving back loses nothing a player sees: the session and its messages are in
opencode's storage, and the directory's ``opencode.json`` holds the computer's
MCP block, so the next request for that directory re-creates the instance as
it was.  An ask that arrives while its instance is being disposed waits for
the dispose to finish (``use``), so a fresh instance is never disposed under it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import limits
from trapsandbox.computers.wire import cut
from trapsandbox.opencode.tokens import Key

log = Logger()


# Why an instance was given back: its computer idle, its conversation forgotten, over the bound.
REASONS = ("idle", "forgotten", "bound")


class Instances:
    """
    Live instances by computer, the least recently used first.

    ``dispose(key)`` gives one back (a Deferred; its failure is only logged:
    opencode restarted or down has no instance to keep anyway).
    """

    def __init__(
        self,
        clock: IReactorTime,
        dispose: Callable[[Key], Deferred],
        idle: float = limits.ASK_INSTANCE_IDLE,
        bound: int = limits.ASK_MAX_INSTANCES,
    ) -> None:
        self._clock = clock
        self._dispose = dispose
        self.idle = idle
        self.bound = bound
        # key -> its idle timer (None while an ask uses it), the least recently used first.
        self.live: dict[Key, IDelayedCall | None] = {}
        # key -> its dispose in flight.
        self.disposing: dict[Key, Deferred] = {}
        # Instances given back, by why (``REASONS``), and the disposals opencode failed:
        # read by /metrics when scraped.
        self.given_back: Counter[str] = Counter()
        self.dispose_failures = 0

    def use(self, key: Key) -> Deferred[None]:
        """
        An ask starts on ``key``'s instance: it is the most recently used and
        kept until ``done``.  Fires once any dispose of it in flight is over.
        """
        timer = self.live.pop(key, None)
        if timer is not None and timer.active():
            timer.cancel()
        self.live[key] = None
        self._trim()
        pending = self.disposing.get(key)
        if pending is None:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        pending.addBoth(lambda result: (waiter.callback(None), result)[1])
        return waiter

    def done(self, key: Key) -> None:
        """The ask on ``key`` ended: its instance is given back after ``idle`` seconds unused."""
        if key not in self.live:
            return
        timer = self.live[key]
        if timer is not None and timer.active():
            timer.cancel()
        self.live[key] = self._clock.callLater(self.idle, self._idled, key)

    def give_back(self, key: Key) -> None:
        """Give ``key``'s instance back now, unless an ask is using it."""
        if key in self.live and self.live[key] is not None:
            self._give_back(key, "forgotten", "its conversation was forgotten")

    def forget_all(self) -> None:
        """Nothing is kept, no timer left, nothing given back: the gateway stops (opencode keeps
        what it has), or opencode (re)started (it has none of them: giving one back would make
        it first)."""
        for timer in self.live.values():
            if timer is not None and timer.active():
                timer.cancel()
        self.live.clear()

    def _idled(self, key: Key) -> None:
        self.live[key] = None  # the timer has run: _give_back must not cancel it
        self._give_back(key, "idle", f"unused for {self.idle:g} s")

    def _trim(self) -> None:
        """Past the bound, give back the least recently used instances no ask is using."""
        excess = len(self.live) - self.bound
        for key in list(self.live):
            if excess <= 0:
                break
            if self.live[key] is not None:
                self._give_back(key, "bound", f"over the bound of {self.bound} live instances")
                excess -= 1

    def _give_back(self, key: Key, reason: str, why: str) -> None:
        timer = self.live.pop(key, None)
        if timer is not None and timer.active():
            timer.cancel()
        self.given_back[reason] += 1
        log.info(
            "giving back the opencode instance of {traposId} (account {account}): {why}",
            traposId=cut(key[1]),
            account=cut(key[0]),
            why=why,
        )
        d = self._dispose(key)
        d.addErrback(self._failed, key)
        d.addBoth(self._disposed, key, d)
        if not d.called:
            self.disposing[key] = d

    def _failed(self, failure: Failure, key: Key) -> None:
        self.dispose_failures += 1
        log.info(
            "giving back the opencode instance of {traposId} failed: {why}",
            traposId=cut(key[1]),
            why=cut(failure.getErrorMessage()),
        )

    def _disposed(self, result: object, key: Key, d: Deferred) -> object:
        if self.disposing.get(key) is d:
            del self.disposing[key]
        return result
