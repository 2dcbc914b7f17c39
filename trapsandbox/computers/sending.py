"""
How both WebSocket protocols of the port send (a computer's,
``computers.protocol``, and an operator's, ``web.opsocket``): through a
bounded ``Outbound`` queue that closes a peer that stops reading.
"""

from __future__ import annotations

from autobahn.websocket.protocol import WebSocketProtocol
from twisted.logger import Logger

from trapsandbox.computers import wire
from trapsandbox.computers.outbound import Outbound
from trapsandbox.computers.parts import BinaryFrame

log = Logger()


class Sending:
    """
    How both of the port's WebSocket protocols send: through an ``Outbound``
    (``self.outbound``), registered as the transport's producer when the
    connection opens; a peer that stops reading is closed 4004.  The factory
    has ``clock``, ``max_queued_bytes`` and ``stall_timeout``; ``who()`` names
    the peer in the log.
    """

    __slots__ = ()

    def start_sending(self) -> None:
        factory = self.factory
        self.outbound = Outbound(
            self._write,
            self._stalled,
            factory.clock,
            factory.max_queued_bytes,
            factory.stall_timeout,
        )
        # The HTTP channel that parsed the upgrade, if any, is still the
        # transport's producer; our sends take its place.
        self.transport.unregisterProducer()
        self.transport.registerProducer(self.outbound, True)

    def _write(self, data: bytes) -> None:
        # Also called when a paused transport drains, maybe after a close
        # began: what was queued for the connection then goes nowhere.
        if self.state != WebSocketProtocol.STATE_OPEN:
            return
        if type(data) is BinaryFrame:  # (Autobahn takes exactly bytes)
            self.sendMessage(bytes(data), isBinary=True)
        else:
            self.sendMessage(data)

    def close(self, code: int, reason: str) -> None:
        if self.state == WebSocketProtocol.STATE_OPEN:
            self.sendClose(code, reason)

    def _stalled(self) -> None:
        log.warn(
            "{who} stopped reading for {timeout:g} s with {queued} bytes waiting: closing",
            who=self.who(),
            timeout=self.factory.stall_timeout,
            queued=self.outbound.queued_bytes,
        )
        # The close frame waits behind the unread data; Autobahn drops the
        # connection when the close handshake times out.
        self.close(wire.CLOSE_STALLED, "stalled")
