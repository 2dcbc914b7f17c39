"""The operator HTTP API in memory: /computers, requests to computers, auth, JSON errors."""

from urllib.parse import quote

import orjson
import treq
from treq.testing import StubTreq
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import HTTPConnectionPool, ResponseNeverReceived
from twisted.web.resource import Resource

from tests.harness.apps import gateway_app
from tests.harness.fakes import FakeLink
from tests.harness.logcapture import LogCapture
from tests.harness.support import JSON, both_modes, bounded, connect, reactor, start_gateway
from trapsandbox import errors
from trapsandbox.admission.auth import Admission, is_loopback
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.session import Session
from trapsandbox.limits import MAX_BODY_BYTES

BASE = "http://localhost:4444"
TOKEN = "op-token-1234"


class FromPeer(Resource):
    """Serve ``inner`` as if every client were at ``address``."""

    isLeaf = True

    def __init__(self, inner, address):
        super().__init__()
        self._inner = inner
        self._address = address

    def render(self, request):
        request.getClientAddress = lambda: self._address
        return self._inner.render(request)


class APITestCase(SynchronousTestCase):
    admin_token = None
    peer = None

    def setUp(self):
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.registry = Registry(self.clock, request_timeout=30)
        app = gateway_app(
            self.registry, admission=Admission(self.clock, admin_token=self.admin_token)
        )
        resource = app.resource()
        if self.peer is not None:
            resource = FromPeer(resource, self.peer)
        self.http = StubTreq(resource)

    def connect(self, trapos_id="7:", version="0.1.0"):
        link = FakeLink()
        session = Session(
            "local",
            trapos_id,
            link,
            self.clock,
            peer="tcp4:10.0.0.7:50123",
            version=version,
            connected_at=self.clock.seconds(),
        )
        self.registry.add(session)
        return session, link

    def call(self, method, path, body=None, headers=None, raw=None):
        data = raw if raw is not None else (None if body is None else orjson.dumps(body))
        d = self.http.request(method, BASE + path, data=data, headers={**JSON, **(headers or {})})
        self.http.flush()
        response = self.successResultOf(d)
        content = self.successResultOf(self.http.content(response))
        return response, content

    def start(self, trapos_id, body, headers=None, raw=None):
        """Start a POST; its Deferred fires once the computer answered (or not)."""
        data = raw if raw is not None else orjson.dumps(body)
        path = f"/computers/{quote(trapos_id, safe='')}/requests"
        return self.http.request(
            "POST", BASE + path, data=data, headers={**JSON, **(headers or {})}
        )

    def finish(self, d):
        self.http.flush()
        response = self.successResultOf(d)
        return response, orjson.loads(self.successResultOf(self.http.content(response)))

    def assertError(self, response, body, status, code):
        self.assertEqual(response.code, status, body)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        self.assertEqual(body["ok"], False)
        self.assertEqual(body["error"]["code"], code)
        self.assertIsInstance(body["error"]["message"], str)


class ComputersTests(APITestCase):
    def test_empty(self):
        response, body = self.call("GET", "/computers")
        self.assertEqual(response.code, 200)
        self.assertEqual(orjson.loads(body), {"computers": []})

    def test_lists_connected_computers(self):
        self.connect("8:turtle", version=None)
        self.clock.advance(60)
        self.connect("7:base")
        _, body = self.call("GET", "/computers")
        self.assertEqual(
            orjson.loads(body)["computers"],
            [
                {
                    "traposId": "7:base",
                    "accountId": "local",
                    "peer": "tcp4:10.0.0.7:50123",
                    "connectedSince": "2023-11-14T22:14:20Z",
                    "version": "0.1.0",
                    "inFlight": 0,
                    "capabilities": [],
                    "stopped": False,
                },
                {
                    "traposId": "8:turtle",
                    "accountId": "local",
                    "peer": "tcp4:10.0.0.7:50123",
                    "connectedSince": "2023-11-14T22:13:20Z",
                    "version": None,
                    "inFlight": 0,
                    "capabilities": [],
                    "stopped": False,
                },
            ],
        )


class RequestTests(APITestCase):
    def test_ping_round_trip(self):
        session, link = self.connect("7:")
        d = self.start("7:", {"type": "ping", "payload": {"n": 1}})
        self.http.flush()
        self.assertNoResult(d)
        [sent] = link.sent
        self.assertEqual((sent["type"], sent["payload"]), ("ping", {"n": 1}))
        session.resolve(
            wire.ComputerResponse("7:", sent["messageId"], "ping", True, {"traposId": "7:"})
        )
        response, body = self.finish(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(body, {"ok": True, "payload": {"traposId": "7:"}})

    def test_url_encoded_ids(self):
        for trapos_id in ("7:", "12:my turtle", "3:a/b", "4:50%", "5:ü"):
            session, link = self.connect(trapos_id)
            d = self.start(trapos_id, {"type": "ping"})
            self.http.flush()
            self.assertEqual(link.sent[-1]["traposReceiverId"], trapos_id)
            session.resolve(
                wire.ComputerResponse(trapos_id, link.sent[-1]["messageId"], "ping", True)
            )
            self.assertEqual(self.finish(d)[0].code, 200, trapos_id)

    def test_ok_false_answer_is_200(self):
        session, link = self.connect()
        d = self.start("7:", {"type": "teleport"})
        self.http.flush()
        session.resolve(
            wire.ComputerResponse(
                "7:",
                link.sent[0]["messageId"],
                "teleport",
                False,
                error=errors.Error("unknown_type", "no such type"),
            )
        )
        response, body = self.finish(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(
            body, {"ok": False, "error": {"code": "unknown_type", "message": "no such type"}}
        )

    def test_timeout_ms(self):
        self.connect()
        d = self.start("7:", {"type": "ping", "timeoutMs": 1500})
        self.http.flush()
        self.clock.advance(1.4)
        self.http.flush()
        self.assertNoResult(d)
        self.clock.advance(0.2)
        response, body = self.finish(d)
        self.assertError(response, body, 504, "timeout")
        self.assertIn("1.5 s", body["error"]["message"])

    def test_default_timeout_is_the_registry_one(self):
        self.connect()
        d = self.start("7:", {"type": "ping"})
        self.http.flush()
        self.clock.advance(29)
        self.http.flush()
        self.assertNoResult(d)
        self.clock.advance(1)
        self.assertError(*self.finish(d), 504, "timeout")

    def test_not_connected_is_404(self):
        self.assertError(*self.finish(self.start("9:", {"type": "ping"})), 404, "not_connected")

    def test_disconnect_while_waiting_is_404(self):
        session, _ = self.connect()
        d = self.start("7:", {"type": "ping"})
        self.http.flush()
        self.registry.remove(session)
        self.assertError(*self.finish(d), 404, "not_connected")

    def test_too_large_for_a_computer_is_413(self):
        self.connect()
        d = self.start("7:", {"type": "x", "payload": {"data": "x" * 200_000}})
        self.assertError(*self.finish(d), 413, "too_large")

    def test_body_over_the_cap_is_413(self):
        self.connect()
        d = self.start("7:", None, raw=b" " * (MAX_BODY_BYTES + 1))
        self.assertError(*self.finish(d), 413, "too_large")

    def test_overloaded_is_503(self):
        session, _ = self.connect()
        session.max_in_flight = 1
        self.start("7:", {"type": "ping"})
        self.assertError(*self.finish(self.start("7:", {"type": "ping"})), 503, "overloaded")

    def test_bad_bodies_are_400(self):
        self.connect()
        bad = [
            b"{",
            b"[]",
            b'"ping"',
            b"{}",
            b'{"type": ""}',
            b'{"type": 3}',
            b'{"type": "' + b"t" * 65 + b'"}',
            b'{"type": "ping", "payload": [1]}',
            b'{"type": "ping", "payload": "x"}',
            b'{"type": "ping", "timeoutMs": 0}',
            b'{"type": "ping", "timeoutMs": -5}',
            b'{"type": "ping", "timeoutMs": "10"}',
            b'{"type": "ping", "timeoutMs": true}',
            b'{"type": "ping", "timeoutMs": 1e300}',
        ]
        for raw in bad:
            response, body = self.finish(self.start("7:", None, raw=raw))
            self.assertError(response, body, 400, "bad_request")

    def test_wrong_method_is_json_405(self):
        response, body = self.call("GET", "/computers/7%3A/requests")
        self.assertError(response, orjson.loads(body), 405, "method_not_allowed")


class TokenTests(APITestCase):
    admin_token = TOKEN

    def test_no_token_is_401(self):
        for path in ("/computers", "/metrics"):
            response, body = self.call("GET", path)
            self.assertError(response, orjson.loads(body), 401, "unauthorized")
            self.assertEqual(
                response.headers.getRawHeaders("www-authenticate"), ['Bearer realm="trapsandbox"']
            )
        response, body = self.finish(self.start("7:", {"type": "ping"}))
        self.assertError(response, body, 401, "unauthorized")

    def test_wrong_token_is_401(self):
        for header in (f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", TOKEN, f"Bearer{TOKEN}"):
            response, body = self.call("GET", "/computers", headers={"authorization": header})
            self.assertError(response, orjson.loads(body), 401, "unauthorized")
            self.assertNotIn(TOKEN.encode(), body)

    def test_right_token(self):
        for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}"):
            response, _ = self.call("GET", "/computers", headers={"authorization": header})
            self.assertEqual(response.code, 200)
        response, body = self.call("GET", "/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        self.assertEqual(response.code, 200)
        self.assertIn(b"trapsandbox_hellos_total", body)

    def test_open_endpoints_need_no_token(self):
        self.assertEqual(self.call("GET", "/health")[0].code, 200)
        self.assertEqual(self.call("GET", "/client/apis/libsandbox.lua")[0].code, 200)

    def test_token_guessing_is_throttled(self):
        wrong = {"authorization": "Bearer guess"}
        for _ in range(6):
            self.assertEqual(self.call("GET", "/computers", headers=wrong)[0].code, 401)
        # Blocked now: its wrong tokens are refused, its right one is checked first.
        response, body = self.call("GET", "/computers", headers=wrong)
        self.assertError(response, orjson.loads(body), 429, "too_many_requests")
        self.assertEqual(response.headers.getRawHeaders("retry-after"), ["2"])
        right = {"authorization": f"Bearer {TOKEN}"}
        self.assertEqual(self.call("GET", "/computers", headers=right)[0].code, 200)
        self.clock.advance(2)
        self.assertEqual(self.call("GET", "/computers", headers=wrong)[0].code, 401)


class RemotePeerTests(APITestCase):
    """No token: a client that is not on this machine is refused."""

    peer = IPv4Address("TCP", "203.0.113.9", 40000)

    def test_operator_endpoints_are_403(self):
        for path in ("/computers", "/metrics"):
            response, body = self.call("GET", path)
            self.assertError(response, orjson.loads(body), 403, "forbidden")
            self.assertIn("SANDBOX_ADMIN_TOKEN", orjson.loads(body)["error"]["message"])
        self.assertError(*self.finish(self.start("7:", {"type": "ping"})), 403, "forbidden")

    def test_open_endpoints_stay_open(self):
        self.assertEqual(self.call("GET", "/health")[0].code, 200)
        self.assertEqual(self.call("GET", "/client/install.lua")[0].code, 200)


class RemotePeerWithTokenTests(APITestCase):
    peer = IPv6Address("TCP", "2001:db8::7", 40000)
    admin_token = TOKEN

    def test_token_lets_a_remote_operator_in(self):
        response, _ = self.call("GET", "/computers", headers={"authorization": f"Bearer {TOKEN}"})
        self.assertEqual(response.code, 200)
        response, _ = self.call("GET", "/computers")
        self.assertEqual(response.code, 401)


class LoopbackPeerWithTokenTests(APITestCase):
    """A configured token is needed from loopback too."""

    admin_token = TOKEN

    def test_loopback_without_token_is_401(self):
        self.assertEqual(self.call("GET", "/computers")[0].code, 401)


class LoopbackRuleTests(SynchronousTestCase):
    def test_loopback_addresses(self):
        for address in (
            IPv4Address("TCP", "127.0.0.1", 1),
            IPv4Address("TCP", "127.200.3.4", 1),
            IPv6Address("TCP", "::1", 1),
            IPv6Address("TCP", "::ffff:127.0.0.1", 1),
            UNIXAddress(b"/run/trapsandbox/gw.sock"),
            UNIXAddress(None),
        ):
            self.assertTrue(is_loopback(address), address)

    def test_other_addresses(self):
        for address in (
            IPv4Address("TCP", "10.0.0.1", 1),
            IPv4Address("TCP", "0.0.0.0", 1),
            IPv6Address("TCP", "::", 1),
            IPv6Address("TCP", "::ffff:10.0.0.1", 1),
            IPv6Address("TCP", "fe80::1%eth0", 1),
            IPv4Address("TCP", "localhost", 1),
            None,
        ):
            self.assertFalse(is_loopback(address), address)


class LoopbackAPITests(TestCase):
    """The API on a real gateway, with a real computer."""

    def setUp(self):
        self.gateway = start_gateway(self, password="sesame")
        self.base = f"http://127.0.0.1:{self.gateway.port}"
        self.pool = HTTPConnectionPool(reactor(), persistent=False)

    async def answer(self, d):
        response = await bounded(d)
        return response, orjson.loads(await bounded(treq.content(response)))

    async def test_no_access_line_per_request(self):
        log = LogCapture(self)
        response, _ = await self.answer(treq.get(self.base + "/health", pool=self.pool))
        self.assertEqual(response.code, 200)
        self.assertEqual([t for t in log.texts() if "GET /health" in t], [])

    async def test_list_and_ping_a_computer(self):
        computer = await connect(self, self.gateway.port)
        self.assertTrue((await computer.hello("sesame", "7:base"))["ok"])
        response, body = await self.answer(treq.get(self.base + "/computers", pool=self.pool))
        [listed] = body["computers"]
        self.assertEqual((listed["traposId"], listed["version"]), ("7:base", "test"))
        self.assertRegex(listed["peer"], r"^tcp4?:127\.0\.0\.1:\d+$")

        posted = treq.post(
            self.base + "/computers/7%3Abase/requests",
            data=orjson.dumps({"type": "ping", "timeoutMs": 5000}),
            headers=JSON,
            pool=self.pool,
        )
        request = await computer.next_message()
        self.assertEqual((request["event"], request["type"]), ("gateway_request", "ping"))
        computer.respond(request, payload={"traposId": "7:base"})
        response, body = await self.answer(posted)
        self.assertEqual(
            (response.code, body), (200, {"ok": True, "payload": {"traposId": "7:base"}})
        )

    async def test_a_body_over_the_cap_is_413(self):
        response, body = await self.answer(
            treq.post(
                self.base + "/computers/7%3A/requests",
                data=b"x" * (MAX_BODY_BYTES + 1),
                headers=JSON,
                pool=self.pool,
            )
        )
        self.assertEqual((response.code, body["error"]["code"]), (413, "too_large"))

    async def test_execute_streams_and_a_caller_leaving_cancels_the_run(self):
        computer = await connect(self, self.gateway.port)
        hello = await computer.request(
            "hello",
            {"traposId": "7:base", "secret": "sesame", "capabilities": ["exec"]},
        )
        self.assertTrue(hello["ok"])
        computer.trapos_id = "7:base"
        url = self.base + "/computers/7%3Abase/execute"
        # Streamed: each delta arrives as a line before the run ends.
        posted = treq.post(url, data=b'{"command": "count"}', headers=JSON, pool=self.pool)
        run = await computer.next_message()
        self.assertEqual((run["type"], run["payload"]["command"]), ("exec", "count"))
        delta = {"type": "stdout_delta", "data": "1\n"}
        computer.respond(run, payload=delta, partial=True)
        response = await bounded(posted)
        self.assertEqual(response.code, 200)
        lines = []
        first = Deferred()

        def received(data):
            lines.append(data)
            if not first.called:
                first.callback(None)

        done = treq.collect(response, received)
        await bounded(first)
        self.assertEqual(orjson.loads(b"".join(lines)), delta)
        final = {"exitCode": 0, "timedOut": False, "durationMs": 5, "stdout": "1\n"}
        computer.respond(run, payload=final)
        await bounded(done)
        self.assertEqual(orjson.loads(b"".join(lines).splitlines()[-1])["type"], "result")

        # A caller that goes away cancels the run on the computer.
        posted = treq.post(
            url, data=b'{"command": "sleep", "args": ["30"]}', headers=JSON, pool=self.pool
        )
        run = await computer.next_message()
        posted.addErrback(lambda failure: failure.trap(ResponseNeverReceived))
        posted.cancel()
        cancel = await computer.next_message()
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": run["messageId"]})
        )
        computer.respond(cancel, payload={"cancelled": True})
        computer.respond(run, ok=False, error={"code": "cancelled", "message": "cancelled"})
        # Frames are handled in order: once this is answered, so is the cancel.
        await computer.request("probe_gateway")
        self.assertEqual(self.gateway.registry.pending, 0)


both_modes(globals(), "LoopbackAPITests")


class ConsoleFilesTests(TestCase):
    """SPEC §14: the console's files at GET /, open, with a strict Content-Security-Policy."""

    async def test_the_page_and_its_files_come_with_their_policy(self):
        gateway = start_gateway(self, admin_token="t0ken-console")
        pool = HTTPConnectionPool(reactor(), persistent=False)
        base = f"http://127.0.0.1:{gateway.port}"
        for path, kind in (
            ("/", b"text/html; charset=utf-8"),
            ("/console/console.js", b"text/javascript; charset=utf-8"),
            ("/console/console.css", b"text/css; charset=utf-8"),
            ("/console/files.js", b"text/javascript; charset=utf-8"),
            ("/console/transfer.js", b"text/javascript; charset=utf-8"),
            ("/console/operator.js", b"text/javascript; charset=utf-8"),
            ("/console/agent.js", b"text/javascript; charset=utf-8"),
            # The code editor, bundled by `make` (npm run build in console/editor/).
            ("/console/editor.js", b"text/javascript; charset=utf-8"),
        ):
            response = await bounded(treq.get(base + path, pool=pool))
            body = await bounded(treq.content(response))
            self.assertEqual(response.code, 200, path)
            self.assertEqual(response.headers.getRawHeaders(b"content-type"), [kind])
            policy = response.headers.getRawHeaders(b"content-security-policy")[0]
            self.assertIn(b"default-src 'none'; script-src 'self'; style-src 'self'", policy)
            # (An SVG's namespace, in the editor's style for tabs, names no place to fetch.)
            body = body.replace(b'xmlns="http://www.w3.org/2000/svg"', b"")
            self.assertNotIn(b"://", body, "nothing is fetched from elsewhere")
        response = await bounded(treq.get(base + "/console/../setup.cfg", pool=pool))
        self.assertEqual(response.code, 404)
        response = await bounded(treq.get(base + "/console/secret.txt", pool=pool))
        self.assertEqual(response.code, 404)
        self.assertEqual((await bounded(treq.json_content(response)))["error"]["code"], "not_found")


both_modes(globals(), "ConsoleFilesTests")
