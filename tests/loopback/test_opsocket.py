"""The operator WebSocket ``/operator`` on a real gateway: the router, Autobahn, real computers."""

import os

import orjson
import treq
from twisted.internet import protocol
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.support import (
    Refused,
    account_table,
    accounts_file,
    admitted,
    both_modes,
    bounded,
    connect,
    connect_operator,
    reactor,
    start_gateway,
)
from trapsandbox.admission import accounts
from trapsandbox.limits import LOCAL_ACCOUNT

PASSWORD = "sesame"
TOKEN = "op-token-1234"


class OperatorSocketTests(TestCase):
    def setUp(self):
        self.gateway = start_gateway(self, password=PASSWORD)
        self.port = self.gateway.port

    def computer(self, trapos_id="7:base", capabilities=()):
        return admitted(self, self.port, PASSWORD, trapos_id, capabilities)

    async def test_a_ping_round_trip_is_the_http_answer_with_its_id(self):
        computer = await self.computer()
        operator = await connect_operator(self, self.port)
        operator.send({"id": "a", "traposId": "7:base", "type": "ping", "timeoutMs": 5000})
        request = await computer.next_message()
        self.assertEqual((request["type"], request["traposReceiverId"]), ("ping", "7:base"))
        computer.respond(request, payload={"traposId": "7:base"})
        answer = await operator.next_message()
        self.assertEqual(
            answer, {"id": "a", "status": 200, "ok": True, "payload": {"traposId": "7:base"}}
        )
        # The same request over HTTP answers the same body.
        pool = HTTPConnectionPool(reactor(), persistent=False)
        posted = treq.post(
            f"http://127.0.0.1:{self.port}/computers/7%3Abase/requests",
            json={"type": "ping"},
            pool=pool,
        )
        request = await computer.next_message()
        computer.respond(request, payload={"traposId": "7:base"})
        response = await bounded(posted)
        body = orjson.loads(await bounded(treq.content(response)))
        self.assertEqual(
            {"id": "a", "status": response.code, **body}, answer, "HTTP and socket differ"
        )

    async def test_many_requests_in_flight_are_answered_by_id_as_they_complete(self):
        computer = await self.computer()
        operator = await connect_operator(self, self.port)
        count = 50
        for n in range(count):
            operator.send({"id": n, "traposId": "7:base", "type": "ping", "payload": {"n": n}})
        requests = [await computer.next_message() for _ in range(count)]
        self.assertEqual(self.gateway.registry.pending, count)
        for request in reversed(requests):
            computer.respond(request, payload={"n": request["payload"]["n"]})
        answers = await operator.answers(count)
        self.assertEqual([a["id"] for a in answers], list(reversed(range(count))))
        for answer in answers:
            self.assertEqual((answer["status"], answer["payload"]["n"]), (200, answer["id"]))

    async def test_failures_carry_the_http_status(self):
        operator = await connect_operator(self, self.port)
        operator.send({"id": 1, "traposId": "9:", "type": "ping"})
        operator.send({"id": 2, "traposId": "9:", "type": "ping", "timeoutMs": -1})
        first, second = await operator.answers(2)
        self.assertEqual((first["id"], first["status"]), (1, 404))
        self.assertEqual(first["error"]["code"], "not_connected")
        self.assertEqual((second["id"], second["status"]), (2, 400))

    async def test_bad_messages_are_answered_400_and_the_socket_stays_usable(self):
        computer = await self.computer()
        operator = await connect_operator(self, self.port)
        bad = [
            (b"{", None),
            (b"[1]", None),
            (b'{"traposId": "7:base", "type": "ping"}', None),
            (b'{"id": true, "traposId": "7:base", "type": "ping"}', None),
            (b'{"id": 1.5, "traposId": "7:base", "type": "ping"}', None),
            (b'{"id": "", "traposId": "7:base", "type": "ping"}', None),
            (b'{"id": 3, "type": "ping"}', 3),
            (b'{"id": "x", "traposId": 7, "type": "ping"}', "x"),
            (b'{"id": 4, "traposId": "7:base", "type": "ping", "account": 5}', 4),
            (b'{"id": 5, "traposId": "7:base"}', 5),
        ]
        for raw, _ in bad:
            operator.send(raw)
        operator.send(b'{"id": 6}', binary=True)
        answers = await operator.answers(len(bad) + 1)
        self.assertEqual([a["id"] for a in answers], [i for _, i in bad] + [None])
        for answer in answers:
            self.assertEqual((answer["status"], answer["error"]["code"]), (400, "bad_request"))
        # A duplicate id while the first is in flight.
        operator.send({"id": "d", "traposId": "7:base", "type": "ping"})
        request = await computer.next_message()
        operator.send({"id": "d", "traposId": "7:base", "type": "ping"})
        duplicate = await operator.next_message()
        self.assertEqual((duplicate["id"], duplicate["status"]), ("d", 400))
        self.assertIn("already in flight", duplicate["error"]["message"])
        computer.respond(request, payload={})
        self.assertEqual((await operator.next_message())["status"], 200)
        # Once answered, the id may be used again.
        operator.send({"id": "d", "traposId": "7:base", "type": "ping"})
        computer.respond(await computer.next_message(), payload={})
        self.assertEqual(
            await operator.next_message(), {"id": "d", "status": 200, "ok": True, "payload": {}}
        )

    async def test_past_the_cap_requests_are_refused_at_once(self):
        self.gateway.operator_socket.max_in_flight = 2
        computer = await self.computer()
        operator = await connect_operator(self, self.port)
        for n in range(3):
            operator.send({"id": n, "traposId": "7:base", "type": "ping"})
        refused = await operator.next_message()
        self.assertEqual((refused["id"], refused["status"]), (2, 503))
        self.assertEqual(refused["error"]["code"], "overloaded")
        for request in [await computer.next_message() for _ in range(2)]:
            computer.respond(request, payload={})
        self.assertEqual(sorted(a["id"] for a in await operator.answers(2)), [0, 1])

    async def test_closing_cancels_every_request_in_flight(self):
        computer = await self.computer(capabilities=["exec"])
        operator = await connect_operator(self, self.port)
        operator.send({"id": 1, "traposId": "7:base", "type": "ping"})
        operator.send(
            {"id": 2, "traposId": "7:base", "type": "exec", "payload": {"command": "sleep"}}
        )
        ping = await computer.next_message()
        run = await computer.next_message()
        self.assertEqual((ping["type"], run["type"]), ("ping", "exec"))
        self.assertEqual(self.gateway.registry.pending, 2)
        operator.sendClose(1000)
        await operator.wait_closed()
        # The run is cancelled on the computer, as when an HTTP caller goes away.
        cancel = await computer.next_message()
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": run["messageId"]})
        )
        computer.respond(cancel, payload={"cancelled": True})
        # Frames are handled in order: once this is answered, so is the cancel.
        await computer.request("probe_gateway")
        self.assertEqual(self.gateway.registry.pending, 0)
        self.assertEqual(self.gateway.operator_socket.connections, set())

    async def test_a_screen_watch_relays_each_frame_then_its_answer(self):
        computer = await self.computer(capabilities=["screen"])
        operator = await connect_operator(self, self.port)
        operator.send({"id": "w", "traposId": "7:base", "type": "screen_watch"})
        watch = await computer.next_message()
        self.assertEqual(watch["type"], "screen_watch")
        first = {
            "type": "screen",
            "width": 4,
            "height": 1,
            "cursorX": 1,
            "cursorY": 1,
            "cursorBlink": False,
            "rows": {"1": {"line": "a ", "text": "0", "background": "f"}},
            "palette": ["#000000"] * 16,
        }
        computer.respond(watch, payload=first, partial=True)
        computer.respond(watch, payload={"cursorX": 2, "cursorY": 1, "rows": {}}, partial=True)
        one, two = await operator.next_message(), await operator.next_message()
        self.assertEqual(
            (one["id"], one["status"], one["partial"], one["payload"]["rows"]["1"]["line"]),
            ("w", 200, True, "a   "),
        )
        self.assertEqual((two["payload"]["cursorX"], two["payload"]["width"]), (2, 4))
        # A ping meanwhile has its one answer, no partials.
        operator.send({"id": 2, "traposId": "7:base", "type": "ping"})
        ping = await computer.next_message()
        computer.respond(ping, payload={"traposId": "7:base"})
        self.assertNotIn("partial", await operator.next_message())
        computer.respond(watch, ok=False, error={"code": "cancelled", "message": "cancelled"})
        final = await operator.next_message()
        self.assertEqual((final["id"], final["ok"], "partial" in final), ("w", False, False))

    async def test_stopping_answers_what_is_in_flight_then_closes_1000(self):
        computer = await self.computer()
        operator = await connect_operator(self, self.port)
        operator.send({"id": 1, "traposId": "7:base", "type": "ping"})
        await computer.next_message()
        stopped = self.gateway.service.stopService()
        answer = await operator.next_message()
        self.assertEqual((answer["id"], answer["status"]), (1, 404))
        self.assertEqual(answer["error"]["message"], "the gateway is shutting down")
        code, _ = await operator.wait_closed()
        self.assertEqual(code, 1000)
        await bounded(stopped)

    async def test_a_message_over_the_body_limit_is_closed_1009(self):
        from trapsandbox.limits import MAX_BODY_BYTES

        operator = await connect_operator(self, self.port)
        operator.send(b'"' + b"x" * MAX_BODY_BYTES + b'"')
        code, _ = await operator.wait_closed()
        self.assertEqual(code, 1009)

    async def test_an_upgrade_on_a_kept_alive_http_connection(self):
        client = _RawClient()
        await bounded(
            protocol.ClientCreator(reactor(), lambda: client).connectTCP("127.0.0.1", self.port)
        )
        self.addCleanup(client.transport.abortConnection)
        client.transport.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b" 200 ", await client.response())
        client.transport.write(
            b"GET /operator HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        self.assertIn(b" 101 ", await client.response())
        client.send_text(b'{"id": 1, "traposId": "9:", "type": "ping"}')
        answer = orjson.loads(await client.text())
        self.assertEqual((answer["id"], answer["status"]), (1, 404))

    async def test_a_computer_upgrade_on_a_kept_alive_http_connection(self):
        # Not the first-bytes router's: the site's one router (Klein) hands it to Autobahn.
        client = _RawClient()
        await bounded(
            protocol.ClientCreator(reactor(), lambda: client).connectTCP("127.0.0.1", self.port)
        )
        self.addCleanup(client.transport.abortConnection)
        client.transport.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b" 200 ", await client.response())
        client.transport.write(
            b"GET /gateway?n=1 HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        self.assertIn(b" 101 ", await client.response())
        hello = {
            "event": "computer_request",
            "traposSenderId": "7:base",
            "messageId": "m1",
            "type": "hello",
            "payload": {"traposId": "7:base", "secret": PASSWORD},
        }
        client.send_text(orjson.dumps(hello))
        answer = orjson.loads(await client.text())
        self.assertEqual((answer["messageId"], answer["ok"]), ("m1", True))
        self.assertIsNotNone(self.gateway.registry.find(LOCAL_ACCOUNT, "7:base"))


class _RawClient(protocol.Protocol):
    """HTTP/1.1 by hand, then WebSocket frames by hand: one connection throughout."""

    def __init__(self):
        self.buffer = b""
        self.waiting: Deferred | None = None

    def dataReceived(self, data):
        self.buffer += data
        if self.waiting is not None:
            waiting, self.waiting = self.waiting, None
            waiting.callback(None)

    async def _more(self):
        self.waiting = Deferred()
        await bounded(self.waiting)

    async def response(self):
        """One response's head, its body skipped (by Content-Length, or chunked)."""
        while b"\r\n\r\n" not in self.buffer:
            await self._more()
        head = self.buffer.partition(b"\r\n\r\n")[0]
        if b"transfer-encoding: chunked" in head.lower():
            while b"\r\n0\r\n\r\n" not in self.buffer:
                await self._more()
            self.buffer = self.buffer.partition(b"\r\n0\r\n\r\n")[2]
            return head
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(self.buffer.partition(b"\r\n\r\n")[2]) < length:
            await self._more()
        self.buffer = self.buffer.partition(b"\r\n\r\n")[2][length:]
        return head

    def send_text(self, payload):
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        assert len(payload) < 0x10000
        if len(payload) < 126:
            head = bytes([0x81, 0x80 | len(payload)])
        else:
            head = bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big")
        self.transport.write(head + mask + masked)

    async def text(self):
        """The next text frame from the server (unmasked, one frame, length < 64 KiB)."""
        while len(self.buffer) < 2:
            await self._more()
        length, start = self.buffer[1] & 0x7F, 2
        if length == 126:
            while len(self.buffer) < 4:
                await self._more()
            length, start = int.from_bytes(self.buffer[2:4], "big"), 4
        while len(self.buffer) < start + length:
            await self._more()
        assert self.buffer[0] == 0x81, self.buffer[:2]  # FIN, text
        payload, self.buffer = self.buffer[start : start + length], self.buffer[start + length :]
        return payload


class LoopbackAdminOriginTests(TestCase):
    async def test_a_web_page_of_another_origin_is_refused_403(self):
        # No admin token: loopback clients are the admin, but not a browser page of
        # another site on this machine (DNS rebinding), as on /mcp.
        gateway = start_gateway(self, password=PASSWORD)
        try:
            await connect_operator(self, gateway.port, origin="http://evil.example")
        except Refused as refusal:
            self.assertEqual(refusal.status, 403, refusal)
        else:
            self.fail("the upgrade was not refused")
        # Another page on this machine is another origin too.
        with self.assertRaises(Refused):
            await connect_operator(self, gateway.port, origin="http://localhost:8080")
        # No Origin (not a browser), or the gateway's own (a page it served).
        for origin in (None, f"http://127.0.0.1:{gateway.port}"):
            operator = await connect_operator(self, gateway.port, origin=origin)
            operator.send({"id": 1, "traposId": "9:", "type": "ping"})
            self.assertEqual((await operator.next_message())["status"], 404)


class OperatorSocketAuthTests(TestCase):
    def setUp(self):
        self.gateway = start_gateway(self, password=PASSWORD, admin_token=TOKEN)

    async def refused(self, token=None):
        try:
            await connect_operator(self, self.gateway.port, token)
        except Refused as refusal:
            return refusal
        self.fail("the upgrade was not refused")

    async def test_no_or_a_wrong_token_is_401_with_its_challenge(self):
        for token in (None, "wrong"):
            refusal = await self.refused(token)
            self.assertEqual(refusal.status, 401, refusal)
            self.assertEqual(refusal.headers.get("www-authenticate"), 'Bearer realm="trapsandbox"')
            self.assertNotIn(TOKEN, str(refusal))
        operator = await connect_operator(self, self.gateway.port, TOKEN)
        operator.send({"id": 1, "traposId": "9:", "type": "ping"})
        self.assertEqual((await operator.next_message())["status"], 404)

    async def test_token_guessing_is_throttled_429_with_retry_after(self):
        for _ in range(6):
            self.assertEqual((await self.refused("guess")).status, 401)
        refusal = await self.refused("guess")
        self.assertEqual(refusal.status, 429)
        self.assertEqual(refusal.headers.get("retry-after"), "2")
        # The right token is checked first and admitted.
        await connect_operator(self, self.gateway.port, TOKEN)


class OperatorSocketAccountTests(TestCase):
    async def test_a_reload_closes_the_sockets_of_tokens_no_longer_admitted(self):
        path = accounts_file(self, "alice", "bob")
        gateway = start_gateway(
            self, admin_token=TOKEN, accounts_file=path, accounts=accounts.load(path)
        )
        alice = await connect_operator(self, gateway.port, "token-alice")
        bob = await connect_operator(self, gateway.port, "token-bob")
        admin = await connect_operator(self, gateway.port, TOKEN)
        with open(path, "w") as f:
            f.write(account_table("alice", "s-alice"))  # bob is gone
        self.assertTrue(gateway.accounts.reload())
        self.assertEqual((await bounded(bob.closed))[0], 4001)
        for still in (alice, admin):
            still.send({"id": 1, "traposId": "9:", "type": "ping"})
            self.assertEqual((await still.next_message())["status"], 404)

    async def test_an_account_token_reaches_its_own_computers_only(self):
        path = accounts_file(self, "alice", "bob")
        gateway = start_gateway(
            self, admin_token=TOKEN, accounts_file=path, accounts=accounts.load(path)
        )
        bob = await connect(self, gateway.port)
        self.assertEqual((await bob.hello("s-bob", "2:"))["payload"], {"accountId": "bob"})
        alice = await connect_operator(self, gateway.port, "token-alice")
        # Bob's computer, asked for plainly and with account=bob, and a missing one.
        alice.send({"id": 1, "traposId": "2:", "type": "ping"})
        alice.send({"id": 2, "traposId": "2:", "type": "ping", "account": "bob"})
        alice.send({"id": 3, "traposId": "3:", "type": "ping"})
        answers = {a.pop("id"): a for a in await alice.answers(3)}
        self.assertEqual(answers[1]["status"], 404)
        missing = orjson.dumps(answers[3]).replace(b"3:", b"2:")
        self.assertEqual(orjson.dumps(answers[1]), missing)
        self.assertEqual(orjson.dumps(answers[2]), missing)
        # The admin reaches it, naming the account or not.
        admin = await connect_operator(self, gateway.port, TOKEN)
        admin.send({"id": "x", "traposId": "2:", "type": "ping", "account": "bob"})
        request = await bob.next_message()
        bob.respond(request, payload={"who": "bob"})
        answer = await admin.next_message()
        self.assertEqual((answer["status"], answer["payload"]), (200, {"who": "bob"}))

    async def test_an_account_holds_at_most_its_bound_of_sockets(self):
        # SPEC §4: per-account bounds.  A full account is refused 429; closing one of
        # its sockets makes room; other accounts and the admin are not affected.
        path = accounts_file(self, "alice", "bob")
        gateway = start_gateway(
            self,
            admin_token=TOKEN,
            accounts_file=path,
            accounts=accounts.load(path),
            max_operator_sockets_per_account=2,
        )
        first = await connect_operator(self, gateway.port, "token-alice")
        await connect_operator(self, gateway.port, "token-alice")
        try:
            await connect_operator(self, gateway.port, "token-alice")
        except Refused as refusal:
            self.assertEqual(refusal.status, 429, refusal)
            self.assertIn("alice already has 2 operator sockets open", str(refusal))
        else:
            self.fail("a third socket of alice was accepted")
        for token in ("token-bob", TOKEN, TOKEN, TOKEN):
            await connect_operator(self, gateway.port, token)
        first.sendClose(1000)
        await bounded(first.closed)
        await connect_operator(self, gateway.port, "token-alice")
        self.assertEqual(gateway.operator_socket.per_account.held, {"alice": 2, "bob": 1})


class ConsoleTokenTests(TestCase):
    """SPEC §14: the console's page sends its token as the first message, never in a URL."""

    def setUp(self):
        self.gateway = start_gateway(self, password=PASSWORD, admin_token=TOKEN)
        self.origin = f"http://127.0.0.1:{self.gateway.port}"

    async def page(self, origin=None):
        return await connect_operator(self, self.gateway.port, origin=origin or self.origin)

    async def test_the_right_token_as_first_message_admits_the_page(self):
        page = await self.page()
        page.send({"token": TOKEN})
        self.assertEqual(await page.next_message(), {"authenticated": True, "account": None})
        page.send({"id": 1, "traposId": "9:", "type": "ping"})
        self.assertEqual((await page.next_message())["status"], 404)

    async def test_a_wrong_missing_or_late_token_is_closed_4001_with_why(self):
        for first in (
            {"token": "wrong"},
            {"token": ""},
            {"id": 1, "traposId": "9:", "type": "ping"},
        ):
            page = await self.page()
            page.send(first)
            code, reason = await page.wait_closed()
            self.assertEqual(code, 4001, first)
            self.assertTrue(reason, first)
            self.assertNotIn(TOKEN, reason)
            self.assertTrue(page.messages.pending == [], "something answered before the token")

    async def test_wrong_tokens_by_message_are_throttled_like_headers(self):
        for _ in range(6):
            page = await self.page()
            page.send({"token": "guess"})
            self.assertEqual(await page.wait_closed(), (4001, "wrong bearer token"))
        page = await self.page()
        page.send({"token": "guess"})
        code, reason = await page.wait_closed()
        self.assertEqual(code, 4001)
        self.assertIn("too many wrong operator tokens", reason)
        # A header guess from the same address is refused too: one throttle.
        refused = None
        try:
            await connect_operator(self, self.gateway.port, "guess")
        except Refused as refusal:
            refused = refusal
        self.assertEqual(refused.status, 429)
        # The right token is still admitted at once.
        page = await self.page()
        page.send({"token": TOKEN})
        self.assertEqual((await page.next_message())["authenticated"], True)

    async def test_another_origin_without_a_header_is_refused_at_the_upgrade(self):
        with self.assertRaises(Refused) as caught:
            await connect_operator(self, self.gateway.port, origin="http://evil.example")
        self.assertEqual(caught.exception.status, 401)

    async def test_no_token_within_the_deadline_is_closed_4001(self):
        from twisted.internet.task import Clock

        clock = Clock()
        self.gateway.operator_socket.clock = clock
        page = await self.page()
        clock.advance(30)
        code, reason = await page.wait_closed()
        self.assertEqual((code, reason), (4001, "no token within 30 s"))


class ConsoleLoopbackTests(TestCase):
    async def test_loopback_without_an_admin_token_needs_no_token(self):
        path = accounts_file(self, "alice", "bob")
        gateway = start_gateway(self, accounts_file=path, accounts=accounts.load(path))
        origin = f"http://127.0.0.1:{gateway.port}"
        page = await connect_operator(self, gateway.port, origin=origin)
        page.send({"token": ""})
        self.assertEqual(await page.next_message(), {"authenticated": True, "account": None})
        # An account's token narrows the page to that account.
        await admitted(self, gateway.port, "s-bob", "2:")
        page = await connect_operator(self, gateway.port, origin=origin)
        page.send({"token": "token-alice"})
        self.assertEqual(await page.next_message(), {"authenticated": True, "account": "alice"})
        page.send({"id": 1, "traposId": "2:", "type": "ping"})
        self.assertEqual((await page.next_message())["status"], 404)
        self.assertEqual(gateway.operator_socket.per_account.held, {"alice": 1})
        # The browser rule still holds: a foreign Host is not the loopback admin.
        with self.assertRaises(Refused) as caught:
            await connect_operator(self, gateway.port, origin="http://evil.example")
        self.assertEqual(caught.exception.status, 403)


class WatchComputersTests(TestCase):
    async def test_the_visible_computers_come_live_until_the_socket_closes(self):
        path = accounts_file(self, "alice", "bob")
        gateway = start_gateway(
            self, admin_token=TOKEN, accounts_file=path, accounts=accounts.load(path)
        )
        alice = await connect_operator(self, gateway.port, "token-alice")
        alice.send({"id": "w", "type": "watch_computers"})
        first = await alice.next_message()
        self.assertEqual(
            first, {"id": "w", "status": 200, "partial": True, "payload": {"computers": []}}
        )
        # Bob's computer is not alice's: nothing is sent to her for it.
        await admitted(self, gateway.port, "s-bob", "2:")
        computer = await admitted(self, gateway.port, "s-alice", "5:lab")
        listed = (await alice.next_message())["payload"]["computers"]
        self.assertEqual([(c["traposId"], c["accountId"]) for c in listed], [("5:lab", "alice")])
        self.assertEqual(listed[0]["capabilities"], [])
        # A change of capabilities, then a disconnect.
        answer = await computer.request("capabilities", {"capabilities": ["screen", "input"]})
        self.assertTrue(answer["ok"], answer)
        listed = (await alice.next_message())["payload"]["computers"]
        self.assertEqual(listed[0]["capabilities"], ["input", "screen"])
        computer.transport.loseConnection()
        self.assertEqual((await alice.next_message())["payload"], {"computers": []})
        # The watch holds its id; other requests go on beside it.
        alice.send({"id": "w", "type": "watch_computers"})
        self.assertEqual((await alice.next_message())["status"], 400)
        # One watch of the computers per socket (issue 35): another is refused, saying why.
        alice.send({"id": "w2", "type": "watch_computers"})
        self.assertEqual(
            await alice.next_message(),
            {
                "id": "w2",
                "status": 429,
                "ok": False,
                "error": {
                    "code": "too_many_watches",
                    "message": "this socket already watches the computers (id 'w'): one "
                    "watch_computers per socket",
                },
            },
        )
        alice.send({"id": 2, "traposId": "9:", "type": "ping"})
        self.assertEqual((await alice.next_message())["status"], 404)
        # Closing the socket stops the watch.
        alice.sendClose(1000)
        await alice.wait_closed()
        # (The asks' own watch stays: a computer's disconnect ends its asks.)
        self.assertEqual(gateway.registry._watchers, [gateway.asks._computers_changed])


class WatchActivityTests(TestCase):
    async def test_each_request_to_the_computer_is_seen_starting_and_ending(self):
        gateway = start_gateway(self, password=PASSWORD)
        computer = await connect(self, gateway.port)
        hello = {"traposId": "7:base", "secret": PASSWORD, "capabilities": ["exec"]}
        self.assertTrue((await computer.request("hello", hello))["ok"])
        watcher = await connect_operator(self, gateway.port)
        watcher.send({"id": "a", "type": "watch_activity", "traposId": "7:base"})
        operator = await connect_operator(self, gateway.port)
        operator.send(
            {
                "id": 1,
                "traposId": "7:base",
                "type": "exec",
                "payload": {"command": "ls", "args": ["/rom"]},
            }
        )
        request = await computer.next_message()
        started = await watcher.next_message()
        self.assertEqual(
            started,
            {
                "id": "a",
                "status": 200,
                "partial": True,
                "payload": {
                    "activity": {
                        "n": 1,
                        "type": "exec",
                        "detail": "ls /rom",
                        "by": "operator",
                        "state": "started",
                    }
                },
            },
        )
        computer.respond(request, payload={"exitCode": 0})
        ended = (await watcher.next_message())["payload"]["activity"]
        self.assertEqual((ended["n"], ended["state"]), (1, "ok"))
        self.assertIsInstance(ended["durationMs"], int)
        self.assertEqual((await operator.next_message())["status"], 200)
        # Another computer's requests are not this watch's; closing ends it.
        operator.send({"id": 2, "traposId": "8:", "type": "ping"})
        self.assertEqual((await operator.next_message())["status"], 404)
        self.assertEqual(watcher.messages.pending, [])
        watcher.sendClose(1000)
        await watcher.wait_closed()
        self.assertEqual(gateway.registry.activity._listeners, {})

    async def test_an_account_s_watches_are_bounded_across_its_sockets(self):
        path = accounts_file(self, "alice")
        gateway = start_gateway(self, accounts_file=path, accounts=accounts.load(path))
        gateway.registry.streams.most = 2
        await admitted(self, gateway.port, "s-alice", "1:", capabilities=("screen",))
        sockets = [await connect_operator(self, gateway.port, "token-alice") for _ in range(2)]
        sockets[0].send({"id": "a", "traposId": "1:", "type": "watch_activity"})
        sockets[0].send({"id": 0, "traposId": "9:", "type": "ping"})
        self.assertEqual((await sockets[0].next_message())["id"], 0)  # "a" is held
        sockets[1].send({"id": "b", "traposId": "1:", "type": "watch_activity"})
        sockets[1].send({"id": "c", "traposId": "1:", "type": "watch_activity"})
        self.assertEqual(
            await sockets[1].next_message(),
            {
                "id": "c",
                "status": 429,
                "ok": False,
                "error": {
                    "code": "too_many_watches",
                    "message": "account alice already has 2 activity watches open here; end "
                    "one first",
                },
            },
        )
        # The loopback admin (no admin token here) is not counted.
        admin = await connect_operator(self, gateway.port)
        admin.send({"id": "d", "traposId": "1:", "type": "watch_activity"})
        admin.send({"id": 1, "traposId": "9:", "type": "ping"})
        self.assertEqual((await admin.next_message())["id"], 1)  # not a refusal of "d"
        # A screen watch is bounded the same way, apart from the activity ones.
        for n in range(10, 13):
            sockets[0].send({"id": n, "traposId": "1:", "type": "screen_watch"})
        while (refused := await sockets[0].next_message())["id"] == "a":
            pass  # (the activity watch sees the screen watches sent to the computer)
        self.assertEqual((refused["id"], refused["status"]), (12, 429))
        self.assertIn("2 screen and event watches", refused["error"]["message"])
        # A socket closing gives its watches back.
        sockets[1].sendClose(1000)
        await sockets[1].wait_closed()
        sockets[0].send({"id": "e", "traposId": "1:", "type": "watch_activity"})
        sockets[0].send({"id": 4, "traposId": "9:", "type": "ping"})
        while (answer := await sockets[0].next_message())["id"] == "a":
            pass
        self.assertEqual(answer["id"], 4)


both_modes(
    globals(),
    "OperatorSocketTests",
    "LoopbackAdminOriginTests",
    "OperatorSocketAuthTests",
    "OperatorSocketAccountTests",
    "ConsoleTokenTests",
    "ConsoleLoopbackTests",
    "WatchComputersTests",
    "WatchActivityTests",
)
