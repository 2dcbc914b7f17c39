"""
Every long-lived stream the gateway keeps for a reader, under one budget
(issue 43): the screen and peripheral-event watches (HTTP's server-sent
events, ``/operator``, a relay from another process), activity watches, and
MCP's subscription streams (``subscriptions/listen``, a legacy connection's
``GET /mcp``).  Two rules, each written once here:

- **How many.**  ``StreamBudget.take`` counts one more stream of a kind
  against the account whose token opened it (an ask's token: its computer's
  account), and refuses one past ``most`` (``too_many_watches``, 429).  The
  admin, the gateway itself and a computer's own player are not counted (as
  the admin's ``/operator`` sockets are not).  Each process counts its own.

- **How many bytes wait.**  An HTTP stream writes through a ``Held``: a push
  producer registered on its request, so it hears the transport say "pause"
  when the reader stops taking bytes.  A screen stream asks ``room()``
  before each frame and gets the Deferred of the reader's room while
  paused: the registry's ``ScreenGate`` keeps the frame, merged with the
  next, so a stalled reader holds at most the transport's buffer and one
  frame.  An event stream's ``write`` answers False once more than
  ``most_held`` bytes were written while paused: its owner ends the stream
  with a reason, so what a reader that never reads costs is bounded by
  bytes, not by time.  (``/operator``'s WebSocket has the same two rules in
  ``outbound.Outbound``: room for frames, a bounded queue for the rest.)
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.web.iweb import IRequest
from zope.interface import implementer

from trapsandbox import errors, limits
from trapsandbox.admission.tally import Tally
from trapsandbox.computers import callers, wire
from trapsandbox.computers.callers import Caller
from trapsandbox.errors import GatewayError

# The kinds of stream, each bounded apart: what a message about one says.
SCREEN_AND_EVENT = "screen and event"
ACTIVITY = "activity"
SUBSCRIPTION = "subscription"


def _nothing() -> None:
    return None


def charged(caller: Caller) -> str | None:
    """The account a stream ``caller`` opens is counted against (None: not counted)."""
    sender = caller.sender
    return caller.account if sender.by == callers.ASK else sender.account


def stalled(most: int) -> GatewayError:
    """Why an event stream whose reader stopped reading was ended."""
    return GatewayError(
        errors.OVERLOADED,
        f"the reader is not reading: {most} bytes were waiting for it, so the stream is ended",
    )


class StreamBudget:
    """
    The long-lived streams each account's token holds open in this process, per
    kind, at most ``most`` of each; ``most_held`` bytes at most wait for one
    HTTP stream's reader (``Held``).
    """

    def __init__(
        self,
        most: int = limits.MAX_WATCHES_PER_ACCOUNT,
        most_held: int = limits.MAX_STREAM_HELD_BYTES,
    ) -> None:
        self.most = most
        self.most_held = most_held
        self._held: dict[str, Tally] = {}

    def take(self, caller: Caller, kind: str) -> Callable[[], None]:
        """
        One more stream of ``kind`` opened by ``caller``: the function that
        gives it back (twice is once), or raises ``GatewayError(too_many_watches)``
        when the account whose token it used already holds ``most``.
        """
        account = charged(caller)
        if account is None:
            return _nothing  # the admin, the gateway, a computer's player: not counted
        tally = self._held.setdefault(kind, Tally())
        if tally.full(account, self.most):
            raise GatewayError(
                errors.TOO_MANY_WATCHES,
                f"account {wire.cut(account)} already has {self.most} {kind} watches open "
                "here; end one first",
            )
        tally.take(account)
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                tally.give_back(account)

        return give_back

    def holding(self, kind: str, account: str) -> int:
        """How many streams of ``kind`` ``account`` holds open now."""
        tally = self._held.get(kind)
        return 0 if tally is None else tally[account]

    def held(self, request: IRequest) -> Held:
        """A ``Held`` for one HTTP stream's ``request``, bounded by ``most_held``."""
        return Held(request, self.most_held)


@implementer(IPushProducer)
class Held:
    """
    What one HTTP stream's reader has not taken yet: registered as its
    request's producer until ``close`` (call it before the request finishes:
    twisted.web does not unregister a producer itself).
    """

    def __init__(self, request: IRequest, most: int) -> None:
        self._request = request
        self.most = most
        self.paused = False
        self.ended = False
        # Bytes written since the transport said "pause".
        self.held = 0
        self._waiting: list[Deferred[None]] = []
        request.registerProducer(self, True)

    def write(self, data: bytes) -> bool:
        """
        ``data`` to the reader; False (and nothing written) once the reader has
        left, or ``data`` would make more than ``most`` bytes wait for it: end the
        stream then.
        """
        if self.ended:
            return False
        if self.paused:
            if self.held + len(data) > self.most:
                return False
            self.held += len(data)
        self._request.write(data)
        return True

    def room(self) -> Deferred[None] | None:
        """None when a frame would be taken now; else the Deferred of when it would."""
        if not self.paused or self.ended:
            return None
        d: Deferred[None] = Deferred(self._forget)
        self._waiting.append(d)
        return d

    def _forget(self, d: Deferred[None]) -> None:
        if d in self._waiting:
            self._waiting.remove(d)

    def close(self) -> None:
        """The stream is over: no more writes, and the request's producer unregistered."""
        if not self.ended:
            self.ended = True
            self._request.unregisterProducer()
        self._wake()

    # IPushProducer: the request's channel calls these.

    def pauseProducing(self) -> None:
        # Said again on each write past the transport's buffer: what is held is not reset.
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        self.held = 0
        self._wake()

    def stopProducing(self) -> None:
        # The connection is gone: Klein cancels the stream's Deferred, which closes it.
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            if not d.called:
                d.callback(None)
