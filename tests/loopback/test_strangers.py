"""
Browsers are not operators, and nothing is buffered for a stranger (SPEC §4),
on the real port as ``makeService`` assembles it (the fast reader included),
with raw bytes.
"""

from __future__ import annotations

import orjson
from twisted.internet.defer import Deferred, DeferredQueue
from twisted.trial.unittest import TestCase

from tests.harness.rawhttp import RawHTTP, raw
from tests.harness.support import both_modes, bounded, connect, start_gateway

TOKEN = "op-token-1234"
EVIL = b"Origin: http://evil.example\r\n"
TEXT = b"Content-Type: text/plain\r\n"
JSON = b"Content-Type: application/json\r\n"
# What a page's simple POST would ask of each operator route.
ROUTES = {
    b"execute": {"command": "rm", "args": ["-rf", "/"]},
    b"eval": {"code": "fs.delete('/')"},
    b"write-file": {"path": "startup.lua", "content": "cHduZWQ=", "encoding": "base64"},
    b"requests": {"type": "ping"},
}


def request(
    method: bytes, path: bytes, host: bytes | None, headers: bytes = b"", body: bytes = b""
) -> bytes:
    head = b"%s %s HTTP/1.1\r\n" % (method, path)
    if host is not None:
        head += b"Host: %s\r\n" % host
    if body or method == b"POST":
        head += b"Content-Length: %d\r\n" % len(body)
    return head + headers + b"\r\n" + body


class BrowserTests(TestCase):
    """No admin token: loopback clients are the admin, but not a browser's page."""

    async def gateway(self, **settings):
        self.gateway = start_gateway(self, **settings)
        self.port = self.gateway.port
        self.host = b"127.0.0.1:%d" % self.port
        self.computer = await connect(self, self.port)
        hello = {
            "traposId": "7:base",
            "version": "test",
            "capabilities": ["exec", "eval", "fs.read", "fs.write", "screen"],
        }
        self.computer.trapos_id = "7:base"
        self.assertTrue((await self.computer.request("hello", hello))["ok"])

    async def assertReachesTheComputer(self, client: RawHTTP, data: bytes) -> dict:
        """``data`` (a ping to /requests) is the first thing the computer is asked."""
        client.transport.write(data)
        asked = await self.computer.next_message()
        self.assertEqual((asked["event"], asked["type"]), ("gateway_request", "ping"))
        self.computer.respond(asked, payload={"pong": True})
        status, _, body = await client.response()
        self.assertEqual(status, 200, body)
        return orjson.loads(body)

    async def test_a_web_pages_simple_post_reaches_no_computer(self):
        await self.gateway()
        for route, payload in ROUTES.items():
            body = orjson.dumps(payload)
            path = b"/computers/7%3Abase/" + route
            for headers, status in (
                (EVIL + TEXT, 403),  # the page's own simple POST
                (EVIL + JSON, 403),  # (not simple: its preflight would fail, but still)
                (TEXT, 415),  # no Origin, not JSON
                (b"Origin: null\r\n" + JSON, 403),
                # The same through twisted.web rather than the fast reader.
                (EVIL + TEXT + b"Connection: close\r\n", 403),
            ):
                with self.subTest(route=route, headers=headers):
                    client = await raw(
                        self, self.port, request(b"POST", path, self.host, headers, body)
                    )
                    got, answer = await client.refused()
                    self.assertEqual(got, status, answer)
                    self.assertEqual(
                        answer["error"]["code"],
                        "forbidden" if status == 403 else "unsupported_media_type",
                    )
        # Nothing of the above reached the computer: a real request is the first it sees.
        client = await raw(self, self.port)
        ping = request(
            b"POST", b"/computers/7%3Abase/requests", self.host, JSON, b'{"type":"ping"}'
        )
        answer = await self.assertReachesTheComputer(client, ping)
        self.assertEqual(answer, {"ok": True, "payload": {"pong": True}})

    async def test_a_dns_rebinding_host_is_refused(self):
        await self.gateway()
        for host in (b"evil.example:%d" % self.port, b"evil.example", b"10.0.0.1:4444"):
            with self.subTest(host=host):
                client = await raw(self, self.port, request(b"GET", b"/computers", host))
                status, answer = await client.refused()
                self.assertEqual((status, answer["error"]["code"]), (403, "forbidden"))
                self.assertIn("Host", answer["error"]["message"])
        ping = request(
            b"POST",
            b"/computers/7%3Abase/requests",
            b"evil.example:%d" % self.port,
            JSON,
            b'{"type":"ping"}',
        )
        client = await raw(self, self.port, ping)
        self.assertEqual((await client.refused())[0], 403)
        # This machine's names, no Host at all (an HTTP/1.0 tool), and the gateway's own origin.
        port = b"%d" % self.port
        for host, headers in (
            (b"localhost:" + port, b""),
            (b"127.0.0.1", b""),
            (b"[::1]:" + port, b""),
            (b"app.localhost:" + port, b""),
            (None, b""),
            (self.host, b"Origin: http://" + self.host + b"\r\n"),
        ):
            with self.subTest(host=host, headers=headers):
                client = await raw(self, self.port, request(b"GET", b"/computers", host, headers))
                status, _, body = await client.response()
                self.assertEqual(status, 200, body)
                self.assertEqual(orjson.loads(body)["computers"][0]["traposId"], "7:base")

    async def test_a_same_origin_request_still_reaches_the_computer(self):
        await self.gateway()
        same = b"Origin: http://" + self.host + b"\r\n" + JSON
        client = await raw(self, self.port)
        ping = request(
            b"POST", b"/computers/7%3Abase/requests", self.host, same, b'{"type":"ping"}'
        )
        await self.assertReachesTheComputer(client, ping)
        # On the site's path too.
        client = await raw(self, self.port)
        closing = same + b"Connection: close\r\n"
        ping = request(
            b"POST", b"/computers/7%3Abase/requests", self.host, closing, b'{"type":"ping"}'
        )
        await self.assertReachesTheComputer(client, ping)

    async def test_a_token_is_not_asked_where_it_is_from(self):
        # With a token, any Host and Origin: a page has no token unless given it.
        await self.gateway(admin_token=TOKEN)
        headers = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n" + EVIL
        client = await raw(self, self.port, request(b"GET", b"/computers", b"gw.example", headers))
        self.assertEqual((await client.response())[0], 200)


class GatewayOriginTests(TestCase):
    async def upgrade(self, port: int, origin: bytes | None) -> bytes:
        head = (
            b"GET /gateway?n=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n" % port
        )
        if origin is not None:
            head += b"Origin: " + origin + b"\r\n"
        client = await raw(self, port, head + b"\r\n")
        while b"\r\n\r\n" not in client.buffer:
            client._waiting = Deferred()
            await bounded(client._waiting)
        return client.buffer.split(b"\r\n", 1)[0]

    async def test_a_web_page_cannot_connect_as_a_computer(self):
        for settings in ({}, {"password": "s3cret"}):
            with self.subTest(settings=settings):
                port = start_gateway(self, **settings).port
                for origin in (b"http://evil.example", b"null", b"http://localhost:8080"):
                    self.assertIn(b" 403 ", await self.upgrade(port, origin))
                # CC:Tweaked and CraftOS-PC send no Origin; a page the gateway served is its own.
                self.assertIn(b" 101 ", await self.upgrade(port, None))
                own = b"http://127.0.0.1:%d" % port
                self.assertIn(b" 101 ", await self.upgrade(port, own))


class StrangerTests(TestCase):
    """An admin token is set: a caller without it is a stranger."""

    def setUp(self):
        self.gateway = start_gateway(self, admin_token=TOKEN)
        self.port = self.gateway.port

    async def test_a_strangers_body_is_refused_unread_at_its_head(self):
        big = b"Content-Length: 2000000\r\n" + JSON
        for path in (b"/computers/7%3A/requests", b"/computers/7%3A/execute", b"/mcp"):
            for extra in (b"", b"Authorization: Bearer wrong\r\n", b"Connection: close\r\n"):
                with self.subTest(path=path, extra=extra):
                    head = b"POST %s HTTP/1.1\r\nHost: gw.example\r\n%s%s\r\n" % (path, big, extra)
                    # The head alone: the answer comes before any byte of the body.
                    client = await raw(self, self.port, head)
                    status, answer = await client.refused()
                    self.assertEqual((status, answer["error"]["code"]), (401, "unauthorized"))

    async def test_unadmitted_connections_per_address_are_capped(self):
        strangers = self.gateway.strangers
        strangers.limit = 2
        # The front counts a connection once its first bytes are read: each is awaited.
        entered: DeferredQueue = DeferredQueue()
        enter = strangers.enter

        def counted(address):
            ticket = enter(address)
            entered.put(ticket)
            return ticket

        strangers.enter = counted
        waiting = []
        for _ in range(2):
            waiting.append(
                await raw(self, self.port, b"POST /computers/7%3A/requests HTTP/1.1\r\n")
            )
            await bounded(entered.get())
        self.assertEqual(strangers.waiting, {"127.0.0.1": 2})
        third = await raw(self, self.port, b"GET /health HTTP/1.1\r\n\r\n")
        status, answer = await third.refused()
        self.assertEqual((status, answer["error"]["code"]), (429, "too_many_requests"))
        # An admitted request frees its connection's place.
        auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
        waiting[0].transport.write(
            b"Host: 127.0.0.1\r\n" + auth + JSON + b"Content-Length: 0\r\n\r\n"
        )
        status, _, _ = await waiting[0].response()
        self.assertEqual(status, 400)  # (an empty body is not JSON)
        fourth = await raw(self, self.port, b"GET /health HTTP/1.1\r\n\r\n")
        self.assertEqual((await fourth.response())[0], 200)


both_modes(globals(), "BrowserTests", "GatewayOriginTests", "StrangerTests")
