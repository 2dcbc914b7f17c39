"""Peripherals and turtles over HTTP on a real port (SPEC §16), with a test computer."""

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
    connect,
    connect_operator,
    reactor,
    start_gateway,
)

EVENTS = (
    b"GET /computers/7%3Abase/peripherals/events?events=monitor_touch,disk&timeoutMs=5000"
    b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
)
MONITOR = {"name": "top", "types": ["monitor"], "methods": ["getSize", "write"]}


class PeripheralHTTPTests(TestCase):
    def setUp(self):
        self.gateway = start_gateway(self, password="sesame")
        self.base = f"http://127.0.0.1:{self.gateway.port}/computers/7%3Abase"
        self.pool = HTTPConnectionPool(reactor(), persistent=False)

    def computer(self, capabilities=("peripheral", "turtle")):
        return admitted(self, self.gateway.port, "sesame", capabilities=capabilities)

    async def answered(self, posted):
        response = await bounded(posted)
        return response.code, orjson.loads(await bounded(treq.content(response)))

    async def exchange(self, computer, posted, answer, ok=True, error=None):
        """The request the computer got (type, payload); the HTTP status and body."""
        request = await computer.next_message()
        computer.respond(request, ok=ok, payload=answer, error=error)
        code, body = await self.answered(posted)
        return (request["type"], request["payload"]), (code, body)

    def post(self, path, body):
        return treq.post(self.base + path, data=orjson.dumps(body), headers=JSON, pool=self.pool)

    async def test_list_peripherals(self):
        computer = await self.computer()
        got = treq.get(self.base + "/peripherals", pool=self.pool)
        sent, answer = await self.exchange(computer, got, {"peripherals": [MONITOR]})
        self.assertEqual(sent, ("list_peripherals", {}))
        self.assertEqual(answer, (200, {"ok": True, "peripherals": [MONITOR]}))

    async def test_call_a_peripheral(self):
        computer = await self.computer()
        posted = self.post("/peripherals/top/call", {"method": "write", "args": ["hi", 1, None]})
        sent, answer = await self.exchange(computer, posted, {"returns": []})
        self.assertEqual(
            sent, ("call_peripheral", {"name": "top", "method": "write", "args": ["hi", 1, None]})
        )
        self.assertEqual(answer, (200, {"ok": True, "returns": []}))

    async def test_a_failing_call_is_422_peripheral_error(self):
        computer = await self.computer()
        posted = self.post("/peripherals/top/call", {"method": "fly"})
        error = {"code": "peripheral_error", "message": "No such method fly"}
        sent, (code, body) = await self.exchange(computer, posted, None, ok=False, error=error)
        self.assertEqual(sent[1], {"name": "top", "method": "fly", "args": []})
        self.assertEqual(
            (code, body["code"], body["error"]), (422, "peripheral_error", "No such method fly")
        )

    async def test_stopped_by_the_player_is_409(self):
        computer = await self.computer()
        posted = self.post("/turtle", {"action": "forward"})
        error = {"code": "stopped", "message": 'on it, run "sandbox resume"'}
        _, (code, body) = await self.exchange(computer, posted, None, ok=False, error=error)
        self.assertEqual((code, body["code"]), (409, "stopped"))

    async def test_an_older_client_that_does_not_know_the_request_is_501(self):
        computer = await self.computer()
        got = treq.get(self.base + "/peripherals", pool=self.pool)
        error = {"code": "unknown_type", "message": "unknown request type list_peripherals"}
        _, (code, body) = await self.exchange(computer, got, None, ok=False, error=error)
        self.assertEqual((code, body["code"]), (501, "unknown_type"))

    async def test_bad_bodies_are_400_and_not_allowed_is_403(self):
        await self.computer(capabilities=("screen",))
        for path, body, status, code in (
            ("/peripherals/top/call", {"args": []}, 400, "bad_request"),
            ("/peripherals/top/call", {"method": "write", "args": "hi"}, 400, "bad_request"),
            ("/turtle", {"args": []}, 400, "bad_request"),
            ("/peripherals/top/call", {"method": "write"}, 403, "forbidden"),
            ("/turtle", {"action": "forward"}, 403, "forbidden"),
        ):
            code_, answer = await self.answered(self.post(path, body))
            self.assertEqual((code_, answer["code"]), (status, code), (path, body))
        code_, answer = await self.answered(treq.get(self.base + "/peripherals", pool=self.pool))
        self.assertEqual((code_, answer["code"]), (403, "forbidden"))
        self.assertIn("sandbox allow peripheral", answer["error"])

    async def test_turtle(self):
        computer = await self.computer()
        posted = self.post("/turtle", {"action": "forward"})
        answer = {"returns": [False, "Out of fuel"], "fuel": 0, "selected": 1}
        sent, response = await self.exchange(computer, posted, answer)
        self.assertEqual(sent, ("turtle", {"action": "forward", "args": []}))
        self.assertEqual(response, (200, {"ok": True, **answer}))

    async def test_no_computer_is_404(self):
        code, answer = await self.answered(treq.get(self.base + "/peripherals", pool=self.pool))
        self.assertEqual((code, answer["code"]), (404, "not_connected"))

    async def test_events_stream_and_a_caller_leaving_cancels_them(self):
        computer = await self.computer()
        client = await raw(self, self.gateway.port, EVENTS + b"\r\n")
        watch = await computer.next_message()
        self.assertEqual(
            (watch["type"], watch["payload"]),
            ("peripheral_events", {"events": ["monitor_touch", "disk"], "timeoutMs": 5000}),
        )
        head = await client.until(b"\r\n\r\n")
        self.assertIn(b"200", head.split(b"\r\n")[0])
        self.assertIn(b"content-type: text/event-stream", head.lower())
        touch = {"type": "event", "name": "monitor_touch", "args": ["top", 3, 4]}
        computer.respond(watch, payload=touch, partial=True)
        self.assertEqual(events(await client.until(b"}\n\n")), [touch])
        client.transport.loseConnection()
        cancel = await computer.next_message()
        self.assertEqual(
            (cancel["type"], cancel["payload"]), ("cancel", {"messageId": watch["messageId"]})
        )
        computer.respond(cancel, payload={"cancelled": True})
        computer.respond(watch, ok=False, error={"code": "cancelled", "message": "cancelled"})
        await computer.request("probe_gateway")
        self.assertEqual(self.gateway.registry.pending, 0)

    async def test_events_end_at_the_computers_timeout(self):
        computer = await self.computer()
        client = await raw(self, self.gateway.port, EVENTS + b"\r\n")
        watch = await computer.next_message()
        computer.respond(watch, payload={"events": 0, "timedOut": True})
        tail = await client.until(b"}\n\n")
        self.assertIn(b'event: end\ndata: {"events":0,"timedOut":true}', tail)

    async def test_a_bad_events_query_is_400(self):
        await self.computer()
        client = await raw(
            self, self.gateway.port, EVENTS.replace(b"timeoutMs=5000", b"timeoutMs=0") + b"\r\n"
        )
        status, _, body = await client.response()
        self.assertEqual(
            (status, orjson.loads(body)),
            (
                400,
                {
                    "ok": False,
                    "code": "bad_request",
                    "error": "timeoutMs must be a whole number from 1 to 600000",
                },
            ),
        )


STOPPED = 'the player stopped the sandbox agent on computer 7:base; on it, run "sandbox resume"'


class StopStateTests(TestCase):
    """
    The gateway knows when a computer's player stopped the agent (SPEC §16): announced in
    hello and with a ``stopped`` request, shown in /computers and the /operator listing,
    and every request needing a capability is refused at once with ``stopped``.
    """

    def setUp(self):
        self.gateway = start_gateway(self, password="sesame")
        self.url = f"http://127.0.0.1:{self.gateway.port}"
        self.pool = HTTPConnectionPool(reactor(), persistent=False)

    async def get(self, path):
        response = await bounded(treq.get(self.url + path, pool=self.pool))
        return response.code, orjson.loads(await bounded(treq.content(response)))

    async def stopped_computer(self):
        computer = await connect(self, self.gateway.port)
        computer.trapos_id = "7:base"
        hello = {
            "traposId": "7:base",
            "secret": "sesame",
            "capabilities": ["peripheral"],
            "stopped": True,
            "stopMessage": STOPPED,
        }
        self.assertTrue((await computer.request("hello", hello))["ok"])
        return computer

    async def test_a_stopped_computer_is_listed_stopped_and_refused_without_a_frame(self):
        computer = await self.stopped_computer()
        _, listed = await self.get("/computers")
        (entry,) = listed["computers"]
        self.assertEqual((entry["stopped"], entry["stopMessage"]), (True, STOPPED))
        code, body = await self.get("/computers/7%3Abase/peripherals")
        self.assertEqual((code, body["code"], body["error"]), (409, "stopped", STOPPED))
        # Nothing reached the computer: the next frame it gets is the answer to its resume.
        answer = await computer.request("stopped", {"stopped": False})
        self.assertEqual((answer["ok"], answer["payload"]), (True, {"stopped": False}))
        _, listed = await self.get("/computers")
        self.assertEqual(listed["computers"][0]["stopped"], False)
        self.assertNotIn("stopMessage", listed["computers"][0])
        got = treq.get(self.url + "/computers/7%3Abase/peripherals", pool=self.pool)
        request = await computer.next_message()
        self.assertEqual(request["type"], "list_peripherals")
        computer.respond(request, payload={"peripherals": []})
        self.assertEqual((await bounded(got)).code, 200)

    async def test_the_operator_listing_follows_stop_and_resume_live(self):
        computer = await admitted(self, self.gateway.port, "sesame", capabilities=["screen"])
        page = await connect_operator(self, self.gateway.port)
        page.send({"id": "w", "type": "watch_computers"})
        first = (await page.next_message())["payload"]["computers"]
        self.assertEqual(first[0]["stopped"], False)
        redstone = "a redstone signal on the back side of computer 7:base stops the agent"
        answer = await computer.request("stopped", {"stopped": True, "stopMessage": redstone})
        self.assertTrue(answer["ok"], answer)
        listed = (await page.next_message())["payload"]["computers"]
        self.assertEqual((listed[0]["stopped"], listed[0]["stopMessage"]), (True, redstone))
        page.send({"id": 1, "traposId": "7:base", "type": "screen"})
        refused = await page.next_message()
        self.assertEqual((refused["status"], refused["error"]["code"]), (409, "stopped"))
        await computer.request("stopped", {"stopped": False})
        listed = (await page.next_message())["payload"]["computers"]
        self.assertEqual(listed[0]["stopped"], False)

    async def test_a_stop_without_words_gets_the_gateways_and_a_bad_one_is_refused(self):
        computer = await admitted(self, self.gateway.port, "sesame")
        answer = await computer.request("stopped", {"stopped": True})
        self.assertTrue(answer["ok"], answer)
        _, listed = await self.get("/computers")
        self.assertEqual(listed["computers"][0]["stopMessage"], STOPPED)
        answer = await computer.request("stopped", {"stopped": "yes"})
        self.assertEqual(answer["error"]["code"], "bad_request")
        self.assertIn("stopped must be true or false", answer["error"]["message"])

    async def test_an_mcp_call_on_a_stopped_computer_says_how_to_resume(self):
        await self.stopped_computer()
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_peripherals", "arguments": {"computer": "7:base"}},
        }
        headers = {**JSON, "accept": "application/json, text/event-stream"}
        response = await bounded(
            treq.post(self.url + "/mcp", data=orjson.dumps(call), headers=headers, pool=self.pool)
        )
        result = orjson.loads(await bounded(treq.content(response)))["result"]
        self.assertTrue(result["isError"], result)
        self.assertEqual(result["structuredContent"]["code"], "stopped")
        self.assertIn('run "sandbox resume"', result["content"][0]["text"])


both_modes(globals(), "PeripheralHTTPTests")
