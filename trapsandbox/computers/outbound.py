"""
Flow control of what we send one computer.

A computer that stops reading (a frozen game, a stalled TCP path) would
otherwise make its socket's send buffer grow without bound.  ``Outbound`` is
registered as the transport's push producer: while the transport says
"pause", messages wait in a queue of bounded size; a send that would exceed
the bound fails at once with ``overloaded``; and a computer that stays
paused past the stall timeout is closed with 4004.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from zope.interface import implementer

from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError


@implementer(IPushProducer)
class Outbound:
    # One per computer: no instance dict, and no queue (a deque is 0.6 kB
    # empty) until the transport first says "pause".
    __slots__ = (
        "_write",
        "_on_stalled",
        "_clock",
        "_max_queued",
        "_stall_timeout",
        "_queue",
        "_stall_timer",
        "_resumed",
        "paused",
        "queued_bytes",
    )

    def __init__(
        self,
        write: Callable[[bytes], None],
        on_stalled: Callable[[], None],
        clock: IReactorTime,
        max_queued: int = limits.MAX_QUEUED_BYTES,
        stall_timeout: float = limits.STALL_TIMEOUT,
    ) -> None:
        self._write = write
        self._on_stalled = on_stalled
        self._clock = clock
        self._max_queued = max_queued
        self._stall_timeout = stall_timeout
        self._queue: deque[bytes] | None = None
        self._stall_timer: IDelayedCall | None = None
        # Who waits for room (``when_resumed``): None until someone does.
        self._resumed: list[Deferred[None]] | None = None
        self.paused = False
        self.queued_bytes = 0

    def send(self, data: bytes) -> None:
        if not self.paused and not self._queue:
            self._write(data)
            return
        if self.queued_bytes + len(data) > self._max_queued:
            raise GatewayError(
                errors.OVERLOADED,
                f"the computer is not reading: {self.queued_bytes} bytes are waiting for it",
            )
        if self._queue is None:
            self._queue = deque()
        self._queue.append(data)
        self.queued_bytes += len(data)

    # IPushProducer: the transport calls these.

    def pauseProducing(self) -> None:
        self.paused = True
        if self._stall_timer is None:
            self._stall_timer = self._clock.callLater(self._stall_timeout, self._stalled)

    def resumeProducing(self) -> None:
        self.paused = False
        self._cancel_stall_timer()
        # Each write may pause us again.
        while self._queue and not self.paused:  # None or empty: nothing waits
            data = self._queue.popleft()
            self.queued_bytes -= len(data)
            self._write(data)
        if not self._queue:
            self._queue = None
        if self._resumed and not self.paused:
            waiting, self._resumed = self._resumed, None
            for d in waiting:
                if not d.called:  # (cancelled: its watch ended meanwhile)
                    d.callback(None)

    def when_resumed(self) -> Deferred[None]:
        """Fires once the transport takes writes again (after ``pauseProducing``)."""
        d: Deferred[None] = Deferred()
        if self._resumed is None:
            self._resumed = []
        self._resumed.append(d)
        return d

    def stopProducing(self) -> None:
        self._cancel_stall_timer()
        self._queue = None
        self.queued_bytes = 0

    def _stalled(self) -> None:
        self._stall_timer = None
        self._on_stalled()

    def _cancel_stall_timer(self) -> None:
        if self._stall_timer is not None:
            if self._stall_timer.active():
                self._stall_timer.cancel()
            self._stall_timer = None
