"""
The protocol rules, driven in memory: onMessage is called directly and the
frames the gateway sends are recorded.
"""

import orjson
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import asking
from tests.harness.fakes import Computer
from tests.harness.logcapture import LogCapture
from tests.harness.support import response_frame
from trapsandbox import errors, limits
from trapsandbox.admission.auth import Admission, host_of
from trapsandbox.computers import wire
from trapsandbox.computers.pathlocks import PathLocks
from trapsandbox.computers.protocol import GatewayFactory
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.handlers import ComputerRequests
from trapsandbox.limits import CONNECT_LINES_PER_SECOND, LOCAL_ACCOUNT


class GatewayTestCase(SynchronousTestCase):
    password = "sesame"

    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=60)
        self.probes = []
        self.factory = GatewayFactory(
            self.registry,
            Admission(self.clock, self.password),
            {
                "probe_gateway": self.fake_probe,
                "health": self.fake_probe,
                "explode": lambda session, frame: 1 / 0,
                "capabilities": ComputerRequests(None).capabilities,
            },
            self.clock,
        )

    def fake_probe(self, session, frame):
        d = Deferred()
        self.probes.append(d)
        return d

    def connect(self, trapos_id="7:", peer=None):
        return Computer(self.factory, trapos_id, peer)

    def ready(self, trapos_id="7:"):
        computer = self.connect(trapos_id)
        reply = computer.hello()
        self.assertTrue(reply["ok"], reply)
        return computer

    def assertError(self, frame, code):
        self.assertEqual(frame["event"], "gateway_response")
        self.assertFalse(frame["ok"])
        self.assertEqual(frame["error"]["code"], code, frame)
        self.assertNotIn("payload", frame)
        self.assertIsInstance(frame["error"]["message"], str)


class HelloTests(GatewayTestCase):
    def test_hello_registers(self):
        computer = self.connect("7:base")
        reply = computer.hello(version="0.1.0")
        self.assertEqual(
            reply,
            {
                "event": "gateway_response",
                "traposReceiverId": "7:base",
                "messageId": "1700000000000-1",
                "type": "hello",
                "ok": True,
                "payload": {"accountId": "local"},
            },
        )
        session = self.registry.find(LOCAL_ACCOUNT, "7:base")
        self.assertEqual((session.peer, session.version), ("tcp4:10.0.0.7:50123", "0.1.0"))
        self.assertEqual(computer.closes, [])

    def test_wrong_secret(self):
        computer = self.connect()
        reply = computer.hello(secret="guess")
        self.assertError(reply, errors.UNAUTHORIZED)
        self.assertNotIn("guess", reply["error"]["message"])
        self.assertEqual(computer.closes, [(4001, "unauthorized")])
        self.assertEqual(len(self.registry), 0)

    def test_missing_secret(self):
        computer = self.connect()
        computer.request("hello", {"traposId": "7:"})
        self.assertError(computer.last(), errors.UNAUTHORIZED)

    def test_no_password_means_any_secret(self):
        self.factory.admission = Admission(self.clock, None)
        computer = self.connect()
        computer.request("hello", {"traposId": "7:"})
        self.assertTrue(computer.last()["ok"])

    def test_bad_hello_payload(self):
        computer = self.connect()
        computer.request("hello", {"traposId": "seven", "secret": "sesame"})
        self.assertError(computer.last(), errors.BAD_REQUEST)
        self.assertIn("traposId", computer.last()["error"]["message"])
        self.assertEqual(computer.closes, [])
        # Still open for a good hello.
        self.assertTrue(computer.hello()["ok"])

    def test_second_hello(self):
        computer = self.ready()
        self.assertError(computer.hello(), errors.BAD_REQUEST)

    def test_requests_before_hello(self):
        computer = self.connect()
        computer.request("probe_gateway")
        self.assertError(computer.last(), errors.NOT_AUTHENTICATED)
        self.assertEqual(computer.last()["messageId"], "1700000000000-1")
        self.assertEqual(computer.closes, [])
        self.assertEqual(self.probes, [])

    def test_hello_timeout(self):
        computer = self.connect()
        self.clock.advance(9.9)
        self.assertEqual(computer.closes, [])
        self.clock.advance(0.1)
        self.assertEqual(computer.closes, [(4002, "hello timeout")])

    def test_hello_cancels_the_timeout(self):
        computer = self.ready()
        self.clock.advance(60)
        self.assertEqual(computer.closes, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_close_cancels_the_timeout(self):
        computer = self.connect()
        computer.lost()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_newest_wins(self):
        old = self.ready()
        pending = self.registry.request(asking("7:"), "ping")
        new = self.ready()
        self.assertEqual(old.closes, [(4000, "replaced")])
        self.failureResultOf(pending, GatewayError)
        old.lost(4000)
        self.assertIs(self.registry.find(LOCAL_ACCOUNT, "7:").link, new.protocol)


class RequestTests(GatewayTestCase):
    def test_capabilities_from_hello_and_announced_later(self):
        computer = self.connect("7:base")
        self.assertTrue(computer.hello(capabilities=["exec", "screen", "fly"])["ok"])
        [session] = self.registry
        self.assertEqual(session.capabilities, {"exec", "screen"})
        computer.request("capabilities", {"capabilities": {}})  # CraftOS's empty list
        self.assertEqual(computer.last()["payload"], {"capabilities": []})
        self.assertEqual(session.capabilities, frozenset())
        computer.request("capabilities", {"capabilities": ["fs.read"]})
        self.assertEqual(session.capabilities, {"fs.read"})
        computer.request("capabilities", {"capabilities": "all"})
        self.assertEqual(computer.last()["error"]["code"], "bad_request")
        self.assertEqual(session.capabilities, {"fs.read"})

    def test_probe_gateway(self):
        computer = self.ready()
        message_id = computer.request("probe_gateway")
        self.assertEqual(len(self.probes), 1)
        self.probes[0].callback({"sandboxOk": True, "opencodeOk": False, "opencodeDetail": "x"})
        reply = computer.last()
        self.assertEqual(reply["messageId"], message_id)
        self.assertEqual(reply["type"], "probe_gateway")
        self.assertTrue(reply["ok"])
        self.assertEqual(reply["payload"]["opencodeDetail"], "x")

    def test_health_alias_echoes_its_type(self):
        computer = self.ready()
        computer.request("health", [])
        self.probes[0].callback({"sandboxOk": True, "opencodeOk": True})
        self.assertEqual(computer.last()["type"], "health")

    def test_unknown_type(self):
        computer = self.ready()
        computer.request("launch_missiles")
        self.assertError(computer.last(), errors.UNKNOWN_TYPE)
        self.assertIn("launch_missiles", computer.last()["error"]["message"])

    def test_handler_error_is_internal(self):
        computer = self.ready()
        computer.request("explode")
        self.assertError(computer.last(), errors.INTERNAL)
        self.assertNotIn("ZeroDivision", computer.last()["error"]["message"])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_an_answer_too_large_for_a_computer(self):
        self.factory.handlers["big"] = lambda session, frame: {"pad": "x" * 200_000}
        computer = self.ready()
        computer.request("big")
        self.assertError(computer.last(), errors.TOO_LARGE)

    def test_an_answer_that_cannot_be_encoded(self):
        self.factory.handlers["odd"] = lambda session, frame: {"n": 2**70}
        computer = self.ready()
        computer.request("odd")
        self.assertError(computer.last(), errors.INTERNAL)
        self.flushLoggedErrors()

    def test_handler_gateway_error(self):
        computer = self.ready()
        computer.request("probe_gateway")
        self.probes[0].errback(GatewayError(errors.TIMEOUT, "slow"))
        self.assertError(computer.last(), errors.TIMEOUT)

    def test_bad_request(self):
        computer = self.ready()
        message_id = computer.request("probe_gateway", traposSenderId=5)
        self.assertError(computer.last(), errors.BAD_REQUEST)
        self.assertEqual(computer.last()["messageId"], message_id)
        self.assertIn("traposSenderId", computer.last()["error"]["message"])

    def test_busy_limit(self):
        computer = self.ready()
        for _ in range(self.factory.max_busy):
            computer.request("probe_gateway")
        sent = len(computer.sent)
        computer.request("probe_gateway")
        self.assertError(computer.last(), errors.OVERLOADED)
        self.assertEqual(len(computer.sent), sent + 1)
        self.probes[0].callback({"sandboxOk": True, "opencodeOk": True})
        computer.request("probe_gateway")
        self.assertEqual(len(self.probes), self.factory.max_busy + 1)

    def test_answer_after_close_is_dropped(self):
        computer = self.ready()
        computer.request("probe_gateway")
        computer.lost()
        sent = len(computer.sent)
        self.probes[0].callback({"sandboxOk": True, "opencodeOk": True})
        self.assertEqual(len(computer.sent), sent)


class IgnoredFrameTests(GatewayTestCase):
    """Bad frames are ignored, and the connection keeps working."""

    def assertStillWorks(self, computer):
        computer.request("probe_gateway")
        self.probes[-1].callback({"sandboxOk": True, "opencodeOk": True})
        self.assertTrue(computer.last()["ok"])
        self.assertEqual(computer.closes, [])

    def test_garbage(self):
        computer = self.ready()
        sent = len(computer.sent)
        for data in (b"{", b"[]", b"3", b'"x"', b'{"event":"nope"}', b"\xff"):
            computer.receive(data)
        computer.receive(b'{"event":"computer_request"}', binary=True)
        computer.receive(
            {
                "event": "gateway_request",
                "traposReceiverId": "7:",
                "messageId": "m",
                "type": "ping",
                "payload": {},
            }
        )
        self.assertEqual(len(computer.sent), sent)
        self.assertStillWorks(computer)

    def test_response_to_nothing(self):
        computer = self.ready()
        computer.receive(
            {
                "event": "computer_response",
                "traposSenderId": "7:",
                "messageId": "unknown",
                "type": "ping",
                "ok": True,
            }
        )
        self.assertStillWorks(computer)

    def test_ignored_frames_are_logged_rate_limited(self):
        events = []
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        computer = self.ready()
        for _ in range(50):
            computer.receive(b"{")
        ignored = [e for e in events if e.get("log_format", "").startswith("ignored")]
        self.assertEqual(len(ignored), 1)
        self.clock.advance(11)
        computer.receive(b"{")
        ignored = [e for e in events if e.get("log_format", "").startswith("ignored")]
        self.assertEqual(len(ignored), 2)
        self.assertEqual(ignored[1]["suppressed"], 49)


class GatewayRequestTests(GatewayTestCase):
    def test_answer_resolves(self):
        computer = self.ready()
        d = self.registry.request(asking("7:"), "ping")
        request = computer.last()
        self.assertEqual(request["event"], "gateway_request")
        computer.respond(request, payload={"traposId": "7:"})
        self.assertEqual(self.successResultOf(d).payload, {"traposId": "7:"})

    def test_invalid_answer_fails_the_request_at_once(self):
        computer = self.ready()
        d = self.registry.request(asking("7:"), "ping")
        computer.respond(computer.last(), ok="yes")
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.BAD_REQUEST)

    def test_answer_on_another_connection_is_ignored(self):
        seven = self.ready("7:")
        eight = self.ready("8:")
        d = self.registry.request(asking("7:"), "ping")
        eight.receive(response_frame("7:", seven.last()))
        self.assertNoResult(d)

    def test_close_fails_pending(self):
        computer = self.ready()
        d = self.registry.request(asking("7:"), "ping")
        computer.lost(1006)
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.NOT_CONNECTED)
        self.assertEqual(len(self.registry), 0)


class ShutdownTests(GatewayTestCase):
    def test_shutdown_closes_everyone_and_fails_pending(self):
        ready = self.ready("7:")
        waiting = self.connect("8:")
        pending = self.registry.request(asking("7:"), "ping")
        d = self.factory.shutdown()
        self.assertEqual(ready.closes, [(1000, "server shutting down")])
        self.assertEqual(waiting.closes, [(1000, "server shutting down")])
        self.assertEqual(self.failureResultOf(pending, GatewayError).value.code, "not_connected")
        self.assertNoResult(d)
        ready.lost()
        waiting.lost()
        self.successResultOf(d)

    def test_shutdown_is_bounded(self):
        computer = self.ready()
        d = self.factory.shutdown(grace=3)
        self.clock.advance(3)
        self.successResultOf(d)
        self.assertEqual(self.factory.connections, set())
        self.assertEqual(computer.protocol.state, WebSocketProtocol.STATE_CLOSED)
        # What Autobahn's warning of the drop gives as its reason (the fake stands in for
        # its dropConnection), for the operator's log: not "None".
        self.assertEqual(
            computer.protocol.wasNotCleanReason,
            "it did not answer the gateway's close within 3 s of its shutdown",
        )

    def test_shutdown_with_no_connections(self):
        self.successResultOf(self.factory.shutdown())


class LimitTests(GatewayTestCase):
    def test_producer_is_registered(self):
        computer = self.connect()
        self.assertIs(computer.protocol.transport.producer, computer.protocol.outbound)

    def test_stalled_computer_is_closed_4004(self):
        computer = self.ready()
        computer.protocol.outbound.pauseProducing()
        self.clock.advance(self.factory.stall_timeout)
        self.assertEqual(computer.closes, [(4004, "stalled")])

    def test_what_was_queued_goes_nowhere_once_closing(self):
        computer = self.ready()
        outbound = computer.protocol.outbound
        outbound.pauseProducing()
        self.registry.request(asking("7:"), "ping")
        sent = len(computer.sent)
        computer.protocol.close(4004, "stalled")
        outbound.resumeProducing()  # the peer reads again: the queue drains into nothing
        self.assertEqual(len(computer.sent), sent)
        self.assertEqual(outbound.queued_bytes, 0)

    def test_requests_to_a_stalled_computer_fail_overloaded(self):
        computer = self.ready()
        computer.protocol.outbound.pauseProducing()
        results = [
            self.registry.request(asking("7:"), "x", {"pad": "x" * 60_000}) for _ in range(20)
        ]
        failed = [d for d in results if d.called]
        self.assertEqual(len(failed), 20 - 17)  # 17 of 60 kB fit in 1 MiB
        for d in failed:
            self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.OVERLOADED)

    def test_unauthenticated_connections_per_address_are_capped(self):
        self.factory.max_unauthenticated_per_address = 2
        first = self.connect()
        self.connect()
        with self.assertRaises(ConnectionDeny) as caught:
            self.connect()
        self.assertEqual(caught.exception.code, 429)
        # Another address is not affected.
        self.connect(peer="tcp4:10.0.0.8:1")
        # A hello or a close frees a place.
        self.assertTrue(first.hello()["ok"])
        third = self.connect()
        third.lost()
        self.connect()
        self.assertEqual(self.factory.awaiting_hello, {"10.0.0.7": 2, "10.0.0.8": 1})

    def test_repeated_wrong_secrets_block_the_address(self):
        for _ in range(5):
            self.assertError(self.connect().hello(secret="guess"), errors.UNAUTHORIZED)
        self.assertError(self.connect().hello(secret="guess"), errors.UNAUTHORIZED)
        # Now blocked: its wrong secrets are refused with "try again".
        blocked = self.connect()
        reply = blocked.hello(secret="guess")
        self.assertError(reply, errors.OVERLOADED)
        self.assertIn("try again in 2 s", reply["error"]["message"])
        self.assertEqual(blocked.closes, [(4003, "too many failed hellos")])
        self.assertEqual(len(self.registry), 0)
        # The right secret from the same address is checked first and let in.
        self.assertTrue(self.connect().hello()["ok"])
        # Other addresses are not slowed.
        self.assertError(
            self.connect("8:", peer="tcp4:10.0.0.9:1").hello(secret="guess"), errors.UNAUTHORIZED
        )
        # After the block, a wrong secret is simply wrong again.
        self.clock.advance(2)
        self.assertError(self.connect("9:").hello(secret="guess"), errors.UNAUTHORIZED)

    def test_host_of(self):
        self.assertEqual(host_of(IPv4Address("TCP", "1.2.3.4", 5678)), "1.2.3.4")
        self.assertEqual(host_of(IPv6Address("TCP", "::1", 5678)), "::1")
        self.assertEqual(host_of(UNIXAddress(b"/run/gw.sock")), "unix")


class ConnectLineTests(GatewayTestCase):
    """A fleet reconnecting at once: a line per computer up to a budget a second, then a count."""

    def lines(self, captured, pattern):
        return [text for text in captured.texts() if pattern in text]

    def test_past_the_budget_the_rest_of_a_second_are_counted(self):
        captured = LogCapture(self)
        self.clock.advance(1000.5)
        computers = [self.ready(f"{n}:") for n in range(CONNECT_LINES_PER_SECOND + 5)]
        self.assertEqual(len(self.lines(captured, " connected from ")), CONNECT_LINES_PER_SECOND)
        self.assertEqual(self.lines(captured, "more computers connected"), [])
        self.clock.advance(0.5)  # that second is over
        [summary] = self.lines(captured, "more computers connected")
        self.assertIn("5 more computers connected in the last second", summary)
        # A new second, a new budget.
        late = self.ready("99:late")
        self.assertIn("99:late connected from", self.lines(captured, " connected from ")[-1])
        for computer in computers:
            computer.lost()
        self.assertEqual(len(self.lines(captured, " disconnected (")), CONNECT_LINES_PER_SECOND)
        self.assertEqual(self.lines(captured, "more computers disconnected"), [])
        # The last computer gone: the count is said at once, and no timer is left.
        late.lost()
        [summary] = self.lines(captured, "more computers disconnected")
        self.assertIn("6 more computers disconnected", summary)
        self.assertFalse(
            [call for call in self.clock.getDelayedCalls() if "flush" in repr(call.func)]
        )


class BinaryPartTests(GatewayTestCase):
    """File parts as binary messages, to and from a client that announced them."""

    def setUp(self):
        super().setUp()
        self.sandbox = Sandbox(self.registry, PathLocks(self.clock))

    def ready_with(self, features):
        computer = self.connect("7:b")
        reply = computer.hello(capabilities=["fs.read", "fs.write"], features=features)
        self.assertTrue(reply["ok"], reply)
        return computer

    def answer_part(self, computer, request, payload, raw):
        frame = response_frame("7:b", request, payload=payload)
        computer.receive(orjson.dumps(frame) + b"\n" + raw, binary=True)

    def test_a_write_goes_as_binary_parts_and_a_read_comes_back_as_them(self):
        computer = self.ready_with([wire.BINARY_PARTS])
        content = bytes(range(256)) * 600  # two parts
        d = self.sandbox.write_file(asking("7:b"), "/f.bin", content)
        first = computer.last()
        self.assertEqual(first["payload"]["encoding"], "binary")
        self.assertNotIn("content", first["payload"])
        self.assertEqual(first["raw"], content[: limits.BINARY_PART_BYTES])
        computer.respond(first, payload={"bytesWritten": len(first["raw"])})
        last = computer.last()
        self.assertEqual(last["raw"], content[limits.BINARY_PART_BYTES :])
        self.assertTrue(last["payload"]["part"]["final"])
        computer.respond(last, payload={"sizeBytes": len(content)})
        self.assertEqual(self.successResultOf(d)["bytesWritten"], len(content))

        d = self.sandbox.read_file(asking("7:b"), "/f.bin", 5, 10)
        ask = computer.last()
        self.assertEqual(ask["payload"]["encoding"], "binary")
        answer = {"encoding": "binary", "sizeBytes": len(content), "offset": 5, "bytesRead": 10}
        self.answer_part(computer, ask, answer, content[5:15])
        self.assertEqual(self.successResultOf(d)["content"], content[5:15])

    def test_a_client_without_them_gets_base64_and_its_binary_messages_are_ignored(self):
        computer = self.ready_with([])
        d = self.sandbox.read_file(asking("7:b"), "/f.bin")
        ask = computer.last()
        self.assertEqual(ask["payload"]["encoding"], "base64")
        answer = {"encoding": "binary", "sizeBytes": 3, "offset": 0, "bytesRead": 3}
        self.answer_part(computer, ask, answer, b"abc")
        self.assertNoResult(d)
        computer.respond(ask, payload={**answer, "encoding": "base64", "content": "YWJj"})
        self.assertEqual(self.successResultOf(d)["content"], b"abc")

    def test_binary_messages_that_are_not_file_parts(self):
        computer = self.ready_with([wire.BINARY_PARTS])
        d = self.sandbox.read_file(asking("7:b"), "/f.bin")
        ask = computer.last()
        sent = len(computer.sent)
        for garbage in (b"no header", b"{\n", b'{"event":"computer_request"}\nxyz', b"\xff\n"):
            computer.receive(garbage, binary=True)
        self.assertNoResult(d)
        # An error, or a partial, as a binary message: its request learns at once.
        error = response_frame("7:b", ask, ok=False, error={"code": "fs_error", "message": "x"})
        computer.receive(orjson.dumps(error) + b"\nxyz", binary=True)
        failure = self.failureResultOf(d, GatewayError)
        self.assertEqual(failure.value.code, errors.BAD_REQUEST)
        self.assertIn("binary frame that is not a file part's answer", failure.value.message)
        self.assertEqual(len(computer.sent), sent)
        self.assertEqual(computer.closes, [])

    def test_a_binary_answer_to_a_request_that_did_not_ask_for_one_fails_it(self):
        computer = self.ready_with([wire.BINARY_PARTS])
        d = self.registry.request(asking("7:b"), "ping", {})
        self.answer_part(computer, computer.last(), {"traposId": "7:b"}, b"x")
        failure = self.failureResultOf(d, GatewayError)
        self.assertEqual(failure.value.code, errors.BAD_REQUEST)
        self.assertIn("did not ask for one", failure.value.message)
        # A read that asked for base64 (a relayed one) is not answered in binary either.
        d = self.registry.request(asking("7:b"), "read_file", {"path": "/a", "encoding": "base64"})
        answer = {"encoding": "binary", "sizeBytes": 1, "offset": 0, "bytesRead": 1}
        self.answer_part(computer, computer.last(), answer, b"a")
        self.assertEqual(self.failureResultOf(d, GatewayError).value.code, errors.BAD_REQUEST)
