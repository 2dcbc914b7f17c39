"""
The operator's hot route read off the socket (``trapsandbox.fast.fasthttp``).

Most tests are differential: the same bytes sent to the port with the fast
reader and to the port without it (twisted.web alone) must get the same
answers, so that the fast path can never say something the site would not.
"""

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.apps import gateway_app
from tests.harness.fakes import FakeLink
from tests.harness.logcapture import LogCapture
from tests.harness.support import response_frame
from trapsandbox import limits
from trapsandbox.admission.accounts import Account, Accounts, sha256_hex
from trapsandbox.admission.auth import Admission
from trapsandbox.admission.strangers import Strangers
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session
from trapsandbox.fast.fasthttp import MAX_BUFFERED, FastHTTP, read_head
from trapsandbox.fast.front import FrontFactory
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.web.site import GatewaySite

TOKEN = b"op-token-1234"
AUTH = b"Authorization: Bearer " + TOKEN + b"\r\n"


def post(
    path=b"/computers/7%3A/requests",
    body=b'{"type":"ping"}',
    headers=AUTH,
    version=b"1.1",
    host=b"gw",
):
    return (
        b"POST %s HTTP/%s\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
        b"Content-Length: %d\r\n\r\n%s"
    ) % (
        path,
        version,
        host,
        headers,
        len(body),
        body,
    )


def responses(data):
    """``[(status, {header: value}, body)]`` of the HTTP/1.1 responses in ``data``."""
    found = []
    while data:
        end = data.index(b"\r\n\r\n")
        lines = data[:end].split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        rest = data[end + 4 :]
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            body, data = rest[:length], rest[length:]
        elif headers.get(b"transfer-encoding") == b"chunked":  # twisted.web's later answers
            body = b""
            while True:
                size_end = rest.index(b"\r\n")
                size = int(rest[:size_end], 16)
                body += rest[size_end + 2 : size_end + 2 + size]
                rest = rest[size_end + 2 + size + 2 :]
                if size == 0:
                    break
            data = rest
        else:  # HTTP/1.0: up to the close
            body, data = rest, b""
        found.append((status, headers, body))
    return found


# Headers whose values both sides must agree on (Date and Server may differ).
COMPARED = (b"content-type", b"cache-control", b"www-authenticate", b"retry-after")


def comparable(answers):
    return [
        (status, {k: v for k, v in headers.items() if k in COMPARED}, body)
        for status, headers, body in answers
    ]


class Port:
    """One listening gateway's HTTP side, in memory: connections are StringTransports."""

    def __init__(self, fast, admin_token="op-token-1234", registry=Registry, accounts=None):
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.registry = registry(self.clock, request_timeout=30)
        self.admission = Admission(self.clock, admin_token=admin_token, accounts=accounts)
        self.app = gateway_app(self.registry, admission=self.admission)
        self.site = GatewaySite(self.app.resource(), decide=self.app.decide)
        self.site.reactor = self.clock  # twisted.web's channels time out on our clock
        self.front = FrontFactory(
            self.site, None, self.clock, Strangers(), self.app.requests if fast else None
        )
        self.links = {}

    def computer(self, trapos_id="7:", account=LOCAL_ACCOUNT):
        link = FakeLink()
        self.registry.add(Session(account, trapos_id, link, self.clock))
        self.links[trapos_id] = link
        return link

    def answer(self, trapos_id="7:", index=-1, account=LOCAL_ACCOUNT, **fields):
        request = self.links[trapos_id].sent[index]
        frame = response_frame(trapos_id, request, **fields)
        session = self.registry.find(account, trapos_id)
        session.resolve(wire.decode(orjson.dumps(frame)))

    def connect(self, *chunks, peer=("127.0.0.1", 50000)):
        transport = StringTransport(peerAddress=IPv4Address("TCP", *peer))
        router = self.front.buildProtocol(transport.getPeer())
        transport.protocol = router
        router.makeConnection(transport)
        for chunk in chunks:
            transport.protocol.dataReceived(chunk)
        return transport


def both(admin_token="op-token-1234"):
    return Port(fast=True, admin_token=admin_token), Port(fast=False, admin_token=admin_token)


class SameAnswersTests(SynchronousTestCase):
    """What the site answers to a request, the fast reader answers too."""

    def exchange(self, data, computer=True, answer=None):
        results = []
        for port in both():
            if computer:
                port.computer()
            transport = port.connect(data)
            if answer is not None and port.links["7:"].sent:
                port.answer(**answer)
            results.append(comparable(responses(transport.value())))
            port.transport = transport
        fast, site = results
        self.assertEqual(fast, site)
        return fast

    def test_a_request_the_computer_answers(self):
        [(status, _, body)] = self.exchange(post(), answer={"payload": {"traposId": "7:"}})
        self.assertEqual(
            (status, orjson.loads(body)), (200, {"ok": True, "payload": {"traposId": "7:"}})
        )

    def test_an_answer_that_is_an_error(self):
        answer = {"ok": False, "error": {"code": "unknown_type", "message": "no"}}
        [(status, _, body)] = self.exchange(post(), answer=answer)
        self.assertEqual(status, 200)
        self.assertEqual(orjson.loads(body)["error"]["code"], "unknown_type")

    def test_refusals_and_bad_bodies(self):
        cases = {
            post(headers=b""): 401,
            post(headers=b"Authorization: Bearer wrong\r\n"): 401,
            post(headers=b"Authorization: Basic b3A6eA==\r\n"): 401,
            post(body=b"not json"): 400,
            post(body=b"[1]"): 400,
            post(body=b'{"type":""}'): 400,
            post(body=b'{"type":"ping","payload":[]}'): 400,
            post(body=b'{"type":"ping","timeoutMs":0}'): 400,
            post(body=b'{"type":"ping","timeoutMs":1e400}'): 400,
            post(path=b"/computers/8%3A/requests"): 404,
            post(path=b"/computers/%FF/requests"): 404,
            post(path=b"/computers/%2Fx/requests"): 404,  # a traposId starting "/"
            post(path=b"/computers/7%3A/requests?account=other"): 404,
        }
        for request, status in cases.items():
            with self.subTest(request=request):
                [(got, headers, body)] = self.exchange(request)
                self.assertEqual(got, status)
                self.assertEqual(headers[b"content-type"], b"application/json")
                self.assertIs(orjson.loads(body)["ok"], False)

    def test_browsers_and_bodies_not_json_are_refused_alike_at_the_head(self):
        text = (b"application/json", b"text/plain")
        local = b"127.0.0.1:4444"
        cases = {
            # No admin token: loopback is the admin, but not a web page's request.
            None: {
                post(headers=b"Origin: http://evil.example\r\n", host=local): 403,
                post(headers=b"Origin: null\r\n", host=local): 403,
                post(headers=b"Origin: http://localhost:4444\r\n", host=local): 403,
                post(headers=b"", host=b"evil.example:4444"): 403,  # DNS rebinding
                post(headers=b"", host=local).replace(*text): 415,
                post(headers=b"", host=local).replace(b"application/json", b"json"): 415,
                post(headers=b"", host=local).replace(
                    b"Content-Type: application/json\r\n", b""
                ): 415,
            },
            "op-token-1234": {
                post().replace(*text): 415,
                post(headers=b"").replace(*text): 401,  # who asks comes first
                post(headers=b"Origin: http://evil.example\r\n"): 401,
            },
        }
        for admin_token, requests in cases.items():
            for request, status in requests.items():
                with self.subTest(request=request):
                    answers = []
                    for port in both(admin_token):
                        port.computer()
                        transport = port.connect(request)
                        self.assertEqual(port.links["7:"].sent, [])  # nothing reached it
                        self.assertTrue(transport.disconnecting)  # the connection's last answer
                        answers.append(comparable(responses(transport.value())))
                    self.assertEqual(answers[0], answers[1])
                    [(got, _, body)] = answers[0]
                    self.assertEqual(got, status, body)
        # The gateway's own origin, and parameters after the media type, are fine.
        for request in (
            post(headers=b"Origin: http://127.0.0.1:4444\r\n", host=local),
            post(headers=b"", host=b"localhost").replace(
                b"application/json", b"Application/JSON; charset=utf-8"
            ),
        ):
            for port in both(None):
                port.computer()
                port.connect(request)
                self.assertEqual(len(port.links["7:"].sent), 1, request)

    def test_token_guessing_is_throttled_alike(self):
        wrong = post(headers=b"Authorization: Bearer guess\r\n")
        answers = []
        for port in both():
            # A refusal is the connection's last answer: one connection each.
            transports = [port.connect(request) for request in [wrong] * 8 + [post(), wrong]]
            answers.append([a for t in transports for a in comparable(responses(t.value()))])
            refusals = transports[:8] + transports[9:]
            self.assertTrue(all(t.disconnecting for t in refusals))
        self.assertEqual(answers[0], answers[1])
        statuses = [status for status, _, _ in answers[0]]
        # Five free failures, then the address's wrong tokens are refused; the right
        # token is checked first and answered.
        self.assertEqual(statuses, [401] * 6 + [429] * 2 + [404, 429])
        self.assertEqual(answers[0][-1][1][b"retry-after"], b"2")

    def test_what_the_fast_reader_leaves_to_the_site(self):
        chunked = (
            b"POST /computers/7%3A/requests HTTP/1.1\r\nHost: gw\r\n"
            + AUTH
            + b"Content-Type: application/json\r\n"
            + b'Transfer-Encoding: chunked\r\n\r\nf\r\n{"type":"ping"}\r\n0\r\n\r\n'
        )
        over = limits.MAX_BODY_BYTES + 1
        big = b"POST /computers/7%3A/requests HTTP/1.1\r\nContent-Type: application/json\r\n"
        big += AUTH
        big += b"Content-Length: " + str(over).encode() + b"\r\n\r\n" + b"x" * over
        cases = {
            chunked: None,  # answered by the computer below
            big: 413,
            b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n": 200,
            post(path=b"/computers/7%3A/requests/x"): 404,
            post(path=b"/computers/a%2Fb/requests"): 404,
        }
        for request, status in cases.items():
            with self.subTest(request=request[:60]):
                answer = {"payload": {}} if status is None else None
                [(got, _, _)] = self.exchange(request, answer=answer)
                self.assertEqual(got, status or 200)

    def test_http_1_0_and_connection_close_are_answered_then_closed(self):
        for request in (post(version=b"1.0"), post(headers=AUTH + b"Connection: close\r\n")):
            with self.subTest(request=request[:80]):
                fast, site = both()
                for port in (fast, site):
                    port.computer()
                    port.transport = port.connect(request)
                    port.answer(payload={})
                self.assertEqual(
                    comparable(responses(fast.transport.value())),
                    comparable(responses(site.transport.value())),
                )
                self.assertTrue(fast.transport.disconnecting)

    def test_a_malformed_request_gets_the_sites_400(self):
        for request in (
            b"POST /computers/7%3A/requests HTTP/1.1\r\nBad Header: x\r\nContent-Length: 2"
            b"\r\n\r\n{}",
            b"POST /computers/7%3A/requests HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3"
            b"\r\n\r\n{}",
            b"POST /computers/7%3A/requests HTTP/1.1\r\nContent-Length: -2\r\n\r\n{}",
            # A length Python will not read as an int (past 4,300 digits).
            b"POST /computers/7%3A/requests HTTP/1.1\r\nContent-Length: "
            + b"9" * 5000
            + b"\r\n\r\n{}",
            b"POST /computers/a\tb/requests HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        ):
            with self.subTest(request=request[:80]):
                answers = []
                for port in both():
                    transport = port.connect(request)
                    answers.append((transport.value(), transport.disconnecting))
                self.assertEqual(answers[0], answers[1])
                self.assertEqual(answers[0], (b"HTTP/1.1 400 Bad Request\r\n\r\n", True))

    def test_a_request_dripped_in_is_closed_408_at_the_deadline(self):
        """A byte every 20 s resets the idle timeout, not the request's own deadline."""
        request = post()
        cases = {
            "head": request[:40],
            "body": request[:-3],
            "another route": b"GET /health HTTP/1.1\r\nX-Slow: ",
        }
        for case, start in cases.items():
            with self.subTest(case=case):
                answers = []
                for port in both():
                    transport = port.connect(start)
                    port.clock.advance(limits.REQUEST_DEADLINE * 2 / 3)
                    self.assertFalse(transport.disconnecting)
                    transport.protocol.dataReceived(b"x")
                    port.clock.advance(limits.REQUEST_DEADLINE / 3 - 1)
                    self.assertFalse(transport.disconnecting)
                    port.clock.advance(1.5)  # REQUEST_DEADLINE after the first byte
                    self.assertTrue(transport.disconnecting)
                    answers.append(comparable(responses(transport.value())))
                    port.clock.advance(limits.HTTP_ABORT_AFTER)  # nothing read: aborted
                    self.assertEqual(port.clock.getDelayedCalls(), [])
                self.assertEqual(answers[0], answers[1])
                [(status, _, body)] = answers[0]
                self.assertEqual(status, 408)
                self.assertEqual(orjson.loads(body)["error"]["code"], "request_timeout")

    def test_a_head_over_the_limit_is_dropped_as_the_site_drops_it(self):
        request = b"POST /computers/7%3A/requests HTTP/1.1\r\nX: " + b"a" * 17000
        answers = []
        for port in both():
            transport = port.connect(request)
            answers.append((transport.value(), transport.disconnecting))
        self.assertEqual(answers, [(b"", True), (b"", True)])


class ReadHeadTests(SynchronousTestCase):
    def head(self, data):
        return read_head(data.split(b"\r\n\r\n")[0])

    def test_the_plain_case(self):
        plain = self.head(post(path=b"/computers/7%3A/requests?account=a"))
        fields = plain.fields
        self.assertEqual(
            (plain.segment, plain.query, plain.length, fields.authorization),
            (b"7%3A", b"account=a", 15, b"Bearer " + TOKEN),
        )
        self.assertEqual(
            (fields.host, fields.origin, fields.content_type), (b"gw", None, b"application/json")
        )

    def test_everything_unusual_is_left_alone(self):
        for request in (
            post(version=b"1.0"),
            post(headers=b"Expect: 100-continue\r\n"),
            post(headers=b"Transfer-Encoding: identity\r\n"),
            post(headers=b"Connection: upgrade\r\n"),
            post(headers=AUTH + AUTH),
            post(headers=b"Host: a\r\n"),  # a second Host
            post(headers=b"Origin: a\r\nOrigin: b\r\n"),
            post(headers=b"X: folded\r\n  line\r\n"),
            post(headers=b"X : space\r\n"),
            post(path=b"/computers//requests"),
            post(path=b"/computers/7/requests#f"),
            post(path=b"http://gw/computers/7/requests"),
            post(path=b"/computers/7\x00/requests"),
            post(path=b"/computers/7/requests?account=a\x7fb"),
            post().replace(b"Content-Length: 15", b"Content-Length: " + b"1" * 19),
            post().replace(b"POST", b"PUT"),
            post().replace(b"Content-Length: 15", b"Content-Length: 0x1"),
            post().replace(b"Content-Length: 15", b"Content-Length: \xd9\xa1"),
            post().replace(b"Content-Length: 15\r\n", b""),
        ):
            with self.subTest(request=request):
                self.assertIsNone(self.head(request))
                self.assertIsNone(self.head(request))  # and once its header lines are known
        self.assertIsNotNone(self.head(post(headers=b"Connection: Keep-Alive\r\n")))


class ConnectionTests(SynchronousTestCase):
    def setUp(self):
        self.port = Port(fast=True)
        self.link = self.port.computer()

    def test_pipelined_requests_are_answered_in_turn(self):
        transport = self.port.connect(post(body=b'{"type":"a"}') + post(body=b'{"type":"b"}'))
        # One at a time, as twisted.web: the second is not sent before the first is answered.
        self.assertEqual([r["type"] for r in self.link.sent], ["a"])
        self.port.answer(payload={"n": 1})
        self.assertEqual([r["type"] for r in self.link.sent], ["a", "b"])
        self.port.answer(payload={"n": 2})
        bodies = [orjson.loads(body) for _, _, body in responses(transport.value())]
        self.assertEqual(
            bodies, [{"ok": True, "payload": {"n": 1}}, {"ok": True, "payload": {"n": 2}}]
        )
        self.assertIsInstance(transport.protocol, FastHTTP)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(min_value=1, max_value=400), max_size=8))
    def test_any_split_of_the_bytes_gives_the_same_answers(self, cuts):
        port = Port(fast=True)
        port.computer()
        data = (
            post()
            + post(body=b'{"type":"ping","payload":{"x":[1,2]}}')
            + b"GET /health HTTP/1.1\r\n\r\n"
        )
        points = sorted({c for c in cuts if c < len(data)})
        pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
        transport = port.connect(*pieces)
        port.answer(payload={"n": 1})
        port.answer(payload={"n": 2})
        answers = responses(transport.value())
        self.assertEqual([status for status, _, _ in answers], [200, 200, 200])
        self.assertEqual(orjson.loads(answers[1][2]), {"ok": True, "payload": {"n": 2}})
        self.assertIn(b"sandboxOk", answers[2][2])

    def test_another_route_hands_the_connection_to_the_site_for_good(self):
        transport = self.port.connect(post())
        self.port.answer(payload={})
        transport.protocol.dataReceived(b"GET /health HTTP/1.1\r\n\r\n" + post())
        self.assertNotIsInstance(transport.protocol, FastHTTP)
        self.port.answer(payload={})
        self.assertEqual([s for s, _, _ in responses(transport.value())], [200, 200, 200])

    def test_a_client_that_goes_away_cancels_its_request(self):
        transport = self.port.connect(post(body=b'{"type":"ping"}'))
        session = self.port.registry.find(LOCAL_ACCOUNT, "7:")
        self.assertEqual(session.in_flight, 1)
        transport.protocol.connectionLost(None)
        self.assertEqual(session.in_flight, 0)
        self.assertEqual(self.port.clock.getDelayedCalls(), [])

    def test_an_idle_connection_is_closed_but_not_one_being_answered(self):
        transport = self.port.connect(post())
        self.port.clock.advance(limits.HTTP_IDLE_TIMEOUT + 5)  # waiting for the computer
        self.assertFalse(transport.disconnecting)
        self.port.answer(payload={})
        self.port.clock.advance(limits.HTTP_IDLE_TIMEOUT - 1)
        self.assertFalse(transport.disconnecting)
        self.port.clock.advance(1)
        self.assertTrue(transport.disconnecting)

    def test_reading_stops_while_too_much_waits_behind_a_request(self):
        transport = self.port.connect(post())
        transport.protocol.dataReceived(post() * (MAX_BUFFERED // len(post()) + 1))
        self.assertEqual(transport.producerState, "paused")
        self.port.answer(payload={})
        self.assertEqual(transport.producerState, "producing")

    def test_a_client_that_does_not_read_its_answers_stops_being_read(self):
        first = post(path=b"/computers/8%3A/requests")  # answered at once: not connected
        transport = self.port.connect(first[:20])
        protocol = transport.protocol
        self.assertIs(transport.producer, protocol)
        protocol.pauseProducing()  # as the transport does when its write buffer is full
        self.assertEqual(transport.producerState, "paused")
        protocol.dataReceived(first[20:] + first * 2)  # three refusals waiting to be written
        self.assertEqual(transport.value(), b"")
        protocol.resumeProducing()
        self.assertEqual([s for s, _, _ in responses(transport.value())], [404] * 3)
        self.assertEqual(transport.producerState, "producing")

    def test_the_site_takes_over_as_the_transports_producer(self):
        transport = self.port.connect(b"GET /health HTTP/1.1\r\n\r\n")
        self.assertNotIsInstance(transport.producer, FastHTTP)
        self.assertIsNotNone(transport.producer)

    def test_a_large_body_in_many_reads(self):
        payload = {"blob": "x" * 100_000}
        data = post(body=orjson.dumps({"type": "ping", "payload": payload}))
        pieces = [data[i : i + 4096] for i in range(0, len(data), 4096)]
        transport = self.port.connect(*pieces)
        self.assertEqual(self.link.sent[-1]["payload"], payload)
        self.port.answer(payload={})
        self.assertEqual([s for s, _, _ in responses(transport.value())], [200])

    def test_a_connection_decides_on_a_head_once_until_the_accounts_change(self):
        decided = []
        requests = self.port.app.requests
        admit = requests.admit
        requests.admit = lambda *args: decided.append(args) or admit(*args)
        transport = self.port.connect(post())
        self.port.answer(payload={})
        transport.protocol.dataReceived(post())
        self.port.answer(payload={})
        self.assertEqual(len(decided), 1)  # the same head lines: the decision kept
        transport.protocol.dataReceived(post(host=b"other"))
        self.port.answer(payload={})
        self.assertEqual(len(decided), 2)  # other head lines: decided again
        self.port.admission.reload(Accounts())
        transport.protocol.dataReceived(post(host=b"other"))
        self.port.answer(payload={})
        self.assertEqual(len(decided), 3)  # the accounts read again: decided again
        self.assertEqual([s for s, _, _ in responses(transport.value())], [200] * 4)

    def test_an_account_taken_out_by_a_reload_is_refused_on_a_kept_connection(self):
        alice = Account("alice", sha256_hex("secret-of-alice"), sha256_hex("token-of-alice"))
        port = Port(fast=True, accounts=Accounts.of([alice]))
        port.computer(account="alice")
        headers = b"Authorization: Bearer token-of-alice\r\n"
        transport = port.connect(post(headers=headers))
        port.answer(account="alice", payload={})
        port.admission.reload(Accounts())
        transport.protocol.dataReceived(post(headers=headers))
        self.assertEqual([s for s, _, _ in responses(transport.value())], [200, 401])
        self.assertEqual(len(port.links["7:"].sent), 1)

    def test_a_bug_is_a_500_and_logged(self):
        class Broken(Registry):
            def request(self, *args, **kwargs):
                return fail(RuntimeError("boom"))

        port = Port(fast=True, registry=Broken)
        captured = LogCapture(self)
        transport = port.connect(post())
        [(status, _, body)] = responses(transport.value())
        self.assertEqual(status, 500)
        self.assertEqual(orjson.loads(body)["error"]["code"], "internal")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertTrue(any("POST /computers/7%3A/requests failed" in t for t in captured.texts()))
