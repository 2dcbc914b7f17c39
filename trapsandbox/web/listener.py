"""
What listens on the port in plain mode (``SANDBOX_FAST_PATHS=0``): the site,
as twisted.web serves it, every route ``/gateway`` and ``/operator`` included
(through Autobahn's ``WebSocketResource``).

The one thing added is the count of strangers (``admission.strangers``): each
connection counts against its address from its accept until a request on it
is admitted (``GatewayChannel.admitted``); past the limit, a new one is
answered 429 and closed unread.  (Fast mode's ``fast.front`` counts an HTTP
connection from its first bytes instead.)
"""

from __future__ import annotations

from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IReactorTime
from twisted.web.http import datetimeToString

from trapsandbox import limits
from trapsandbox.admission.strangers import Strangers
from trapsandbox.compat.rawhttp import response
from trapsandbox.web.operator import TOO_MANY_WAITING


class _TooMany(protocol.Protocol):
    """Answers 429 and closes, reading nothing."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._abort: Any = None

    def connectionMade(self) -> None:
        self.transport.write(
            response(TOO_MANY_WAITING, datetimeToString(self._clock.seconds()), True)
        )
        self.transport.loseConnection()
        # A client that does not read its answer is not waited for.
        self._abort = self._clock.callLater(limits.HTTP_ABORT_AFTER, self.transport.abortConnection)

    def connectionLost(self, reason: Any) -> None:
        if self._abort is not None and self._abort.active():
            self._abort.cancel()


class CountedSite(protocol.Factory):
    """``site``'s channels, each given its connection's ``Ticket`` among the strangers."""

    noisy = False

    def __init__(
        self,
        site: Any,
        clock: IReactorTime,
        strangers: Strangers,
    ) -> None:
        self.site = site
        self.clock = clock
        self.strangers = strangers

    def startFactory(self) -> None:
        self.site.doStart()

    def stopFactory(self) -> None:
        self.site.doStop()

    def buildProtocol(self, addr: Any) -> protocol.Protocol:
        ticket = self.strangers.enter(addr)
        if ticket is None:
            return _TooMany(self.clock)
        channel = self.site.buildProtocol(addr)
        channel.ticket = ticket
        return channel
