"""The first-bytes router: a computer's upgrade to Autobahn, everything else to the site."""

from twisted.internet import protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import limits
from trapsandbox.admission.strangers import Strangers
from trapsandbox.fast.front import FrontFactory


class Recorder(protocol.Protocol):
    def __init__(self, name, log):
        self.name = name
        self.log = log
        self.data = b""

    def dataReceived(self, data):
        self.data += data

    def connectionMade(self):
        self.log.append(self)


class Side(protocol.Factory):
    def __init__(self, name):
        self.name = name
        self.built = []
        self.started = 0

    def buildProtocol(self, addr):
        return Recorder(self.name, self.built)

    def doStart(self):
        self.started += 1

    def doStop(self):
        self.started -= 1


class AbortableTransport(StringTransport):
    aborted = False

    def abortConnection(self):
        self.aborted = True


class FrontTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.site, self.websocket = Side("site"), Side("websocket")
        self.operator = Side("operator")
        self.front = FrontFactory(
            self.site, self.websocket, self.clock, Strangers(), operator=self.operator
        )

    def connect(self, *chunks):
        router = self.front.buildProtocol(None)
        transport = AbortableTransport()
        transport.protocol = router
        router.makeConnection(transport)
        for chunk in chunks:
            transport.protocol.dataReceived(chunk)
        return transport

    def test_a_computers_upgrade_goes_to_autobahn_even_in_pieces(self):
        request = b"GET /gateway?n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        transport = self.connect(request[:2], request[2:9], request[9:])
        [chosen] = self.websocket.built
        self.assertEqual(self.site.built, [])
        self.assertIs(transport.protocol, chosen)
        self.assertEqual(chosen.data, request)
        # Later bytes reach it directly, and no timer is left behind.
        transport.protocol.dataReceived(b"frame")
        self.assertEqual(chosen.data, request + b"frame")
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_everything_else_goes_to_the_site(self):
        for request in (
            b"GET /health HTTP/1.1\r\n\r\n",
            b"GET /gatewayx HTTP/1.1\r\n\r\n",
            b"POST /gateway HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01garbage",
        ):
            transport = self.connect(request)
            self.assertEqual(transport.protocol.name, "site", request)
            self.assertEqual(transport.protocol.data, request)
        self.assertEqual(self.websocket.built, [])

    def test_an_operators_upgrade_goes_to_its_own_factory_even_in_pieces(self):
        for request in (b"GET /operator HTTP/1.1\r\n\r\n", b"GET /operator?x=1 HTTP/1.1\r\n\r\n"):
            pieces = (request[:3], request[3:7], request[7:13], request[13:])
            transport = self.connect(*pieces)
            self.assertEqual(transport.protocol.name, "operator", request)
            self.assertEqual(transport.protocol.data, request)
        for request in (b"GET /operatorx HTTP/1.1\r\n\r\n", b"GET /operator/x HTTP/1.1\r\n\r\n"):
            self.assertEqual(self.connect(request).protocol.name, "site", request)
        self.assertEqual((len(self.operator.built), self.websocket.built), (2, []))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_connection_that_never_says_enough_is_closed(self):
        transport = self.connect(b"GET /gat")
        self.clock.advance(limits.HTTP_IDLE_TIMEOUT - 0.1)
        self.assertFalse(transport.aborted)
        self.clock.advance(0.1)
        self.assertTrue(transport.aborted)

    def test_the_site_is_started_and_stopped_with_the_port(self):
        self.front.doStart()
        self.assertEqual(self.site.started, 1)
        self.front.doStop()
        self.assertEqual(self.site.started, 0)
