"""
What listens on the port: one look at a connection's first bytes.

A computer's connection starts ``GET /gateway`` (with a query: the client's
nonce) and goes straight to Autobahn's own protocol, which parses the upgrade
once; an operator's ``GET /operator`` goes to its own Autobahn factory the
same way.  Everything else is HTTP: read by ``fasthttp`` while its requests are
the operator's hot route, and by the site (twisted.web) from the first that
is not.  The site also still serves ``/gateway`` and ``/operator`` for an
upgrade that comes later on a kept-alive connection.

An HTTP connection counts against its address's ``Strangers``
(``admission.strangers``) from its first bytes until a request on it is
admitted.  Fast mode only (``fast.paths``); the plain mode listens with the
site itself (``web.listener``).  Going through
twisted.web first would parse every hello's HTTP request twice (Autobahn's
``WebSocketResource`` rebuilds the request from twisted.web's parse and hands
it to Autobahn to parse again).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IReactorTime
from twisted.protocols.policies import ProtocolWrapper
from twisted.web.http import datetimeToString

from trapsandbox import limits
from trapsandbox.admission.strangers import Strangers, Ticket
from trapsandbox.fast.fasthttp import FastHTTPFactory, response
from trapsandbox.web.operator import TOO_MANY_WAITING

GATEWAY = b"GET /gateway"
OPERATOR = b"GET /operator"  # the operator WebSocket (``opsocket``)
# What may follow the path in the request line.
_AFTER = (b" ", b"?")


def hand_over(
    transport: Any, factory: Any, address: Any, data: bytes, ticket: Ticket | None = None
) -> None:
    """
    Give ``transport`` to a new protocol of ``factory``, starting with
    ``data``; an HTTP protocol is given the connection's ``ticket`` to give
    up when its request is admitted.
    """
    chosen = factory.buildProtocol(address)
    if ticket is not None:
        chosen.ticket = ticket
    # As Autobahn's WebSocketResource takes a transport over from twisted.web.
    if isinstance(transport, ProtocolWrapper):
        transport.wrappedProtocol = chosen  # TLS
    else:
        transport.protocol = chosen
    chosen.makeConnection(transport)
    if data:
        chosen.dataReceived(data)


class _FirstBytes(protocol.Protocol):
    """Waits for enough bytes to choose, then gives the connection away."""

    def __init__(self, factory: FrontFactory, address: Any) -> None:
        self._factory = factory
        self._address = address
        self._buffer = b""
        self._timer: Any = None

    def connectionMade(self) -> None:
        self._timer = self._factory.clock.callLater(
            limits.HTTP_IDLE_TIMEOUT, self.transport.abortConnection
        )

    def dataReceived(self, data: bytes) -> None:
        buffer = self._buffer + data
        for prefix, factory in self._factory.routes:
            if len(buffer) <= len(prefix) and prefix.startswith(buffer):
                self._buffer = buffer  # still possibly this WebSocket: wait for the rest
                return
            if buffer.startswith(prefix) and buffer[len(prefix) : len(prefix) + 1] in _AFTER:
                self._hand_over(factory, buffer)
                return
        ticket = self._factory.strangers.enter(self._address)
        if ticket is None:
            # (The connection's first-bytes timer still aborts one that does not read this.)
            self.transport.write(
                response(TOO_MANY_WAITING, datetimeToString(self._factory.clock.seconds()), True)
            )
            self.transport.loseConnection()
            return
        self._hand_over(self._factory.http, buffer, ticket)

    def _hand_over(self, factory: Any, data: bytes, ticket: Ticket | None = None) -> None:
        self._cancel_timer()
        hand_over(self.transport, factory, self._address, data, ticket)

    def connectionLost(self, reason: Any) -> None:
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


class FrontFactory(protocol.Factory):
    """The factory every listener serves: computers to Autobahn, the rest to the site."""

    noisy = False

    def __init__(
        self,
        site: Any,
        websocket: Any,
        clock: IReactorTime,
        strangers: Strangers,
        requests: Any = None,
        operator: Any = None,
    ) -> None:
        self.site = site
        self.strangers = strangers
        self.websocket = websocket
        self.clock = clock
        # HTTP: read by ``fasthttp`` for the operator's hot route (given ``requests``,
        # an ``operator.OperatorRequests``), which hands the rest to the site.
        self.http = site
        if requests is not None:
            self.http = FastHTTPFactory(requests, site, hand_over, clock)
        # The request lines that go straight to a WebSocket factory.
        self.routes = [(GATEWAY, websocket)] + ([(OPERATOR, operator)] if operator else [])

    def startFactory(self) -> None:
        self.site.doStart()

    def stopFactory(self) -> None:
        self.site.doStop()

    def buildProtocol(self, addr: Any) -> _FirstBytes:
        return _FirstBytes(self, addr)
