"""
Progress (SPEC §17, ``mcp.tools.Reporter``, ``mcp.stream``): a run whose client
takes progress is answered as SSE, reports at most once a second (and at
least every few seconds when quiet), and may run its own timeoutSeconds.
"""

import orjson

from tests.unit.mcp.helpers import McpTestCase, StreamingMixin, events
from trapsandbox import limits


class ProgressTests(StreamingMixin, McpTestCase):
    def output(self, c, run, data):
        c.answer(run, partial=True, payload={"type": "stdout_delta", "data": data})

    def test_a_long_run_reports_progress_then_answers_as_sse(self):
        c = self.computer()
        d = self.call_streaming("run_command", command="/build.lua", timeoutSeconds=70)
        [run] = c.runs
        self.assertEqual(run["payload"]["timeoutMs"], 70_000)  # not cut to 45 s
        self.output(c, run, "step 1\n")
        self.output(c, run, "step 2\n")  # within the same second: one report
        self.clock.advance(1)
        self.clock.advance(1)  # nothing new: no report (the heartbeat is later)
        self.output(c, run, "step 3\nstep 4\n")
        self.clock.advance(1)
        self.clock.pump([1] * 60)  # past the 50 s bound of a call without progress
        c.answer(run, payload={"exitCode": 0, "stdout": "done", "stderr": ""})
        self.http.flush()
        response, body = self.successResultOf(d)
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["text/event-stream"])
        *progress, last = events(body)
        self.assertEqual(last["id"], self.ids)
        self.assertIn("exit code 0", last["result"]["content"][0]["text"])
        notes = [p["params"] for p in progress]
        self.assertTrue(all(p["method"] == "notifications/progress" for p in progress))
        self.assertEqual(
            notes[0],
            {
                "progressToken": "tok",
                "progress": 1.0,
                "total": 70.0,
                "message": "14 bytes of output: step 2",
            },
        )
        self.assertEqual(notes[1]["progress"], 3.0)
        self.assertEqual(notes[1]["message"], "28 bytes of output: step 4")
        # Quiet from 3 s on: a heartbeat every MCP_PROGRESS_HEARTBEAT seconds, no more.
        beats = [n["progress"] for n in notes[2:]]
        self.assertEqual(
            beats[:2],
            [3.0 + limits.MCP_PROGRESS_HEARTBEAT, 3.0 + 2 * limits.MCP_PROGRESS_HEARTBEAT],
        )
        values = [n["progress"] for n in notes]
        self.assertEqual(values, sorted(set(values)))  # MCP: it grows with each one

    def test_the_bound_is_the_runs_own_timeout_up_to_600_s(self):
        c = self.computer()
        d = self.call_streaming("run_lua", code="while true do end", timeoutSeconds=9999)
        [run] = c.runs
        self.assertEqual(run["payload"]["timeoutMs"], limits.MCP_PROGRESS_MAX_RUN_SECONDS * 1000)
        self.clock.advance(limits.MCP_PROGRESS_MAX_RUN_SECONDS + limits.MCP_CALL_MARGIN - 1)
        self.http.flush()
        self.assertNoResult(d)
        self.clock.advance(2)
        self.http.flush()
        _, body = self.successResultOf(d)
        last = events(body)[-1]
        self.assertTrue(last["result"]["isError"])
        self.assertIn("did not finish within 605 s", last["result"]["content"][0]["text"])
        self.assertEqual([f["type"] for f in c.sent], ["eval", "cancel"])

    def test_a_quick_call_is_plain_json(self):
        c = self.computer()
        d = self.call_streaming("run_lua", code="return 1")
        c.answer(c.runs[0], payload={"ok": True, "returns": ["1"], "stdout": ""})
        self.http.flush()
        response, body = self.successResultOf(d)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        self.assertIn("Returned: 1", orjson.loads(body)["result"]["content"][0]["text"])

    def test_without_sse_in_accept_there_is_no_progress_and_the_bound_stays(self):
        c = self.computer()
        d = self.call_streaming(
            "run_command", command="x", timeoutSeconds=70, headers={"accept": "application/json"}
        )
        self.assertEqual(c.runs[0]["payload"]["timeoutMs"], limits.MCP_MAX_RUN_SECONDS * 1000)
        self.output(c, c.runs[0], "a line\n")
        self.clock.advance(limits.MCP_CALL_TIMEOUT + 1)
        self.http.flush()
        response, body = self.successResultOf(d)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        self.assertTrue(orjson.loads(body)["result"]["structuredContent"]["timedOut"])

    def test_other_tools_ignore_the_token(self):
        c = self.computer()
        c.files["/a"] = b"x"
        response, body = self.successResultOf(self.call_streaming("read_file", path="/a"))
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        self.assertEqual(orjson.loads(body)["result"]["structuredContent"]["content"], "x")
