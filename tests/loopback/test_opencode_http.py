"""
The asks' HTTP client to opencode (``opencode.http.OpencodeHTTP``, Twisted's Agent without
treq's layers) as a real twisted.web server hears it: the method, the path and the
``directory`` as sent (%-encoded, read back whole), opencode's Basic credentials, the JSON
body; no redirect followed, no cookie kept, no gzip asked for; and the event stream's GET.
"""

from __future__ import annotations

import orjson
import treq
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.resource import Resource

from tests.harness.servers import basic, serve
from tests.harness.support import bounded, reactor
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import OpencodeClient
from trapsandbox.opencode.http import OpencodeHTTP


class Recorded(Resource):
    """Answers every request with ``answer`` (code, headers, body) and keeps what it heard."""

    isLeaf = True

    def __init__(self, answer=(200, {b"content-type": b"application/json"}, b'{"id":"ses_1"}')):
        super().__init__()
        self.answer = answer
        self.heard = []

    def render(self, request):
        self.heard.append(
            {
                "method": request.method,
                "path": request.path,
                "args": request.args,
                "headers": {k.lower(): v for k, v in request.requestHeaders.getAllRawHeaders()},
                "body": request.content.read(),
            }
        )
        code, headers, body = self.answer
        request.setResponseCode(code)
        for name, value in headers.items():
            request.setHeader(name, value)
        return body


class OpencodeHTTPTests(TestCase):
    timeout = 20

    def setUp(self):
        self.server = Recorded()
        pool = HTTPConnectionPool(reactor(), persistent=False)
        self.client = OpencodeClient(
            OpencodeHTTP(Agent(reactor(), pool=pool)),
            reactor(),
            serve(self, self.server),
            password="s3cret pässword",
        )

    async def test_a_call_is_heard_as_sent(self):
        directory = "/var/lib/trapsandbox/ask/7-ab cd?#&=%é"
        answer = await bounded(
            self.client.create_session(directory, "7:base", [{"permission": "*"}])
        )
        self.assertEqual(answer, {"id": "ses_1"})
        [heard] = self.server.heard
        self.assertEqual(heard["method"], b"POST")
        self.assertEqual(heard["path"], b"/session")
        self.assertEqual(heard["args"], {b"directory": [directory.encode("utf-8")]})
        self.assertEqual(
            orjson.loads(heard["body"]), {"title": "7:base", "permission": [{"permission": "*"}]}
        )
        headers = heard["headers"]
        self.assertEqual(
            headers[b"authorization"], [basic("opencode", "s3cret pässword").encode("ascii")]
        )
        self.assertEqual(headers[b"content-type"], [b"application/json"])
        self.assertNotIn(b"accept-encoding", headers)  # opencode is not asked to gzip
        self.assertNotIn(b"cookie", headers)

    async def test_an_id_cannot_reach_another_path(self):
        await bounded(self.client.abort("/d", "ses_1/../../config?x=1#y"))
        [heard] = self.server.heard
        self.assertEqual(heard["path"], b"/session/ses_1%2F..%2F..%2Fconfig%3Fx%3D1%23y/abort")
        self.assertEqual(heard["args"], {b"directory": [b"/d"]})

    async def test_a_redirect_is_not_followed_and_a_cookie_not_kept(self):
        self.server.answer = (
            302,
            {b"location": b"/elsewhere", b"set-cookie": b"session=stolen"},
            b"",
        )
        with self.assertRaises(GatewayError) as raised:
            await bounded(self.client.statuses("/d"))
        self.assertIn("answered HTTP 302 to GET /session/status", str(raised.exception))
        with self.assertRaises(GatewayError):
            await bounded(self.client.statuses("/d"))
        self.assertEqual([h["path"] for h in self.server.heard], [b"/session/status"] * 2)
        self.assertNotIn(b"cookie", self.server.heard[1]["headers"])

    async def test_the_event_stream_get(self):
        response = await bounded(
            self.client.http.get(
                self.client.target("/global/event"),
                auth=self.client.auth,
                headers={b"Accept": [b"text/event-stream"]},
            )
        )
        self.assertEqual(response.code, 200)
        self.assertEqual(await bounded(treq.content(response)), b'{"id":"ses_1"}')
        [heard] = self.server.heard
        self.assertEqual(
            (heard["method"], heard["path"], heard["args"]), (b"GET", b"/global/event", {})
        )
        self.assertEqual(heard["headers"][b"accept"], [b"text/event-stream"])
        self.assertIn(b"authorization", heard["headers"])
