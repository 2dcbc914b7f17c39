"""
The library internals ``trapsandbox.compat.fixes`` relies on (in both modes) are still there,
and each fix does what it says.
"""

import autobahn.websocket.protocol
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import base
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from trapsandbox.compat import fixes
from trapsandbox.web.operator import error_answer
from trapsandbox.web.site import GatewaySite


class AutobahnTests(SynchronousTestCase):
    def protocol(self):
        factory = WebSocketServerFactory()
        protocol = factory.buildProtocol(None)
        # What _connectionMade sets up, without a transport.
        protocol.closeHandshakeTimeoutCall = None
        protocol.failedByMe = False
        return factory, protocol

    def test_close_handshake_timer(self):
        # onClose leaves this timer behind when the peer drops instead of answering our close.
        _, protocol = self.protocol()
        source = open(autobahn.websocket.protocol.__file__).read()
        self.assertIn("self.closeHandshakeTimeoutCall = self.factory._batched_timer", source)
        clock = Clock()
        protocol.closeHandshakeTimeoutCall = clock.callLater(1, lambda: None)
        fixes.cancel_close_handshake_timer(protocol)
        self.assertEqual(clock.getDelayedCalls(), [])
        self.assertIsNone(protocol.closeHandshakeTimeoutCall)

    def test_failed_by_me(self):
        # The 1002/1007 close answering a malformed close frame is sent only if we know this.
        source = open(autobahn.websocket.protocol.__file__).read()
        self.assertIn("self.failedByMe = True", source)
        _, protocol = self.protocol()
        self.assertIs(fixes.failed_by_us(protocol), False)
        protocol.failedByMe = True  # what Autobahn sets when it fails the connection itself
        self.assertIs(fixes.failed_by_us(protocol), True)

    def test_batched_timer(self):
        factory, _ = self.protocol()
        self.assertTrue(hasattr(factory, "_batched_timer"), "Autobahn renamed _batched_timer")
        clock = Clock()
        fixes.plain_autobahn_timers(factory, clock)
        call = factory._batched_timer.call_later(1, lambda: None)
        call.cancel()
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_deny_headers(self):
        # Autobahn answers a ConnectionDeny through failHandshake(reason, code): no headers.
        source = open(autobahn.websocket.protocol.__file__).read()
        self.assertIn("self.failHandshake(err.value.reason, err.value.code)", source)
        sent = []

        class Protocol(fixes.HeadersOnDeny, WebSocketServerProtocol):
            def sendHttpErrorResponse(self, code, reason, responseHeaders=None):
                sent.append((code, reason, responseHeaders))

            def dropConnection(self, abort=False):
                pass

        protocol = Protocol()
        protocol.failHandshake("no", 401)
        protocol.deny_headers = [("Retry-After", "2")]
        protocol.failHandshake("slow down", 429)
        self.assertEqual(sent, [(401, "no", None), (429, "slow down", [("Retry-After", "2")])])


class TwistedTests(SynchronousTestCase):
    def test_exit_signal(self):
        # twistd makes the process die "killed by SIGTERM" from this attribute.
        self.assertIn("_exitSignal", vars(base.ReactorBase))

        class Reactor:
            _exitSignal = 15

        reactor = Reactor()
        fixes.exit_zero_after_stop_signal(reactor)
        self.assertIsNone(reactor._exitSignal)


class _Empty(Resource):
    isLeaf = True

    def render(self, request):
        return b""


class RequestHeadTests(SynchronousTestCase):
    """What ``web.GatewayRequest`` relies on: twisted.web calls ``gotLength``
    after the last header and before any byte of the body, with the request
    line still on the channel (``fixes.request_line``)."""

    def channel(self, decide):
        site = GatewaySite(_Empty(), decide=decide)
        site.reactor = Clock()
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 50000))
        channel.makeConnection(transport)
        return channel, transport

    def test_a_request_is_decided_at_its_head_before_its_body(self):
        seen = []

        def decide(request, method, target):
            seen.append((method, target, request.getHeader(b"x-who"), request.content))
            return error_answer(401, "unauthorized", "a bearer token is required")

        channel, transport = self.channel(decide)
        channel.dataReceived(
            b"POST /computers/7%3A/requests?account=a HTTP/1.1\r\nX-Who: me\r\n"
            b"Content-Length: 2000000\r\n\r\n"
        )
        # Decided with the head alone: no content file made, no body byte sent.
        self.assertEqual(seen, [(b"POST", b"/computers/7%3A/requests?account=a", b"me", None)])
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 401 "))
        self.assertTrue(transport.disconnecting)
        channel.dataReceived(b"x" * 100_000)  # what was in flight is not kept
        self.assertEqual(channel.requests[-1].content.getvalue(), b"")

    def test_the_request_line_is_there_until_the_body_is_read(self):
        lines = []

        def decide(request, method, target):
            lines.append(fixes.request_line(request))

        channel, _ = self.channel(decide)
        channel.dataReceived(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(lines, [(b"GET", b"/health")])

    def test_a_content_length_past_any_body_is_a_400_not_a_traceback(self):
        # twisted.web's int() raises past 4,300 digits (fixes.BoundedContentLength).
        channel, transport = self.channel(None)
        channel.dataReceived(b"POST /mcp HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 400 "))
        self.assertTrue(transport.disconnecting)
        self.assertEqual(self.flushLoggedErrors(), [])
