"""
Admission on real sockets: a right credential always works, whatever its address did
before, and a client's address comes from X-Forwarded-For / Forwarded only when the
peer is a trusted proxy (SPEC §4).  HTTP is sent as raw bytes, to both of the port's
HTTP readers: ``fasthttp`` (``POST /computers/{id}/requests``) and twisted.web.
"""

from __future__ import annotations

import ipaddress

import orjson
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet import endpoints
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import ClientCreator, Protocol
from twisted.trial.unittest import TestCase

from tests.harness.logcapture import LogCapture
from tests.harness.support import (
    Refused,
    TestComputer,
    TestOperator,
    _opened,
    both_modes,
    bounded,
    reactor,
    start_gateway,
)
from trapsandbox import limits

PASSWORD = "a-long-computer-secret-5Yc2"
TOKEN = "admin-token-Qm7Vw3"
LOCAL = (ipaddress.ip_network("127.0.0.1/32"),)
# More wrong attempts than are free: the address is blocked after them.
WRONG_TIMES = limits.FREE_FAILURES + 2


class _Responses(Protocol):
    """Collects ``count`` HTTP responses (status, lower-case headers, body)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.buffer = b""
        self.responses: list[tuple[int, dict[bytes, bytes], bytes]] = []
        self.done: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while len(self.responses) < self.count:
            head, found, rest = self.buffer.partition(b"\r\n\r\n")
            if not found:
                return
            lines = head.split(b"\r\n")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if headers.get(b"transfer-encoding") == b"chunked":
                body = _dechunked(rest)
                if body is None:
                    return
                body, rest = body
            else:
                length = int(headers.get(b"content-length", b"0"))
                if len(rest) < length:
                    return
                body, rest = rest[:length], rest[length:]
            self.responses.append((int(lines[0].split()[1]), headers, body))
            self.buffer = rest
        if not self.done.called:
            self.done.callback(self.responses)

    def connectionLost(self, reason) -> None:
        if not self.done.called:
            self.done.errback(ConnectionError(f"closed after {len(self.responses)} responses"))


def _dechunked(data: bytes) -> tuple[bytes, bytes] | None:
    """A chunked body and what follows it, or None while incomplete."""
    body = b""
    while True:
        size, found, rest = data.partition(b"\r\n")
        if not found:
            return None
        size = int(size.split(b";")[0], 16)
        if len(rest) < size + 2:
            return None
        if size == 0:
            return body, rest[2:]
        body += rest[:size]
        data = rest[size + 2 :]


async def exchange(port: int, *requests: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """
    Send ``requests`` one after the other, each on a connection of its own (a
    refusal is its connection's last answer); their responses.
    """
    responses = []
    for request in requests:
        collector = _Responses(1)
        await bounded(ClientCreator(reactor(), lambda c=collector: c).connectTCP("127.0.0.1", port))
        try:
            collector.transport.write(request)
            responses += await bounded(collector.done)
        finally:
            collector.transport.loseConnection()
    return responses


def _token(token: str | None) -> bytes:
    return b"" if token is None else b"Authorization: Bearer %s\r\n" % token.encode()


def post(token: str | None = None, headers: bytes = b"") -> bytes:
    """The fast reader's route: a ping to 7:."""
    body = b'{"type": "ping"}'
    return (
        b"POST /computers/7%3A/requests HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + _token(token)
        + headers
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def get(token: str | None = None, headers: bytes = b"") -> bytes:
    """A twisted.web route."""
    return b"GET /computers HTTP/1.1\r\nHost: 127.0.0.1\r\n" + _token(token) + headers + b"\r\n"


def statuses(responses) -> list[int]:
    return [status for status, _, _ in responses]


async def computer(testcase, port: int, headers: dict | None = None) -> TestComputer:
    """A computer on ``/gateway`` whose upgrade carries ``headers``."""
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/gateway?n=1", headers=headers or {})
    endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port)
    return await _opened(testcase, factory, TestComputer, endpoint)


async def hello(testcase, port: int, secret: str, headers: dict | None = None, trapos_id="7:"):
    """A hello's reply, and the close code when it was refused."""
    connected = await computer(testcase, port, headers)
    reply = await connected.hello(secret, trapos_id)
    if reply["ok"]:
        return reply, None
    code, _ = await connected.wait_closed()
    return reply, code


async def operator_socket(testcase, port: int, headers: dict) -> TestOperator | Refused:
    factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}/operator", headers=headers)
    endpoint = endpoints.TCP4ClientEndpoint(reactor(), "127.0.0.1", port)
    try:
        return await _opened(testcase, factory, TestOperator, endpoint)
    except Refused as refusal:
        return refusal


class RightCredentialTests(TestCase):
    """Wrong attempts from an address never keep its right credential out."""

    def setUp(self):
        self.gateway = start_gateway(self, password=PASSWORD, admin_token=TOKEN)
        self.port = self.gateway.port

    async def test_a_right_hello_after_wrong_ones_from_its_address_is_admitted(self):
        codes = []
        for _ in range(WRONG_TIMES):
            reply, close = await hello(self, self.port, "guess")
            codes.append((reply["error"]["code"], close))
        self.assertEqual(
            codes,
            [("unauthorized", 4001)] * (limits.FREE_FAILURES + 1) + [("overloaded", 4003)],
        )
        reply, _ = await hello(self, self.port, PASSWORD)
        self.assertTrue(reply["ok"], reply)
        self.assertEqual(len(self.gateway.registry), 1)
        # Wrong ones are still refused, "try again later".
        reply, close = await hello(self, self.port, "guess", trapos_id="8:")
        self.assertEqual((reply["error"]["code"], close), ("overloaded", 4003))

    async def test_the_admin_token_after_wrong_ones_on_the_fast_route(self):
        ready = await computer(self, self.port)
        self.assertTrue((await ready.hello(PASSWORD))["ok"])
        answered = ensureDeferred(
            exchange(self.port, *[post("guess")] * WRONG_TIMES, post(TOKEN), post("guess"))
        )
        request = await ready.next_message()
        self.assertEqual(request["type"], "ping")
        ready.respond(request, payload={"traposId": "7:"})
        responses = await answered
        wrong = [401] * (limits.FREE_FAILURES + 1) + [429]
        self.assertEqual(statuses(responses), [*wrong, 200, 429])
        self.assertEqual(orjson.loads(responses[-2][2])["payload"], {"traposId": "7:"})
        self.assertEqual(responses[-1][1][b"retry-after"], b"2")

    async def test_the_admin_token_after_wrong_ones_on_a_twisted_web_route(self):
        responses = await exchange(self.port, *[get("guess")] * WRONG_TIMES, get(TOKEN), get("x"))
        wrong = [401] * (limits.FREE_FAILURES + 1) + [429]
        self.assertEqual(statuses(responses), [*wrong, 200, 429])
        self.assertEqual(orjson.loads(responses[-2][2]), {"computers": []})

    async def test_the_admin_token_after_wrong_ones_on_the_operator_socket(self):
        for _ in range(WRONG_TIMES):
            await operator_socket(self, self.port, {"Authorization": "Bearer guess"})
        refused = await operator_socket(self, self.port, {"Authorization": "Bearer guess"})
        self.assertEqual(refused.status, 429)
        opened = await operator_socket(self, self.port, {"Authorization": f"Bearer {TOKEN}"})
        self.assertIsInstance(opened, TestOperator)


class TrustedProxyTests(TestCase):
    """The gateway behind a proxy on this machine, listed in SANDBOX_TRUSTED_PROXIES."""

    def setUp(self):
        # No admin token: loopback clients are the admin, and only they.
        self.gateway = start_gateway(self, password=PASSWORD, trusted_proxies=LOCAL)
        self.port = self.gateway.port

    async def test_a_forwarded_client_is_not_the_loopback_admin(self):
        forwarded = [
            b"X-Forwarded-For: 203.0.113.9\r\n",
            # A client's own left-most entry is not believed.
            b"X-Forwarded-For: 127.0.0.1, 203.0.113.9\r\n",
            b"X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-For: 203.0.113.9\r\n",
            b'Forwarded: for="[2001:db8::7]:4711";proto=https\r\n',
            b"Forwarded: for=127.0.0.1, for=203.0.113.9\r\n",
        ]
        for request in (get, post):
            responses = await exchange(self.port, *[request(headers=h) for h in forwarded])
            self.assertEqual(statuses(responses), [403] * len(forwarded), request)
            # The proxy's own requests, and a client on this machine behind it, are loopback.
            responses = await exchange(
                self.port,
                get(),
                get(headers=b"X-Forwarded-For: 127.0.0.1\r\n"),
                get(headers=b"Forwarded: for=unknown\r\n"),
            )
            self.assertEqual(statuses(responses), [200, 200, 200])
        refused = await operator_socket(self, self.port, {"X-Forwarded-For": "203.0.113.9"})
        self.assertEqual(refused.status, 403)

    async def test_computers_behind_the_proxy_are_told_apart(self):
        stranger = {"X-Forwarded-For": "203.0.113.9"}
        for _ in range(WRONG_TIMES):
            reply, close = await hello(self, self.port, "guess", stranger)
        self.assertEqual((reply["error"]["code"], close), ("overloaded", 4003))
        # Another client of the same proxy is not blocked by the stranger's guesses.
        reply, close = await hello(self, self.port, "guess", {"X-Forwarded-For": "198.51.100.1"})
        self.assertEqual((reply["error"]["code"], close), ("unauthorized", 4001))
        reply, _ = await hello(self, self.port, PASSWORD, {"X-Forwarded-For": "198.51.100.1"})
        self.assertTrue(reply["ok"])
        reply, _ = await hello(
            self, self.port, PASSWORD, {"Forwarded": 'for="[2001:db8::7]:4711"'}, trapos_id="8:"
        )
        self.assertTrue(reply["ok"])
        [(_, _, body)] = await exchange(self.port, get())
        peers = {c["traposId"]: c["peer"] for c in orjson.loads(body)["computers"]}
        self.assertEqual(peers, {"7:": "tcp4:198.51.100.1", "8:": "tcp6:2001:db8::7:4711"})

    async def test_the_cap_on_connections_awaiting_hello_is_per_client(self):
        self.gateway.factory.max_unauthenticated_per_address = 1
        await computer(self, self.port, {"X-Forwarded-For": "203.0.113.9"})
        with self.assertRaises(ConnectionError) as caught:
            await computer(self, self.port, {"X-Forwarded-For": "203.0.113.9"})
        self.assertIn("429", str(caught.exception))
        await computer(self, self.port, {"X-Forwarded-For": "198.51.100.1"})


class TrustedProxyTokenTests(TestCase):
    def setUp(self):
        self.gateway = start_gateway(
            self, password=PASSWORD, admin_token=TOKEN, trusted_proxies=LOCAL
        )
        self.port = self.gateway.port

    async def test_token_guesses_count_against_the_forwarded_client(self):
        stranger = b"X-Forwarded-For: 203.0.113.9\r\n"
        other = b"X-Forwarded-For: 198.51.100.1\r\n"
        responses = await exchange(
            self.port,
            *[get("guess", stranger)] * WRONG_TIMES,
            get("guess", other),
            get(TOKEN, stranger),
        )
        wrong = [401] * (limits.FREE_FAILURES + 1) + [429]
        self.assertEqual(statuses(responses), [*wrong, 401, 200])


class UntrustedProxyTests(TestCase):
    """No SANDBOX_TRUSTED_PROXIES: forwarding headers are anyone's, and ignored."""

    async def test_headers_from_an_untrusted_peer_are_ignored_and_warned_about_once(self):
        logs = LogCapture(self)
        gateway = start_gateway(self, password=PASSWORD)
        forwarded = b"X-Forwarded-For: 203.0.113.9\r\n"
        responses = await exchange(gateway.port, get(headers=forwarded), post(headers=forwarded))
        # Still the loopback peer it is (a 404: 7: is not connected).
        self.assertEqual(statuses(responses), [200, 404])
        warnings = [text for text in logs.texts() if "SANDBOX_TRUSTED_PROXIES" in text]
        self.assertEqual(len(warnings), 1, warnings)

    async def test_guesses_count_against_the_peer_whatever_the_headers_say(self):
        gateway = start_gateway(self, password=PASSWORD, admin_token=TOKEN)
        guesses = [
            get("guess", b"X-Forwarded-For: 203.0.113.%d\r\n" % i) for i in range(WRONG_TIMES)
        ]
        responses = await exchange(gateway.port, *guesses, get(TOKEN))
        self.assertEqual(statuses(responses), [401] * (limits.FREE_FAILURES + 1) + [429, 200])


class StartTests(TestCase):
    def test_a_short_password_is_warned_about_without_showing_it(self):
        logs = LogCapture(self)
        start_gateway(self, password="hunter2")
        [warning] = [text for text in logs.texts() if "shorter than" in text]
        self.assertIn("SANDBOX_PASSWORD", warning)
        self.assertNotIn("hunter2", warning)
        start_gateway(self, password=PASSWORD)
        self.assertEqual(len([t for t in logs.texts() if "shorter than" in t]), 1)


both_modes(
    globals(),
    "RightCredentialTests",
    "TrustedProxyTests",
    "TrustedProxyTokenTests",
    "UntrustedProxyTests",
    "StartTests",
)
