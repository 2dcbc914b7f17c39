"""Every protocol rule end to end, over real loopback sockets with a real Autobahn client."""

import socket
import threading

import orjson
import treq
from twisted.internet import tcp
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.callers import asking
from tests.harness.support import both_modes, bounded, connect, fast_paths, start_gateway
from trapsandbox.computers.protocol import GatewayProtocol
from trapsandbox.errors import GatewayError
from trapsandbox.fast import patches
from trapsandbox.fast.front import FrontFactory
from trapsandbox.fast.protocols import FastGatewayProtocol
from trapsandbox.limits import LOCAL_ACCOUNT


class LoopbackTestCase(TestCase):
    password = "sesame"

    def setUp(self):
        self.gateway = start_gateway(self, password=self.password)
        self.pool = HTTPConnectionPool(self.reactor(), persistent=False)

    def reactor(self):
        from twisted.internet import reactor

        return reactor

    def connect(self, path="/gateway?n=1"):
        return connect(self, self.gateway.port, path)

    async def ready(self, trapos_id="7:"):
        computer = await self.connect()
        reply = await computer.hello(self.password, trapos_id)
        self.assertTrue(reply["ok"], reply)
        return computer

    async def get(self, path):
        response = await bounded(
            treq.get(f"http://127.0.0.1:{self.gateway.port}{path}", pool=self.pool)
        )
        body = await bounded(treq.content(response))
        return response, body


class HTTPTests(LoopbackTestCase):
    def test_the_gateway_runs_in_the_mode_asked(self):
        listening = self.gateway.listeners[0].port.factory
        if fast_paths(self):
            self.assertIsInstance(listening, FrontFactory)
            self.assertIs(self.gateway.factory.protocol, FastGatewayProtocol)
            self.assertIs(tcp.Server.write, patches._write_through)
        else:
            # Twisted, Klein and Autobahn as they ship: the site routes every path.
            self.assertIs(listening.site, self.gateway.site)
            self.assertIs(self.gateway.factory.protocol, GatewayProtocol)
            self.assertNotIn("write", vars(tcp.Server))

    async def test_health(self):
        await self.ready()
        response, body = await self.get("/health")
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        health = orjson.loads(body)
        self.assertEqual(health["sandboxOk"], True)
        self.assertEqual(health["opencodeOk"], False)
        self.assertIn("connection refused", health["opencodeDetail"])
        self.assertEqual(health["computers"], 1)
        self.assertEqual(health["version"], "0.1.0")

    async def test_unknown_path_is_json_404(self):
        response, body = await self.get("/nope")
        self.assertEqual(response.code, 404)
        self.assertEqual(orjson.loads(body)["error"]["code"], "not_found")

    async def test_plain_get_of_the_gateway_is_refused(self):
        response, _ = await self.get("/gateway")
        self.assertGreaterEqual(response.code, 400)


class HandshakeTests(LoopbackTestCase):
    async def test_hello_and_probe(self):
        computer = await self.ready("7:base")
        self.assertEqual(self.gateway.registry.find(LOCAL_ACCOUNT, "7:base").version, "test")
        reply = await computer.request("probe_gateway")
        self.assertEqual(reply["event"], "gateway_response")
        self.assertEqual(reply["traposReceiverId"], "7:base")
        self.assertEqual(reply["type"], "probe_gateway")
        self.assertTrue(reply["ok"])
        self.assertEqual(reply["payload"]["sandboxOk"], True)
        self.assertEqual(reply["payload"]["opencodeOk"], False)
        self.assertIn("opencodeDetail", reply["payload"])

    async def test_health_alias_with_array_payload(self):
        computer = await self.ready()
        reply = await computer.request("health", [])
        self.assertEqual((reply["type"], reply["ok"]), ("health", True))

    async def test_wrong_secret_closes_4001(self):
        computer = await self.connect()
        reply = await computer.hello("guess")
        self.assertEqual(reply["error"]["code"], "unauthorized")
        code, reason = await computer.wait_closed()
        self.assertEqual((code, reason), (4001, "unauthorized"))
        self.assertEqual(len(self.gateway.registry), 0)

    async def test_not_authenticated_then_hello(self):
        computer = await self.connect()
        reply = await computer.request("probe_gateway")
        self.assertEqual(reply["error"]["code"], "not_authenticated")
        reply = await computer.hello(self.password)
        self.assertTrue(reply["ok"])

    async def test_hello_timeout_closes_4002(self):
        self.gateway.factory.hello_timeout = 0.2
        computer = await self.connect()
        code, reason = await computer.wait_closed()
        self.assertEqual((code, reason), (4002, "hello timeout"))

    async def test_newest_wins(self):
        old = await self.ready()
        pending = self.gateway.registry.request(asking("7:"), "ping")
        await old.next_message()  # the gateway_request
        new = await self.ready()
        code, reason = await old.wait_closed()
        self.assertEqual((code, reason), (4000, "replaced"))
        failure = await self.assertFailure(bounded(pending), GatewayError)
        self.assertEqual(failure.code, "not_connected")
        self.assertEqual(len(self.gateway.registry), 1)
        reply = await new.request("probe_gateway")
        self.assertTrue(reply["ok"])

    async def test_in_cluster_mode_hello_is_answered_once_every_process_finds_it(self):
        """
        SPEC §13: the hello answer waits for the claim in Redis, so a request at any
        process right after it finds the computer (not a 404 nor the previous owner).
        """
        claim = Deferred()

        class Peers:
            def added(self, session):
                pass

            def removed(self, session):
                pass

            def claim_answered(self, session):
                return claim

        self.gateway.registry.peers = Peers()
        computer = await self.connect()
        # (Each fires with the next frame to arrive, whichever it answers.)
        first = computer.hello(self.password, "7:far")
        second = computer.request("probe_gateway")  # the session works here meanwhile
        probe = await first
        self.assertEqual((probe["type"], probe["ok"]), ("probe_gateway", True))
        self.assertFalse(second.called)
        claim.callback(None)
        hello = await second
        self.assertEqual((hello["type"], hello["ok"]), ("hello", True))


class FrameTests(LoopbackTestCase):
    async def test_bad_frames_are_ignored(self):
        computer = await self.ready()
        for data in (b"{", b"[]", b"42", b'{"event":"nope"}'):
            computer.send(data)
        computer.sendMessage(b'{"event":"computer_request"}', isBinary=True)
        computer.send(
            {
                "event": "gateway_response",
                "traposReceiverId": "7:",
                "messageId": "x",
                "type": "hello",
                "ok": True,
            }
        )
        reply = await computer.request("probe_gateway")
        self.assertEqual(reply["messageId"], "test-2")  # nothing answered the junk
        self.assertTrue(reply["ok"])

    async def test_bad_request(self):
        computer = await self.ready()
        computer.send({"event": "computer_request", "messageId": "m9", "type": "probe_gateway"})
        reply = await computer.next_message()
        self.assertEqual((reply["messageId"], reply["error"]["code"]), ("m9", "bad_request"))

    async def test_unknown_type(self):
        computer = await self.ready()
        reply = await computer.request("teleport")
        self.assertEqual(reply["error"]["code"], "unknown_type")

    async def test_oversized_message_closes_1009(self):
        computer = await self.ready()
        computer.send(b'"' + b"x" * (1024 * 1024) + b'"')
        code, _ = await computer.wait_closed()
        self.assertEqual(code, 1009)

    async def test_message_of_one_mebibyte_is_accepted(self):
        computer = await self.ready()
        frame = {
            "event": "computer_request",
            "traposSenderId": "7:",
            "messageId": "big",
            "type": "probe_gateway",
            "payload": {"pad": ""},
        }
        frame["payload"]["pad"] = "x" * (1024 * 1024 - len(orjson.dumps(frame)))
        computer.send(frame)
        reply = await computer.next_message()
        self.assertEqual(reply["messageId"], "big")


class GatewayRequestTests(LoopbackTestCase):
    async def test_request_answered_by_the_computer(self):
        computer = await self.ready()
        d = self.gateway.registry.request(asking("7:"), "ping", {"n": 1})
        request = await computer.next_message()
        self.assertEqual(request["event"], "gateway_request")
        self.assertEqual(request["traposReceiverId"], "7:")
        self.assertEqual(request["payload"], {"n": 1})
        computer.respond(request, payload={"traposId": "7:"})
        response = await bounded(d)
        self.assertEqual(response.payload, {"traposId": "7:"})

    async def test_too_large_is_refused_locally(self):
        await self.ready()
        d = self.gateway.registry.request(asking("7:"), "x", {"data": "x" * 200_000})
        failure = await self.assertFailure(bounded(d), GatewayError)
        self.assertEqual(failure.code, "too_large")

    async def test_disconnect_fails_pending(self):
        computer = await self.ready()
        d = self.gateway.registry.request(asking("7:"), "ping")
        await computer.next_message()
        computer.dropConnection(abort=True)
        failure = await self.assertFailure(bounded(d), GatewayError)
        self.assertEqual(failure.code, "not_connected")


class ShutdownTests(LoopbackTestCase):
    def store_threads(self):
        return [t for t in threading.enumerate() if t.name.startswith("PoolThread-trapsandbox-")]

    async def test_stop_closes_computers_with_1000(self):
        ready = await self.ready()
        waiting = await self.connect()
        pending = self.gateway.registry.request(asking("7:"), "ping")
        await ready.next_message()
        stopped = self.gateway.service.stopService()
        self.assertEqual(await ready.wait_closed(), (1000, "server shutting down"))
        self.assertEqual(await waiting.wait_closed(), (1000, "server shutting down"))
        failure = await self.assertFailure(bounded(pending), GatewayError)
        self.assertEqual(failure.code, "not_connected")
        await bounded(Deferred.fromCoroutine(_wait(stopped)))

    async def test_a_gateway_stopped_while_its_store_opens_leaves_no_store_thread(self):
        # Stopped in the turn it started: the snapshots' store is still opening on its thread.
        # That thread, left running, kept pytest from exiting after a run of a few tests.
        others = set(self.store_threads())
        gateway = start_gateway(self, password=self.password)
        self.assertFalse(gateway.snapshots.ready().called)  # still opening
        (its,) = set(self.store_threads()) - others
        stopped = gateway.service.stopService()
        await bounded(Deferred.fromCoroutine(_wait(stopped)))
        self.assertFalse(its.is_alive())


async def _wait(d):
    return await d


class LimitTests(LoopbackTestCase):
    async def test_a_computer_that_stops_reading(self):
        """Sends to it are bounded, then refused, then it is closed with 4004."""
        self.gateway.factory.stall_timeout = 0.5
        computer = await self.ready()
        other = await self.ready("8:")
        computer.transport.pauseProducing()  # stop reading from the socket
        # Small kernel buffers on both ends, or loopback's autotuning soaks up
        # tens of megabytes before the gateway notices anything.
        protocol = self.gateway.registry.find(LOCAL_ACCOUNT, "7:").link
        for sock, option in (
            (computer.transport.getHandle(), socket.SO_RCVBUF),
            (protocol.transport.getHandle(), socket.SO_SNDBUF),
        ):
            sock.setsockopt(socket.SOL_SOCKET, option, 16384)
        pending = []
        for _ in range(1000):  # up to 64 MB: far more than the kernel buffers hold
            d = self.gateway.registry.request(asking("7:"), "big", {"pad": "x" * 65_000})
            if d.called:
                break
            pending.append(d)
        error = await self.assertFailure(d, GatewayError)
        self.assertEqual(error.code, "overloaded")
        self.assertLessEqual(protocol.outbound.queued_bytes, 1024 * 1024)
        # Other computers are served meanwhile.
        reply = await other.request("probe_gateway")
        self.assertTrue(reply["ok"])
        # Stalled past the timeout: closed, and every request it held fails.
        for d in pending:
            failure = await self.assertFailure(bounded(d), GatewayError)
            self.assertEqual(failure.code, "not_connected")
        self.assertIsNone(self.gateway.registry.find(LOCAL_ACCOUNT, "7:"))
        computer.transport.resumeProducing()
        code, _ = await computer.wait_closed()
        self.assertIn(code, (4004, 1006))  # the close frame may be lost with the unread data

    async def test_too_many_awaiting_hello_from_one_address(self):
        self.gateway.factory.max_unauthenticated_per_address = 1
        first = await self.connect()
        with self.assertRaises(ConnectionError):
            await self.connect()
        # The place is free again once the first said hello.
        self.assertTrue((await first.hello(self.password))["ok"])
        second = await self.connect()
        self.assertTrue((await second.hello(self.password, "8:"))["ok"])

    async def silent_http(self):
        """An HTTP request that never finishes; fires when the gateway drops it."""
        lost = Deferred()

        class Silent(Protocol):
            def connectionMade(self):
                self.transport.write(b"GET /heal")  # and nothing more

            def connectionLost(self, reason):
                lost.callback(None)

        endpoint = TCP4ClientEndpoint(self.reactor(), "127.0.0.1", self.gateway.port)
        await bounded(endpoint.connect(Factory.forProtocol(Silent)))
        return lost

    async def test_an_http_request_that_never_finishes_is_dropped(self):
        self.gateway.site.timeOut = 0.3
        await bounded(await self.silent_http(), 5)

    async def test_an_open_websocket_outlives_the_http_timeout(self):
        self.gateway.site.timeOut = 0.3
        computer = await self.ready()
        # Opened after the WebSocket: once it is dropped, the WebSocket has
        # been idle longer than the HTTP timeout.
        await bounded(await self.silent_http(), 5)
        self.assertFalse(computer.closed.called)
        reply = await computer.request("probe_gateway")
        self.assertTrue(reply["ok"])

    async def test_silent_connections_are_closed_4002(self):
        self.gateway.factory.hello_timeout = 0.5
        computers = [await self.connect() for _ in range(200)]
        closes = await bounded(gatherResults([c.wait_closed() for c in computers]))
        self.assertEqual(closes, [(4002, "hello timeout")] * 200)

    async def test_a_dead_peer_is_found_by_auto_ping(self):
        self.gateway.factory.setProtocolOptions(
            autoPingInterval=0.2, autoPingTimeout=0.2, allowNullOrigin=True
        )
        computer = await self.ready()
        d = self.gateway.registry.request(asking("7:"), "ping")
        await computer.next_message()
        computer.transport.pauseProducing()  # it reads nothing more, answers no ping
        error = await self.assertFailure(bounded(d), GatewayError)
        self.assertEqual(error.code, "not_connected")
        self.assertEqual(len(self.gateway.registry), 0)
        computer.transport.resumeProducing()
        code, _ = await computer.wait_closed()
        self.assertEqual(code, 1006)  # dropped: a dead peer gets no close handshake


both_modes(
    globals(),
    "HTTPTests",
    "HandshakeTests",
    "FrameTests",
    "GatewayRequestTests",
    "ShutdownTests",
    "LimitTests",
)
