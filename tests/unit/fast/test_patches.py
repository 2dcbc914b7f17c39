"""
The library internals ``trapsandbox.fast.patches`` relies on are still there.

Each test names what an upgrade of Autobahn or Twisted would silently break
if the attribute moved: the workaround would do nothing, and nothing else
would fail.
"""

import socket
import struct
import sys
from pprint import pformat

import autobahn.websocket.protocol
import autobahn.websocket.utf8validator
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import abstract, epollreactor, protocol, tcp
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.python import log as legacy_log
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.compat import fixes
from trapsandbox.fast import patches


class AutobahnTests(SynchronousTestCase):
    def test_debug_formatting_is_lazy_and_still_renders(self):
        # The connect path's cost: Autobahn calls its module's ``pformat``.
        self.addCleanup(patches.undo)
        patches.lazy_autobahn_debug_formatting()
        value = [("maxFramePayloadSize", 1048576, "GatewayFactory")]
        lazy = autobahn.websocket.protocol.pformat(value)
        self.assertIsInstance(lazy, patches._LazyFormat)
        self.assertEqual(f"\n{lazy}", "\n" + pformat(value))
        source = open(autobahn.websocket.protocol.__file__).read()
        self.assertIn("pformat(configAttrLog)", source, "Autobahn no longer pformats its options")

    @settings(max_examples=200, deadline=None)
    @given(
        st.binary(min_size=4, max_size=4),
        st.binary(max_size=2 * patches.SMALL_FRAME),
        st.lists(st.integers(min_value=1, max_value=600), max_size=5),
    )
    def test_small_frame_masks_unmask_as_autobahns_do(self, mask, payload, cuts):
        # Autobahn unmasks a frame's payload in the pieces it arrives in.
        self.addCleanup(patches.undo)
        patches.fast_small_frame_masks()
        ours = autobahn.websocket.protocol.create_xor_masker(mask, len(payload))
        theirs = patches._autobahn_masker(mask, len(payload))
        if len(payload) <= patches.SMALL_FRAME:
            self.assertIsInstance(ours, patches._IntMasker)
        points = sorted({c for c in cuts if c < len(payload)})
        for a, b in zip([0, *points], [*points, len(payload)], strict=True):
            self.assertEqual(ours.process(payload[a:b]), theirs.process(payload[a:b]))
            self.assertEqual(ours.pointer(), theirs.pointer())
        source = open(autobahn.websocket.protocol.__file__).read()
        self.assertIn("self.current_frame_masker = create_xor_masker(", source)

    def test_highlighted_debug_values_are_lazy_and_still_render(self):
        self.addCleanup(patches.undo)
        patches.lazy_autobahn_debug_formatting()
        for module in patches._HIGHLIGHTING:
            source = open(module.__file__).read()
            for name in ("hltype", "hlval"):
                self.assertIn(f"={name}(self.", source, f"{module.__name__} no longer uses {name}")
                lazy = getattr(module, name)(self.setUp)
                self.assertIsInstance(lazy, patches._LazyCall)
                self.assertEqual(f"{lazy}", getattr(autobahn.util, name)(self.setUp))

    @settings(max_examples=500, deadline=None)
    @given(
        st.lists(
            st.binary(max_size=12)
            | st.text(max_size=6).map(lambda text: text.encode("utf-8", "surrogatepass")),
            max_size=6,
        )
    )
    def test_utf8_validation_agrees_with_autobahns(self, pieces):
        ours = patches._Utf8Validator()
        theirs = autobahn.websocket.utf8validator.Utf8Validator()
        for piece in pieces:
            mine, nvx = ours.validate(piece), theirs.validate(piece)
            self.assertEqual(mine[:2], nvx[:2], pieces)
            if not nvx[0]:
                break  # Autobahn fails the connection (1007); the index is only in its reason
        source = open(autobahn.websocket.protocol.__file__).read()
        self.assertIn("self.utf8validator = Utf8Validator()", source)


def _client_frame(opcode: int, payload: bytes) -> bytes:
    mask = b"\x01\x02\x03\x04"
    masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked


class SlotsTests(SynchronousTestCase):
    """patches.protocol_slots: Autobahn's per-connection attributes by name."""

    def lifetime(self):
        """A connection through upgrade, a message, auto-ping, a ping and a close."""

        class Slotted(WebSocketServerProtocol):
            __slots__ = patches.protocol_slots(WebSocketServerProtocol, ("echoed", "at_open"))

            def onOpen(self):
                self.at_open = {n for n in patches.HANDSHAKE_LEFTOVERS if hasattr(self, n)}
                patches.release_handshake(self)

            def onMessage(self, payload, isBinary):
                self.echoed = payload
                self.sendMessage(payload)

        clock = Clock()
        factory = WebSocketServerFactory("ws://localhost:9000")
        factory.protocol = Slotted
        factory.setProtocolOptions(autoPingInterval=5, autoPingTimeout=2)
        fixes.plain_autobahn_timers(factory, clock)
        protocol = factory.buildProtocol(None)
        transport = StringTransport()
        protocol.makeConnection(transport)
        protocol.dataReceived(
            b"GET /gateway?n=1 HTTP/1.1\r\nHost: localhost:9000\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 101 "))
        protocol.dataReceived(_client_frame(1, b"hello"))
        self.assertEqual(protocol.echoed, b"hello")
        clock.advance(5)
        protocol.dataReceived(_client_frame(9, b"ping"))
        transport.registerProducer(object(), True)  # Autobahn unregisters it on close
        protocol.dataReceived(_client_frame(8, struct.pack("!H", 1000)))
        protocol.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(protocol.remoteCloseCode, 1000)
        return Slotted, protocol

    def test_autobahn_keeps_nothing_else_in_the_instance_dict(self):
        # A new attribute of Autobahn's (or a renamed one) lands in the dict:
        # add it to AUTOBAHN_SERVER_ATTRIBUTES.
        _, protocol = self.lifetime()
        defined = {name for cls in WebSocketServerProtocol.__mro__ for name in vars(cls)}
        self.assertEqual(set(vars(protocol)) - defined, set())
        self.assertLessEqual(len(vars(protocol)), 8)

    def test_every_slot_is_still_used(self):
        # A name Autobahn no longer sets is a slot nobody fills (and, renamed, a dict entry).
        cls, protocol = self.lifetime()
        self.assertEqual([name for name in cls.__slots__ if not hasattr(protocol, name)], [])

    def test_the_handshake_is_let_go_and_the_connection_carries_on(self):
        # lifetime() echoes a message, answers a ping and closes after the release.
        _, protocol = self.lifetime()
        self.assertEqual(protocol.at_open, set(patches.HANDSHAKE_LEFTOVERS))
        for name in patches.HANDSHAKE_LEFTOVERS:
            self.assertIsNone(getattr(protocol, name))
        source = open(autobahn.websocket.protocol.__file__).read()
        server = source[source.index("class WebSocketServerProtocol") :]
        server = server[: server.index("class WebSocketServerFactory")]
        # What runs once onOpen is called: the rest of the server, and the frames and close.
        base = source[
            source.index("class WebSocketProtocol(") : source.index("class PreparedMessage")
        ]
        after_handshake = base + server[server.index("self._onOpen()") :]
        for name in patches.HANDSHAKE_LEFTOVERS:
            # Read again past the handshake: releasing it would break that.
            self.assertNotIn(f"self.{name}", after_handshake.replace(f"self.{name} =", ""))

    def test_class_defaults_stay_visible(self):
        # A slot named like a class attribute would hide its default (Twisted's transport = None).
        cls, _ = self.lifetime()
        self.assertNotIn("transport", cls.__slots__)
        self.assertNotIn("peer", cls.__slots__)
        self.assertIsNone(cls().transport)


class TransportKeysTests(SynchronousTestCase):
    """patches.share_transport_dict_keys: what a transport is given later, named early."""

    def server(self, port):
        ours, theirs = socket.socketpair()
        self.addCleanup(ours.close)
        self.addCleanup(theirs.close)
        return tcp.Server(ours, protocol.Protocol(), ("127.0.0.1", 1), port, 0, self.reactor)

    def test_a_late_producer_keeps_the_shared_dict(self):
        # Not the real reactor: these transports' sockets must never reach its epoll.
        reactor = self.reactor = MemoryReactor()
        patches.share_transport_dict_keys()
        port = tcp.Port(0, protocol.Factory(), reactor=reactor)
        fresh = self.server(port)
        # Enough instances that the shared table takes no new names.
        servers = [self.server(port) for _ in range(40)]
        last = servers[-1]
        last.registerProducer(object(), True)  # as GatewayProtocol.onOpen does
        last.producerPaused = True
        last.dataBuffer, last.offset = b"queued", 1
        later = set(vars(last)) - set(vars(fresh))
        self.assertEqual(later, set(patches._LATER_TRANSPORT_ATTRIBUTES))

        class Unseeded:
            pass

        others = [Unseeded() for _ in range(41)]
        for other in others:
            vars(other).update(vars(fresh))
        for name in later:
            setattr(others[-1], name, None)
        # Without the seed, the last one has a dict of its own (3.11: ~0.8 kB).
        self.assertLess(sys.getsizeof(vars(last)), sys.getsizeof(vars(others[-1])))
        for name in patches._LATER_TRANSPORT_ATTRIBUTES:
            defaults = [cls for cls in tcp.Server.__mro__ if name in vars(cls)]
            self.assertTrue(defaults, f"Twisted renamed {name}")


class DirectDispatchTests(SynchronousTestCase):
    def test_the_reactor_still_calls_through_log_and_errors_are_logged(self):
        self.addCleanup(patches.undo)
        patches.direct_reactor_dispatch()
        source = open(epollreactor.__file__).read()
        self.assertIn("log.callWithLogger(selectable, _drdw, selectable, fd, event)", source)
        self.assertIs(epollreactor.log.msg, legacy_log.msg)
        self.assertEqual(epollreactor.log.callWithLogger(None, lambda a, b: a + b, 1, b=2), 3)
        epollreactor.log.callWithLogger(None, lambda: 1 / 0)
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)


class WriteThroughTests(SynchronousTestCase):
    """The Twisted internals of patches.write_through_accepted_connections."""

    def test_the_internals_it_reads_are_there(self):
        self.addCleanup(patches.undo)
        patches.write_through_accepted_connections()
        self.assertIs(tcp.Server.write, patches._write_through)
        source = open(abstract.__file__).read()
        for name in ("self._tempDataLen", "self.offset", "self.dataBuffer", "_writeDisconnected"):
            self.assertIn(name, source)
        # Never a write after an abort, nor through Twisted's own TLS connection mixin.
        self.assertIs(tcp.Server._aborting, False)
        self.assertIs(tcp.Server.TLS, False)
        # What it does itself of writeSomeData for a write within SEND_LIMIT.
        self.assertIs(tcp.Server.writeSomeData, tcp.Connection.writeSomeData)
        source = open(tcp.__file__).read()
        self.assertIn("limitedData = memoryview(data)[: self.SEND_LIMIT]", source)
        self.assertIn("return untilConcludes(self.socket.send, limitedData)", source)
        self.assertIn("if se.args[0] in (EWOULDBLOCK, ENOBUFS):", source)


def _frame(opcode, payload, fin=True, masked=True, mask=b"\x01\x02\x03\x04", wide=False):
    """One WebSocket frame as a client sends it; ``wide``: a 16-bit length even if short."""
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if masked else 0
    if len(payload) < 126 and not wide:
        head += bytes([bit | len(payload)])
    elif len(payload) < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", len(payload))
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", len(payload))
    if not masked:
        return head + payload
    key = (mask * (len(payload) // 4 + 1))[: len(payload)]
    return head + mask + bytes(a ^ b for a, b in zip(payload, key, strict=True))


def _ascii(data):
    return bytes(byte & 0x7F for byte in data)


_texts = st.text(max_size=300).map(str.encode) | st.binary(max_size=40)
_frames = st.one_of(
    st.builds(_frame, st.just(1), _texts),  # the usual: one whole text frame
    st.builds(_frame, st.just(1), st.binary(min_size=126, max_size=600).map(_ascii)),
    # Around the limits of run_protocol (frame 1000, message 1500).
    st.builds(_frame, st.just(1), st.integers(900, 1600).map(lambda n: b"a" * n)),
    st.builds(_frame, st.just(1), st.binary(max_size=125), wide=st.just(True)),
    st.builds(_frame, st.just(1), _texts, fin=st.just(False)),  # fragments
    st.builds(_frame, st.just(0), _texts, fin=st.booleans()),
    st.builds(_frame, st.just(2), st.binary(max_size=50)),
    st.builds(_frame, st.sampled_from([9, 10]), st.binary(max_size=20)),
    st.builds(_frame, st.just(1), _texts, masked=st.just(False)),
    st.builds(_frame, st.just(8), st.just(struct.pack("!H", 1000))),
    st.binary(min_size=1, max_size=8),  # junk
)


class _Transport(StringTransport):
    def unregisterProducer(self):
        self.producer = None


class WholeFramesTests(SynchronousTestCase):
    """A protocol with ``patches.WholeFrames`` reads and sends as Autobahn alone does."""

    def open(self, bases, seen):
        """A server protocol of ``bases`` in memory, past its opening handshake."""

        class Recorder(*bases):
            def onMessage(self, payload, isBinary):
                seen.append(("message", payload, isBinary))

            def onClose(self, wasClean, code, reason):
                seen.append(("close", code))

        factory = WebSocketServerFactory()
        # No timers: nothing here may reach the real reactor.
        factory.setProtocolOptions(
            maxFramePayloadSize=1000,
            maxMessagePayloadSize=1500,
            openHandshakeTimeout=0,
            closeHandshakeTimeout=0,
        )
        fixes.plain_autobahn_timers(factory, Clock())
        factory.protocol = Recorder
        protocol = factory.buildProtocol(None)
        transport = _Transport()
        protocol.makeConnection(transport)
        protocol.dataReceived(
            b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        return protocol, transport

    def read(self, bases, data, cuts):
        seen = []
        protocol, transport = self.open(bases, seen)
        points = sorted({c for c in cuts if c < len(data)})
        for a, b in zip([0, *points], [*points, len(data)], strict=True):
            if protocol.state == WebSocketProtocol.STATE_CLOSED:
                break
            protocol.dataReceived(data[a:b])
        return seen, transport.value(), protocol.state, protocol.trafficStats.__json__()

    @settings(max_examples=400, deadline=None)
    @given(st.lists(_frames, max_size=8), st.lists(st.integers(min_value=1, max_value=3000)))
    def test_any_bytes_are_read_as_autobahn_reads_them(self, frames, cuts):
        data = b"".join(frames)
        ours = self.read((patches.WholeFrames, WebSocketServerProtocol), data, cuts)
        theirs = self.read((WebSocketServerProtocol,), data, cuts)
        self.assertEqual(ours, theirs)

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.binary(max_size=2000).map(_ascii)
                | st.integers(0, 300).map(lambda n: b"x" * n)
                | st.integers(65_530, 65_540).map(lambda n: b"y" * n),
                st.booleans(),
            ),
            max_size=5,
        ),
    )
    def test_messages_are_sent_as_autobahn_sends_them(self, messages):
        sent = []
        for bases in ((patches.WholeFrames, WebSocketServerProtocol), (WebSocketServerProtocol,)):
            protocol, transport = self.open(bases, [])
            protocol.maxMessagePayloadSize = 0  # here: no limit on what is sent
            start = len(transport.value())
            for payload, binary in messages:
                protocol.sendMessage(payload, binary)
            sent.append((transport.value()[start:], protocol.trafficStats.__json__()))
        self.assertEqual(sent[0], sent[1])
