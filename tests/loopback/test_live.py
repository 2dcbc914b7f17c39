"""Live screen and input over HTTP on a real port (SPEC §14), with a test computer."""

import orjson
import treq
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.rawhttp import events, raw
from tests.harness.support import (
    JSON,
    admitted,
    both_modes,
    bounded,
    reactor,
    start_gateway,
)

WATCH = b"GET /computers/7%3Abase/screen/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
FIRST = {
    "type": "screen",
    "width": 6,
    "height": 2,
    "cursorX": 3,
    "cursorY": 1,
    "cursorBlink": True,
    "rows": {
        "1": {"line": "> a ", "text": "0", "background": "f"},
        "2": {"line": " ", "text": "0", "background": "f"},
    },
    "palette": ["#f0f0f0"] * 16,
}


class LiveHTTPTests(TestCase):
    def setUp(self):
        self.gateway = start_gateway(self, password="sesame")
        self.base = f"http://127.0.0.1:{self.gateway.port}"
        self.pool = HTTPConnectionPool(reactor(), persistent=False)

    def computer(self, capabilities=("screen", "input")):
        return admitted(self, self.gateway.port, "sesame", capabilities=capabilities)

    async def test_the_screen_streams_and_a_caller_leaving_cancels_the_watch(self):
        computer = await self.computer()
        client = await raw(self, self.gateway.port, WATCH + b"\r\n")
        watch = await computer.next_message()
        self.assertEqual((watch["type"], watch["payload"]), ("screen_watch", {}))
        head = await client.until(b"\r\n\r\n")
        self.assertIn(b"200", head.split(b"\r\n")[0])
        self.assertIn(b"content-type: text/event-stream", head.lower())
        computer.respond(watch, payload=FIRST, partial=True)
        first = events(await client.until(b"}\n\n"))
        self.assertEqual(
            first[0]["rows"]["1"], {"line": "> a   ", "text": "000000", "background": "ffffff"}
        )
        # A later frame: one row, the size and blink carried on.
        computer.respond(
            watch,
            payload={"type": "screen", "cursorX": 4, "cursorY": 1, "rows": {"2": {"line": "x"}}},
            partial=True,
        )
        (second,) = events(await client.until(b"}\n\n"))
        self.assertEqual(
            (second["width"], second["height"], second["cursorBlink"], second["rows"]["2"]["line"]),
            (6, 2, True, "xxxxxx"),
        )
        # The caller leaves: the watch is cancelled on the computer.
        client.transport.loseConnection()
        cancel = await computer.next_message()
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": watch["messageId"]})
        )
        computer.respond(cancel, payload={"cancelled": True})
        computer.respond(watch, ok=False, error={"code": "cancelled", "message": "cancelled"})
        await computer.request("probe_gateway")
        self.assertEqual(self.gateway.registry.pending, 0)

    async def test_a_watch_the_computer_refuses_is_a_json_error(self):
        await self.computer(capabilities=("input",))
        client = await raw(self, self.gateway.port, WATCH + b"\r\n")
        head = await client.until(b"\r\n\r\n")
        self.assertIn(b" 403 ", head.split(b"\r\n")[0])

    async def test_a_browser_gets_nothing_from_the_computer(self):
        computer = await self.computer()
        client = await raw(
            self, self.gateway.port, WATCH + b"Origin: http://evil.example\r\n" + b"\r\n"
        )
        head = await client.until(b"\r\n\r\n")
        self.assertIn(b" 403 ", head.split(b"\r\n")[0])
        # Nothing reached the computer: the next frame it gets is the answer to its own probe.
        answer = await computer.request("probe_gateway")
        self.assertEqual(answer["event"], "gateway_response")

    async def test_input_is_queued(self):
        computer = await self.computer()
        url = self.base + "/computers/7%3Abase/input"
        body = {"events": [{"char": "a"}, {"key": "enter"}]}
        posted = treq.post(url, data=orjson.dumps(body), headers=JSON, pool=self.pool)
        request = await computer.next_message()
        self.assertEqual((request["type"], request["payload"]), ("input", body))
        computer.respond(request, payload={"queued": 2})
        response = await bounded(posted)
        answer = orjson.loads(await bounded(treq.content(response)))
        self.assertEqual((response.code, answer), (200, {"ok": True, "queued": 2}))

    async def test_bad_input_is_400_and_input_not_allowed_is_403(self):
        await self.computer(capabilities=("screen",))
        url = self.base + "/computers/7%3Abase/input"
        for body, status, code in (
            ({"events": "abc"}, 400, "bad_request"),
            ({"events": [{"char": "a"}] * 257}, 400, "bad_request"),
            ({"events": [{"char": "a"}]}, 403, "forbidden"),
        ):
            response = await bounded(
                treq.post(url, data=orjson.dumps(body), headers=JSON, pool=self.pool)
            )
            answer = orjson.loads(await bounded(treq.content(response)))
            self.assertEqual((response.code, answer["code"]), (status, code), body)


both_modes(globals(), "LiveHTTPTests")
