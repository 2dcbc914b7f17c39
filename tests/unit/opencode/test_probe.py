"""The opencode probe, against a fake opencode driven in memory."""

import base64

from klein import Klein
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.opencode.probe import OpencodeProbe, ProbeResult, redact


class FakeOpencode:
    """Answers /config like opencode does: JSON with auth, the web UI elsewhere."""

    app = Klein()

    def __init__(self, password="pw", username="opencode"):
        self.expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.requests = 0
        self.stall = False
        self.held = None

    @app.route("/config")
    def config(self, request):
        self.requests += 1
        if self.stall:
            return Deferred()  # never answers
        if self.held is not None:
            d = Deferred()
            self.held.append(d)
            return d.addCallback(lambda _: self._answer(request))
        return self._answer(request)

    def _answer(self, request):
        if request.getHeader("authorization") != self.expected:
            request.setResponseCode(401)
            request.setHeader("www-authenticate", 'Basic realm="Secure Area"')
            return b""
        request.setHeader("content-type", "application/json")
        return b'{"username":"unknown"}'

    @app.route("/", branch=True)
    def web_ui(self, request):
        request.setHeader("content-type", "text/html; charset=utf-8")
        return b"<html>opencode</html>"


class ProbeTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.opencode = FakeOpencode()
        self.http = StubTreq(self.opencode.app.resource())

    def probe(self, url="http://127.0.0.1:4242", password="pw", **kwargs):
        return OpencodeProbe(self.http, self.clock, url, password=password, **kwargs)

    def result(self, probe):
        d = probe.check()
        self.http.flush()
        return self.successResultOf(d)

    def test_ok(self):
        self.assertEqual(self.result(self.probe()), ProbeResult(True))

    def test_payload_shape(self):
        self.assertEqual(ProbeResult(True).to_payload(), {"sandboxOk": True, "opencodeOk": True})
        self.assertEqual(
            ProbeResult(False, "why").to_payload(),
            {"sandboxOk": True, "opencodeOk": False, "opencodeDetail": "why"},
        )

    def test_wrong_password(self):
        result = self.result(self.probe(password="nope"))
        self.assertFalse(result.ok)
        self.assertIn("401", result.detail)
        self.assertIn("OPENCODE_SERVER_PASSWORD", result.detail)
        self.assertNotIn("nope", result.detail)

    def test_no_password_sent(self):
        result = self.result(self.probe(password=None))
        self.assertIn("401", result.detail)

    def test_html_200_is_not_ok(self):
        """A wrong URL reaches opencode's web UI, which answers 200 with HTML."""
        result = self.result(self.probe(url="http://127.0.0.1:4242/some/prefix"))
        self.assertFalse(result.ok)
        self.assertIn("200 with text/html", result.detail)
        self.assertIn("http://127.0.0.1:4242/some/prefix/config", result.detail)

    def test_connection_refused(self):
        class Refusing:
            def get(self, *args, **kwargs):
                return fail(ConnectionRefusedError())

        probe = OpencodeProbe(Refusing(), self.clock, "http://127.0.0.1:1")
        result = self.successResultOf(probe.check())
        self.assertEqual(
            result.detail, "http://127.0.0.1:1/config: connection refused: is opencode running?"
        )

    def test_never_answers_is_bounded(self):
        self.opencode.stall = True
        probe = self.probe()
        d = probe.check()
        self.http.flush()
        self.clock.advance(4.9)
        self.assertNoResult(d)
        self.clock.advance(0.1)
        result = self.successResultOf(d)
        self.assertFalse(result.ok)
        self.assertIn("no answer within 5 s", result.detail)
        # A failure is not reused: the next check makes a new request.
        probe.check()
        self.assertEqual(probe.requests_made, 2)

    def test_empty_url(self):
        probe = self.probe(url="")
        self.assertEqual(self.result(probe), ProbeResult(False, "OPENCODE_URL not set"))
        self.assertEqual((probe.requests_made, self.opencode.requests), (0, 0))

    def test_concurrent_callers_share_one_request(self):
        probe = self.probe()
        self.opencode.held = []
        ds = [probe.check() for _ in range(50)]
        self.http.flush()
        self.assertEqual(len(self.opencode.held), 1)
        held, self.opencode.held = self.opencode.held[0], None
        held.callback(None)
        self.http.flush()
        results = [self.successResultOf(d) for d in ds]
        self.assertEqual(set(results), {ProbeResult(True)})
        self.assertEqual((probe.requests_made, self.opencode.requests), (1, 1))

    def test_a_result_is_reused_for_a_second(self):
        probe = self.probe()
        first = self.result(probe)
        self.assertIs(probe.fresh(), first)
        self.clock.advance(0.9)
        self.assertIs(self.result(probe), first)
        self.assertEqual(self.opencode.requests, 1)
        self.clock.advance(0.1)
        self.assertIsNone(probe.fresh())
        self.result(probe)
        self.assertEqual(self.opencode.requests, 2)

    def test_a_failure_is_not_reused(self):
        """opencode down, then up: the very next check says so."""
        http = self.http

        class StartsLate:
            down = True

            def get(self, *args, **kwargs):
                if self.down:
                    return fail(ConnectionRefusedError())
                return http.get(*args, **kwargs)

        opencode = StartsLate()
        probe = OpencodeProbe(opencode, self.clock, "http://127.0.0.1:4242", password="pw")
        self.assertFalse(self.result(probe).ok)
        self.assertIsNone(probe.fresh())
        opencode.down = False
        self.assertTrue(self.result(probe).ok)
        self.assertEqual(probe.requests_made, 2)

    def test_payload_is_shared_and_to_payload_a_copy(self):
        result = ProbeResult(True)
        self.assertIs(result.payload, result.payload)
        copy = result.to_payload()
        copy["computers"] = 3
        self.assertEqual(result.payload, {"sandboxOk": True, "opencodeOk": True})

    def test_userinfo_is_never_shown(self):
        self.assertEqual(redact("http://u:secret@h:1/x"), "http://h:1/x")
        self.assertEqual(redact("http://h:1"), "http://h:1")
        result = self.result(self.probe(url="http://u:secret@127.0.0.1:4242/prefix"))
        self.assertNotIn("secret", result.detail)
