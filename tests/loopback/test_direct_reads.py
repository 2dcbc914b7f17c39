"""
The epoll reactor reads an accepted connection that is only readable itself
(``patches.read_accepted_connections_directly``): what the protocol hears,
and how the connection ends, are as in Twisted's own path.  Each test runs
with the patch and without it, and the two must agree.
"""

import select
import socket

from twisted.internet import epollreactor, protocol, tcp, threads
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.trial.unittest import TestCase
from zope.interface import implementer

from tests.harness.support import bounded, reactor
from trapsandbox.fast import patches


class _Recorder(protocol.Protocol):
    """Records what it hears; ``failing``: raises on the first data."""

    failing = False

    def __init__(self, heard: list, ended: Deferred) -> None:
        self.heard = heard
        self.ended = ended

    def dataReceived(self, data: bytes) -> None:
        self.heard.append(data)
        if self.failing:
            raise ZeroDivisionError("a bug in the protocol")

    def connectionLost(self, reason) -> None:
        self.ended.callback(reason.type)  # (a Failure would fail the Deferred)


@implementer(IHalfCloseableProtocol)
class _HalfClosing(_Recorder):
    """Answers ``done`` once the peer has shut its side, then closes."""

    def readConnectionLost(self) -> None:
        self.heard.append("read side closed")
        self.transport.write(b"done")
        self.transport.loseConnection()

    def writeConnectionLost(self) -> None:
        pass


class DirectReadTests(TestCase):
    async def serve(self, kind, client, direct):
        """Serve one connection of ``kind``, driven by ``client(sock)``: (heard, reason)."""
        self.addCleanup(patches.undo)
        patches.undo()
        if direct:
            patches.read_accepted_connections_directly()
        heard: list = []
        ended: Deferred = Deferred()
        factory = protocol.Factory.forProtocol(lambda: kind(heard, ended))
        port = reactor().listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        sock = socket.create_connection(("127.0.0.1", port.getHost().port))
        self.addCleanup(sock.close)
        sock.settimeout(10)
        answer = await bounded(threads.deferToThread(client, sock))
        reason = await bounded(ended)
        return _joined(heard), reason, answer

    async def both(self, kind, client):
        plain = await self.serve(kind, client, direct=False)
        direct = await self.serve(kind, client, direct=True)
        self.assertEqual(direct, plain)
        return direct

    async def test_the_reactor_reads_accepted_connections_itself(self):
        self.addCleanup(patches.undo)
        patches.read_accepted_connections_directly()
        self.assertIs(reactor().doIteration.__func__, patches._poll_reading_accepted_directly)

        the_reactor = reactor()
        twisteds = the_reactor._doReadOrWrite
        read_there = []

        def twisteds_path(selectable, fd, event):
            if type(selectable) is tcp.Server and event == select.EPOLLIN:
                read_there.append(selectable)
            return twisteds(selectable, fd, event)

        the_reactor._doReadOrWrite = twisteds_path
        self.addCleanup(vars(the_reactor).pop, "_doReadOrWrite")
        heard, reason, _ = await self.serve(_Recorder, _send_then_close(b"x" * 10), direct=True)
        self.assertEqual((heard, reason), ([b"x" * 10], ConnectionDone))
        self.assertEqual(read_there, [])

    async def test_every_byte_arrives_in_order_then_the_close(self):
        data = bytes(range(256)) * 2000  # past a read's bufferSize
        heard, reason, _ = await self.both(_Recorder, _send_then_close(data))
        self.assertEqual((heard, reason), ([data], ConnectionDone))

    async def test_a_protocol_that_raises_is_logged_and_dropped_with_its_error(self):
        class Failing(_Recorder):
            failing = True

        heard, reason, _ = await self.both(Failing, _send_then_wait(b"boom"))
        self.assertEqual((heard, reason), ([b"boom"], ZeroDivisionError))
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 2)

    async def test_a_half_close_is_heard_and_answered(self):
        heard, reason, answer = await self.both(_HalfClosing, _send_then_shut(b"request"))
        self.assertEqual(heard, [b"request", "read side closed"])
        self.assertEqual((reason, answer), (ConnectionDone, b"done"))

    def test_the_twisted_internals_it_repeats_are_there(self):
        source = open(epollreactor.__file__).read()
        self.assertIn("self._poller.poll(timeout, len(self._selectables))", source)
        self.assertIn("log.callWithLogger(selectable, _drdw, selectable, fd, event)", source)
        self.assertIs(epollreactor.EPollReactor.doIteration, epollreactor.EPollReactor.doPoll)
        self.assertIs(tcp.Server.doRead, tcp.Connection.doRead)
        self.assertIs(tcp.Server._dataReceived, tcp.Connection._dataReceived)
        source = open(tcp.__file__).read()
        self.assertIn("data = self.socket.recv(self.bufferSize)", source)
        self.assertIn("if se.args[0] == EWOULDBLOCK:", source)
        self.assertIn("self.protocol.dataReceived(data)", source)
        self.assertTrue(callable(epollreactor.EPollReactor._disconnectSelectable))


def _joined(heard):
    """What was heard, each run of data joined (how reads split it is the kernel's)."""
    joined: list = []
    for each in heard:
        if joined and type(each) is bytes and type(joined[-1]) is bytes:
            joined[-1] += each
        else:
            joined.append(each)
    return joined


def _read_to_end(sock):
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


# Each client runs in a thread on a blocking socket (bounded by its timeout): it waits on the
# kernel, not on a poll of its own, while the reactor serves the other end.


def _send_then_close(data):
    def client(sock):
        sock.sendall(data)
        sock.close()

    return client


def _send_then_wait(data):
    def client(sock):
        sock.sendall(data)
        return _read_to_end(sock)

    return client


def _send_then_shut(data):
    def client(sock):
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return _read_to_end(sock)

    return client
