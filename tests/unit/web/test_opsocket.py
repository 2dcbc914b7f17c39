"""The operator WebSocket in memory: messages in, answers out, with a Clock and fake computers."""

import orjson
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.fakes import FakeLink, FakeTransport
from tests.harness.logcapture import LogCapture
from trapsandbox.admission.auth import Admission
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.screen import ScreenState
from trapsandbox.computers.session import Session
from trapsandbox.limits import STALL_TIMEOUT
from trapsandbox.ops.metrics import Metrics
from trapsandbox.web.operator import Answer, OperatorRequests
from trapsandbox.web.opsocket import OperatorSocketFactory, encode_answer, read_message, target

TOKEN = "unit-token-42"


class Upgrade:
    def __init__(self, peer, headers):
        self.peer = peer
        self.headers = headers


class Operator:
    """One in-memory operator connection: what it is sent, decoded."""

    def __init__(self, factory, token=None, peer="tcp4:127.0.0.1:50123"):
        self.sent = []
        self.closes = []
        self.protocol = protocol = factory.buildProtocol(None)
        protocol.sendMessage = lambda data, isBinary=False: self.sent.append(orjson.loads(data))
        protocol.sendClose = self._close
        protocol.transport = FakeTransport(peer)
        headers = {} if token is None else {"authorization": f"Bearer {token}"}
        protocol.onConnect(Upgrade(peer, headers))
        protocol.state = WebSocketProtocol.STATE_OPEN
        protocol.onOpen()

    def _close(self, code=None, reason=None):
        self.closes.append((code, reason))
        self.protocol.state = WebSocketProtocol.STATE_CLOSING

    def send(self, obj, binary=False):
        self.protocol.onMessage(obj if isinstance(obj, bytes) else orjson.dumps(obj), binary)

    def lost(self):
        self.protocol.state = WebSocketProtocol.STATE_CLOSED
        self.protocol.onClose(False, 1006, "")


class OperatorSocketTestCase(SynchronousTestCase):
    admin_token = None

    def setUp(self):
        self.clock = Clock()
        self.metrics = Metrics()
        self.registry = Registry(self.clock, request_timeout=30, metrics=self.metrics)
        self.admission = Admission(self.clock, admin_token=self.admin_token)
        self.requests = OperatorRequests(self.registry, self.admission)
        self.factory = OperatorSocketFactory(self.requests, self.clock, self.metrics)

    def computer(self, trapos_id="7:"):
        link = FakeLink()
        session = Session("local", trapos_id, link, self.clock)
        self.registry.add(session)
        return session, link

    def resolve(self, session, sent, **payload):
        session.resolve(
            wire.ComputerResponse(session.trapos_id, sent["messageId"], sent["type"], True, payload)
        )


class MessageTests(SynchronousTestCase):
    def test_reads_the_id_the_computer_and_the_account(self):
        message_id, obj = read_message(
            b'{"id": 12, "traposId": "7:", "type": "ping", "account": "bob"}'
        )
        trapos_id, account = target(obj)
        self.assertEqual((message_id, trapos_id, account, obj["type"]), (12, "7:", "bob", "ping"))
        message_id, obj = read_message(b'{"id": "a", "traposId": "7:"}')
        self.assertEqual((message_id, *target(obj)), ("a", "7:", None))

    def test_answers_splice_the_id_and_status_in_front_of_the_body(self):
        answer = Answer(404, {"ok": False, "error": {"code": "not_found", "message": "x"}})
        self.assertEqual(
            orjson.loads(encode_answer("q", answer)),
            {"id": "q", "status": 404, "ok": False, "error": {"code": "not_found", "message": "x"}},
        )
        self.assertEqual(
            orjson.loads(encode_answer(None, Answer(200, {"ok": True}))),
            {"id": None, "status": 200, "ok": True},
        )

    def test_a_body_orjson_cannot_write_is_a_502(self):
        deep: dict = {}
        inner = deep
        for _ in range(300):
            inner["a"] = {}
            inner = inner["a"]
        answer = orjson.loads(encode_answer(1, Answer(200, {"ok": True, "payload": deep})))
        self.assertEqual((answer["id"], answer["status"]), (1, 502))


class RequestTests(OperatorSocketTestCase):
    def test_a_request_reaches_the_computer_and_its_answer_comes_back_by_id(self):
        session, link = self.computer()
        operator = Operator(self.factory)
        operator.send({"id": 5, "traposId": "7:", "type": "ping", "payload": {"n": 1}})
        [sent] = link.sent
        self.assertEqual((sent["type"], sent["payload"]), ("ping", {"n": 1}))
        self.assertEqual(operator.sent, [])
        self.resolve(session, sent, traposId="7:")
        self.assertEqual(
            operator.sent, [{"id": 5, "status": 200, "ok": True, "payload": {"traposId": "7:"}}]
        )
        self.assertEqual(operator.protocol.in_flight, {})

    def test_a_timeout_is_answered_504_with_the_id(self):
        self.computer()
        operator = Operator(self.factory)
        operator.send({"id": "t", "traposId": "7:", "type": "ping", "timeoutMs": 1500})
        self.clock.advance(1.4)
        self.assertEqual(operator.sent, [])
        self.clock.advance(0.2)
        [answer] = operator.sent
        self.assertEqual(
            (answer["id"], answer["status"], answer["error"]["code"]), ("t", 504, "timeout")
        )

    def test_losing_the_connection_cancels_its_requests(self):
        session, link = self.computer()
        operator = Operator(self.factory)
        operator.send({"id": 1, "traposId": "7:", "type": "ping"})
        operator.send({"id": 2, "traposId": "7:", "type": "ping"})
        self.assertEqual(session.in_flight, 2)
        operator.lost()
        self.assertEqual((session.in_flight, operator.sent), (0, []))
        self.assertEqual(self.factory.connections, set())

    def test_an_error_in_handling_is_logged_once_and_answered_500(self):
        log = LogCapture(self)

        def broken(*args):
            raise RuntimeError("a bug")

        self.requests.send = broken
        operator = Operator(self.factory)
        operator.send({"id": 9, "traposId": "7:", "type": "ping"})
        [answer] = operator.sent
        self.assertEqual(
            (answer["id"], answer["status"], answer["error"]["code"]), (9, 500, "internal")
        )
        [error] = log.errors()
        self.assertIn("a bug", error)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        # And the connection still works.
        self.requests.send = OperatorRequests(self.registry, self.admission).send
        operator.send({"id": 10, "traposId": "9:", "type": "ping"})
        self.assertEqual(operator.sent[-1]["status"], 404)

    def test_a_request_failing_with_a_bug_is_logged_and_answered_500(self):
        log = LogCapture(self)
        pending = Deferred()
        self.requests.send = lambda *args: pending
        operator = Operator(self.factory)
        operator.send({"id": "b", "traposId": "7:", "type": "ping"})
        pending.errback(ZeroDivisionError("oops"))
        self.assertEqual(
            operator.sent,
            [
                {
                    "id": "b",
                    "status": 500,
                    "ok": False,
                    "error": {
                        "code": "internal",
                        "message": "the gateway failed to handle this request",
                    },
                }
            ],
        )
        self.assertEqual(len(log.errors()), 1)
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)

    def test_answers_are_counted_by_status(self):
        operator = Operator(self.factory)
        operator.send({"id": 1, "traposId": "9:", "type": "ping"})
        operator.send(b"nope")
        scraped = self.metrics.registry.get_sample_value
        self.assertEqual(
            scraped("trapsandbox_operator_socket_requests_total", {"status": "404"}), 1
        )
        self.assertEqual(
            scraped("trapsandbox_operator_socket_requests_total", {"status": "400"}), 1
        )
        self.assertEqual(
            scraped("trapsandbox_operator_socket_connections_total", {"outcome": "open"}), 1
        )


class ReaderTests(OperatorSocketTestCase):
    """An operator that stops reading, as a computer that does (``Outbound``)."""

    def setUp(self):
        super().setUp()
        self.factory.max_queued_bytes = 150

    def test_a_stalled_reader_is_refused_new_work_then_closed_4004(self):
        session, link = self.computer()
        operator = Operator(self.factory)
        outbound = operator.protocol.outbound
        outbound.pauseProducing()  # what the transport does when its buffer is full
        operator.send({"id": 1, "traposId": "9:", "type": "ping"})  # 404, queued
        operator.send({"id": 2, "traposId": "9:", "type": "ping"})  # no room: dropped
        self.assertEqual(operator.sent, [])
        self.assertGreater(outbound.queued_bytes, 0)
        self.assertLessEqual(outbound.queued_bytes, 150)
        operator.send({"id": 3, "traposId": "7:", "type": "ping"})
        self.assertEqual(link.sent, [], "work started for a connection that does not read")
        self.clock.advance(STALL_TIMEOUT)
        self.assertEqual(operator.closes, [(wire.CLOSE_STALLED, "stalled")])

    def test_a_reader_that_resumes_gets_what_waited(self):
        operator = Operator(self.factory)
        operator.protocol.outbound.pauseProducing()
        operator.send({"id": 1, "traposId": "9:", "type": "ping"})
        self.assertEqual(operator.sent, [])
        operator.protocol.outbound.resumeProducing()
        self.assertEqual([a["id"] for a in operator.sent], [1])
        self.clock.advance(STALL_TIMEOUT)
        self.assertEqual(operator.closes, [])


class AuthTests(OperatorSocketTestCase):
    admin_token = TOKEN

    def test_a_wrong_token_is_denied_401_with_the_challenge_and_never_logged(self):
        log = LogCapture(self)
        protocol = self.factory.buildProtocol(None)
        protocol.transport = FakeTransport("tcp4:127.0.0.1:1")
        with self.assertRaises(ConnectionDeny) as caught:
            protocol.onConnect(Upgrade("tcp4:127.0.0.1:1", {"authorization": f"Bearer {TOKEN}x"}))
        self.assertEqual(caught.exception.code, 401)
        self.assertEqual(
            protocol.deny_headers, [("www-authenticate", 'Bearer realm="trapsandbox"')]
        )
        self.assertFalse(any(TOKEN in text for text in log.texts()))

    def test_the_token_admits(self):
        operator = Operator(self.factory, token=TOKEN)
        self.assertTrue(operator.protocol.operator.admin)

    def test_remote_without_a_token_configured_is_403(self):
        factory = OperatorSocketFactory(
            OperatorRequests(self.registry, Admission(self.clock)), self.clock, self.metrics
        )
        protocol = factory.buildProtocol(None)
        protocol.transport = FakeTransport("tcp4:203.0.113.9:1")
        with self.assertRaises(ConnectionDeny) as caught:
            protocol.onConnect(Upgrade("tcp4:203.0.113.9:1", {}))
        self.assertEqual(caught.exception.code, 403)


class ScreenFramesTests(OperatorSocketTestCase):
    """Issue 35: a screen watch costs the gateway what its watcher can take, no more."""

    def watch(self, operator, max_fps=None):
        session, link = self.computer()
        session.capabilities = frozenset({"screen"})
        payload = {} if max_fps is None else {"maxFps": max_fps}
        operator.send({"id": "s", "traposId": "7:", "type": "screen_watch", "payload": payload})
        [watch] = link.sent
        return session, watch

    def frame(self, session, watch, n, **fields):
        session.resolve(
            wire.ComputerResponse(
                "7:",
                watch["messageId"],
                "screen_watch",
                True,
                {"cursorX": n, "rows": {"1": {"line": str(n)}}, **fields},
                partial=True,
            )
        )

    def test_frames_are_not_expanded_while_the_watcher_has_no_room(self):
        operator = Operator(self.factory)
        session, watch = self.watch(operator, max_fps=20)
        self.frame(session, watch, 0, width=3, height=1)
        self.assertEqual(len(operator.sent), 1)
        operator.protocol.outbound.pauseProducing()
        expanded = []
        real_apply = ScreenState.apply
        self.patch(ScreenState, "apply", lambda s, f: expanded.append(f) or real_apply(s, f))
        for n in range(1, 50):
            self.frame(session, watch, n)
            self.clock.advance(0.05)
        self.assertEqual(expanded, [])
        operator.protocol.outbound.resumeProducing()
        # The latest state, in one frame, as soon as there is room.
        self.assertEqual(len(expanded), 1)
        self.assertEqual(operator.sent[-1]["payload"]["cursorX"], 49)
        self.assertEqual(operator.sent[-1]["payload"]["rows"]["1"]["line"], "499")

    def test_a_screen_far_beyond_craftos_ends_the_watch_with_413(self):
        operator = Operator(self.factory)
        session, watch = self.watch(operator)
        self.frame(session, watch, 0, width=512, height=512)
        [answer] = operator.sent
        self.assertEqual((answer["id"], answer["status"]), ("s", 413))
        self.assertEqual(answer["error"]["code"], "too_large")
        self.assertEqual(operator.protocol.in_flight, {})
