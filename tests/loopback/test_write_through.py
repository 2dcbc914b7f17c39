"""
Writes to a connection the gateway accepted go out at once when nothing is
queued (``patches.write_through_accepted_connections``), else queue as in Twisted.
"""

from twisted.internet import protocol
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from tests.harness.support import reactor
from trapsandbox.fast import patches


class WriteThroughTests(TestCase):
    async def test_every_byte_arrives_in_order_past_the_socket_buffer(self):
        self.addCleanup(patches.undo)
        patches.write_through_accepted_connections()
        the_reactor = reactor()
        # Writes of every size, some far past what the socket takes at once.
        chunks = [bytes([n % 251]) * (1 + (n * 7919) % 300_000) for n in range(60)]
        expected = b"".join(chunks)
        received = []
        done = Deferred()

        class Writer(protocol.Protocol):
            def connectionMade(self):
                queued_at_once = []
                for chunk in chunks:
                    self.transport.write(chunk)
                    queued_at_once.append(self.transport._tempDataLen)
                self.transport.loseConnection()
                writer_state.append(queued_at_once)

        class Reader(protocol.Protocol):
            def dataReceived(self, data):
                received.append(data)

            def connectionLost(self, reason):
                done.callback(None)

        writer_state = []
        factory = protocol.Factory.forProtocol(Writer)
        port = the_reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        await protocol.ClientCreator(the_reactor, Reader).connectTCP(
            "127.0.0.1", port.getHost().port
        )
        await done
        self.assertEqual(b"".join(received), expected)
        # The first write went out at once; later ones queued behind what the socket refused.
        [queued] = writer_state
        self.assertEqual(queued[0], 0)
        self.assertGreater(queued[-1], 0)

    async def test_a_write_within_the_send_limit_goes_to_the_socket_itself(self):
        self.addCleanup(patches.undo)
        patches.write_through_accepted_connections()
        the_reactor = reactor()
        through_twisted = []
        done = Deferred()

        class Writer(protocol.Protocol):
            def connectionMade(self):
                twisteds = self.transport.writeSomeData

                def counted(data):
                    through_twisted.append(len(data))
                    return twisteds(data)

                self.transport.writeSomeData = counted
                self.transport.write(b"small" * 100)
                self.transport.write(b"large" * 30_000)  # past SEND_LIMIT: Twisted's
                self.transport.loseConnection()

        class Reader(protocol.Protocol):
            def connectionMade(self):
                self.received = []

            def dataReceived(self, data):
                self.received.append(data)

            def connectionLost(self, reason):
                done.callback(b"".join(self.received))

        port = the_reactor.listenTCP(0, protocol.Factory.forProtocol(Writer), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        await protocol.ClientCreator(the_reactor, Reader).connectTCP(
            "127.0.0.1", port.getHost().port
        )
        self.assertEqual(await done, b"small" * 100 + b"large" * 30_000)
        self.assertEqual(through_twisted[0], 150_000)
