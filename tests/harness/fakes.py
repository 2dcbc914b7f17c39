"""Fakes for unit tests: a registry link, an in-memory computer connection, a fixed probe."""

import attrs
import orjson
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import succeed

from tests.harness.support import response_frame
from trapsandbox import wire
from trapsandbox.wire import GatewayError


@attrs.define
class FakeLink:
    """A connection that records what is sent and closed."""

    sent: list = attrs.field(factory=list)
    closed: list = attrs.field(factory=list)
    open: bool = True

    def send_frame(self, data: bytes) -> None:
        if not self.open:
            raise GatewayError(wire.NOT_CONNECTED, "closed")
        self.sent.append(orjson.loads(data))

    def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))
        self.open = False


class FakeUpgrade:
    peer = "tcp4:10.0.0.7:50123"

    def __init__(self, peer=None):
        if peer is not None:
            self.peer = peer


class FakeTransport:
    """Where the protocol registers its producer; its peer is the upgrade's."""

    def __init__(self, peer):
        self.producer = "the HTTP channel"
        kind, _, rest = peer.partition(":")
        host, _, port = rest.rpartition(":")
        if kind == "unix":
            self.peer = UNIXAddress(rest)
        else:
            self.peer = (IPv4Address if kind == "tcp4" else IPv6Address)("TCP", host, int(port))

    def getPeer(self):
        return self.peer

    def registerProducer(self, producer, streaming):
        assert self.producer is None and streaming
        self.producer = producer

    def unregisterProducer(self):
        self.producer = None


class Computer:
    """One in-memory connection to the gateway, seen from the computer."""

    def __init__(self, factory, trapos_id="7:", peer=None):
        self.trapos_id = trapos_id
        self.sent = []
        self.closes = []
        self.protocol = protocol = factory.buildProtocol(None)
        protocol.sendMessage = self._record
        protocol.sendClose = self._close
        protocol.dropConnection = lambda abort=False: self.lost(1006)
        upgrade = FakeUpgrade(peer)
        protocol.transport = FakeTransport(upgrade.peer)
        protocol.onConnect(upgrade)
        protocol.state = WebSocketProtocol.STATE_OPEN
        protocol.onOpen()
        self._ids = 0

    def _record(self, data, isBinary=False):
        self.sent.append(orjson.loads(data))

    def _close(self, code=None, reason=None):
        self.closes.append((code, reason))
        self.protocol.state = WebSocketProtocol.STATE_CLOSING

    def lost(self, code=1000):
        self.protocol.state = WebSocketProtocol.STATE_CLOSED
        self.protocol.onClose(True, code, "")

    def receive(self, obj, binary=False):
        data = obj if isinstance(obj, bytes) else orjson.dumps(obj)
        self.protocol.onMessage(data, binary)

    def request(self, type, payload=None, **extra):
        self._ids += 1
        message_id = f"1700000000000-{self._ids}"
        frame = {
            "event": "computer_request",
            "traposSenderId": self.trapos_id,
            "messageId": message_id,
            "type": type,
        }
        if payload is not None:
            frame["payload"] = payload
        frame.update(extra)
        self.receive(frame)
        return message_id

    def respond(self, request, **fields):
        self.receive(response_frame(self.trapos_id, request, **fields))

    def hello(self, secret="sesame", **payload):
        payload = {"traposId": self.trapos_id, "secret": secret, **payload}
        self.request("hello", payload)
        return self.sent[-1]

    def last(self):
        return self.sent[-1]


class FixedProbe:
    def __init__(self, result):
        self.result = result

    def check(self):
        return succeed(self.result)
