"""
Cancellation (SPEC §17, ``mcp.jsonrpc.Running``): ``notifications/cancelled``
ends the call it names, matched by caller, Mcp-Session-Id and id, and the
run on the computer with it; a cancel that names nothing running (opencode
sends one after every call) is accepted quietly.
"""

import orjson

from tests.unit.mcp.helpers import McpTestCase, StreamingMixin, events


class CancelTests(StreamingMixin, McpTestCase):
    def cancel(self, request_id, headers=None):
        message = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "aborted"},
        }
        return self.post(message, headers)

    def cancels(self, c):
        return [f["payload"]["messageId"] for f in c.sent if f["type"] == "cancel"]

    def test_a_cancel_ends_the_call_and_its_run_on_the_computer(self):
        c = self.computer()
        d = self.call_streaming("run_command", command="forever", headers={"mcp-session-id": "s1"})
        [run] = c.runs
        response, body = self.cancel(self.ids, {"mcp-session-id": "s1"})
        self.assertEqual((response.code, body), (202, b""))
        self.assertEqual(self.cancels(c), [run["messageId"]])
        self.assertEqual(c.runs, [])  # the computer ended it
        # MCP: no response to a cancelled request; the HTTP answer ends all the same.
        self.http.flush()
        response, body = self.successResultOf(d)
        self.assertEqual((response.code, body), (202, b""))
        self.assertEqual(self.gateway_calls("cancelled"), 1)

    def test_a_cancelled_stream_ends_without_a_response(self):
        c = self.computer()
        d = self.call_streaming("run_command", command="forever")
        [run] = c.runs
        c.answer(run, partial=True, payload={"type": "stdout_delta", "data": "tick\n"})
        self.clock.advance(1)
        self.cancel(self.ids)
        self.http.flush()
        response, body = self.successResultOf(d)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        [progress] = events(body)
        self.assertEqual(progress["method"], "notifications/progress")
        self.assertEqual(self.cancels(c), [run["messageId"]])

    def test_the_same_id_of_another_connection_is_not_cancelled(self):
        # opencode's two MCP connections both used id 2 at once: their session ids differ.
        c = self.computer()
        d = self.call_streaming("run_lua", code="x", headers={"mcp-session-id": "one"})
        self.cancel(self.ids, {"mcp-session-id": "two"})
        self.cancel(self.ids)  # no session id: another caller too
        self.cancel(str(self.ids), {"mcp-session-id": "one"})  # "3" is not 3
        self.assertEqual(self.cancels(c), [])
        c.answer(c.runs[0], payload={"ok": True, "returns": ["1"]})
        self.http.flush()
        _, body = self.successResultOf(d)
        self.assertIn("Returned: 1", orjson.loads(body)["result"]["content"][0]["text"])

    def test_a_cancel_after_the_answer_is_ignored_quietly(self):
        c = self.computer()
        d = self.call_async("run_lua", code="return 1")
        c.answer(c.runs[0], payload={"ok": True, "returns": ["1"]})
        self.done(d)
        for request_id in (self.ids, 999, None, {"x": 1}):
            response, body = self.cancel(request_id)
            self.assertEqual((response.code, body), (202, b""))
        response, body = self.post({"jsonrpc": "2.0", "method": "notifications/cancelled"})
        self.assertEqual((response.code, body), (202, b""))
        self.assertEqual(self.cancels(c), [])
        self.assertEqual(len(self.endpoint.running), 0)

    def gateway_calls(self, outcome):
        return self.registry.metrics._mcp_calls.labels("run_command", outcome).value
