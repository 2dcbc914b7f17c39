"""
The MCP endpoint in memory (SPEC §10): the JSON-RPC methods and their errors,
version negotiation, auth, the eight tools over an in-memory §9 computer,
``computer`` resolution, isError texts, the 50 s bound, logs and metrics.
"""

import base64
import io
import json
import os
import sys

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.logger import LogLevel
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.apps import gateway_app
from tests.harness.fakes import FixedProbe, SandboxComputer
from tests.harness.logcapture import LogCapture
from trapsandbox import __version__, limits
from trapsandbox.admission import auth
from trapsandbox.computers.registry import Registry
from trapsandbox.mcp import endpoint as mcp
from trapsandbox.opencode.probe import ProbeResult
from trapsandbox.ops import ctl

URL = "http://127.0.0.1:4444/mcp"
TOOLS = (
    "list_computers",
    "run_command",
    "run_lua",
    "list_files",
    "read_file",
    "write_file",
    "delete_file",
    "read_screen",
)


class McpTestCase(SynchronousTestCase):
    admin_token = None

    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=60)
        admission = auth.Admission(self.clock, admin_token=self.admin_token)
        app = gateway_app(self.registry, FixedProbe(ProbeResult(True, "")), admission)
        self.http = StubTreq(app.resource())
        self.ids = 0

    def computer(self, trapos_id="7:base", **kwargs):
        return SandboxComputer.connect(self.registry, trapos_id, **kwargs)

    def post_raw(self, data, headers=None, method="POST"):
        headers = {"content-type": "application/json", **(headers or {})}
        d = self.http.request(method, URL, data=data, headers=headers)
        return d.addCallback(lambda r: self.http.content(r).addCallback(lambda b: (r, b)))

    def post(self, message, headers=None):
        response, body = self.successResultOf(self.post_raw(orjson.dumps(message), headers))
        return response, body

    def rpc(self, method, params=None, headers=None):
        """A request's response object (a 200)."""
        self.ids += 1
        message = {"jsonrpc": "2.0", "id": self.ids, "method": method}
        if params is not None:
            message["params"] = params
        response, body = self.post(message, headers)
        self.assertEqual(response.code, 200, body)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/json"])
        answer = orjson.loads(body)
        self.assertEqual((answer["jsonrpc"], answer["id"]), ("2.0", self.ids))
        return answer

    def result(self, method, params=None):
        answer = self.rpc(method, params)
        self.assertNotIn("error", answer)
        return answer["result"]

    def rpc_error(self, method, params=None):
        answer = self.rpc(method, params)
        self.assertNotIn("result", answer)
        return answer["error"]

    def call_async(self, tool, **arguments):
        """A tools/call still running: a Deferred of its result."""
        self.ids += 1
        message = {
            "jsonrpc": "2.0",
            "id": self.ids,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
        d = self.post_raw(orjson.dumps(message))
        return d.addCallback(lambda rb: orjson.loads(rb[1])["result"])

    def done(self, d):
        """The result of a call answered meanwhile (StubTreq delivers it on flush)."""
        self.http.flush()
        return self.successResultOf(d)

    def call(self, tool, **arguments):
        return self.result("tools/call", {"name": tool, "arguments": arguments})

    def text(self, result):
        [item] = result["content"]
        self.assertEqual(item["type"], "text")
        return item["text"]


class ProtocolTests(McpTestCase):
    def test_initialize_agrees_on_the_clients_version_when_it_is_known(self):
        for version in ("2025-03-26", "2025-06-18", "2025-11-25"):
            result = self.result(
                "initialize",
                {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t"}},
            )
            self.assertEqual(result["protocolVersion"], version)
            self.assertEqual(result["capabilities"], {"tools": {}})
            self.assertEqual(result["serverInfo"]["name"], "trapsandbox")
            self.assertEqual(result["serverInfo"]["version"], __version__)

    def test_initialize_offers_the_newest_for_an_unknown_version(self):
        for version in ("2024-11-05", "2099-01-01", "x"):
            result = self.result("initialize", {"protocolVersion": version})
            self.assertEqual(result["protocolVersion"], "2025-11-25")

    def test_initialize_without_a_version_is_invalid_params(self):
        self.assertEqual(self.rpc_error("initialize", {})["code"], -32602)
        self.assertEqual(self.rpc_error("initialize")["code"], -32602)

    def test_no_session_id_is_issued(self):
        response, _ = self.post(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "x"}}
        )
        self.assertFalse(response.headers.hasHeader("mcp-session-id"))
        # ... and one sent anyway does no harm.
        self.rpc("ping", headers={"mcp-session-id": "abc"})

    def test_ping(self):
        self.assertEqual(self.result("ping"), {})
        self.assertEqual(self.result("ping", {"_meta": {}}), {})

    def test_string_ids_are_echoed(self):
        response, body = self.post({"jsonrpc": "2.0", "id": "a-1", "method": "ping"})
        self.assertEqual(orjson.loads(body), {"jsonrpc": "2.0", "id": "a-1", "result": {}})

    def test_notifications_and_responses_are_accepted_quietly(self):
        for message in (
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
            {"jsonrpc": "2.0", "method": "no/such/notification"},
            {"jsonrpc": "2.0", "id": 5, "result": {}},
            {"jsonrpc": "2.0", "id": 5, "error": {"code": 1, "message": "x"}},
        ):
            response, body = self.post(message)
            self.assertEqual((response.code, body), (202, b""), message)

    def test_tools_list_has_the_eight_tools_with_schemas(self):
        tools = self.result("tools/list")["tools"]
        self.assertEqual(tuple(tool["name"] for tool in tools), TOOLS)
        for tool in tools:
            self.assertEqual(tool["inputSchema"]["type"], "object")
            self.assertGreater(len(tool["description"]), 80, tool["name"])
            if tool["name"] != "list_computers":
                self.assertIn("computer", tool["inputSchema"]["properties"])
                self.assertIn("sandbox allow", tool["description"])
                described = tool["inputSchema"]["properties"]["computer"]["description"]
                for form in ('"7:base"', '"7"', '"base"', "Omit it"):
                    self.assertIn(form, described)
            if "path" in tool["inputSchema"]["properties"]:
                self.assertIn("/rom is the read-only", tool["description"])
                self.assertIn("1 MB", tool["description"])
        self.assertEqual(
            self.result("tools/list", {"cursor": "x"})["tools"], tools
        )  # one page, always

    def test_get_and_other_methods_are_405_with_allow(self):
        for method in ("GET", "DELETE", "PUT"):
            response, body = self.successResultOf(self.post_raw(None, method=method))
            self.assertEqual(response.code, 405)
            self.assertEqual(response.headers.getRawHeaders("allow"), ["POST"])
            self.assertEqual(orjson.loads(body)["error"]["code"], "method_not_allowed")


class MalformedTests(McpTestCase):
    def assertHttpError(self, data, status, code, headers=None):
        response, body = self.successResultOf(self.post_raw(data, headers))
        self.assertEqual(response.code, status, body)
        answer = orjson.loads(body)
        self.assertEqual(answer["jsonrpc"], "2.0")
        self.assertIsNone(answer["id"])
        self.assertEqual(answer["error"]["code"], code, answer)
        return answer["error"]["message"]

    def test_not_json_is_400_parse_error(self):
        for data in (b"", b"{", b"\xff", b"<html>", b"1 2"):
            self.assertHttpError(data, 400, -32700)

    def test_a_batch_is_refused(self):
        message = self.assertHttpError(
            orjson.dumps([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]), 400, -32600
        )
        self.assertIn("batches", message)
        self.assertHttpError(b"[]", 400, -32600)

    def test_not_a_request(self):
        for message in (
            1,
            "ping",
            None,
            {},
            {"jsonrpc": "2.0", "id": 1},
            {"id": 1, "method": "ping"},
            {"jsonrpc": "1.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "id": 1, "method": 7},
            {"jsonrpc": "2.0", "id": None, "method": "ping"},
            {"jsonrpc": "2.0", "id": 1.5, "method": "ping"},
            {"jsonrpc": "2.0", "id": True, "method": "ping"},
            {"jsonrpc": "2.0", "id": [1], "method": "ping"},
            {"jsonrpc": "2.0", "id": 2**63, "method": "ping"},
        ):
            self.assertHttpError(orjson.dumps(message), 400, -32600)

    def test_unknown_method(self):
        error = self.rpc_error("resources/list")
        self.assertEqual(error["code"], -32601)
        self.assertIn("resources/list", error["message"])

    def test_params_not_an_object(self):
        self.ids += 1
        _, body = self.post({"jsonrpc": "2.0", "id": 9, "method": "ping", "params": [1]})
        self.assertEqual(orjson.loads(body)["error"]["code"], -32602)

    def test_tools_call_with_bad_params(self):
        for params in (
            {},
            {"name": 3},
            {"name": "no_such_tool"},
            {"name": "run_lua", "arguments": "return 1"},
            {"name": "run_lua", "arguments": [1]},
        ):
            error = self.rpc_error("tools/call", params)
            self.assertEqual(error["code"], -32602, params)
        self.assertIn("run_lua", self.rpc_error("tools/call", {"name": "x"})["message"])

    def test_huge_body_is_413_json(self):
        data = (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "x": "'
            + b"a" * (limits.MAX_BODY_BYTES)
            + b'"}'
        )
        self.assertHttpError(data, 413, -32600)

    def test_unsupported_protocol_version_header(self):
        self.assertHttpError(
            orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
            400,
            -32600,
            {"mcp-protocol-version": "1900-01-01"},
        )
        self.rpc("ping", headers={"mcp-protocol-version": "2025-06-18"})

    def test_a_foreign_web_page_is_refused_while_only_loopback_is_served(self):
        """A page on another origin, or a DNS rebinding, reaching 127.0.0.1 gets nothing."""
        ping = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        for headers in (
            {"origin": "http://evil.example:4444"},
            {"origin": "http://localhost:4444"},  # another origin than the request's Host
            {"origin": "null"},
            {"host": "evil.example:4444"},
        ):
            response, body = self.successResultOf(self.post_raw(ping, headers))
            self.assertEqual(response.code, 403, headers)
            self.assertEqual(orjson.loads(body)["error"]["code"], "forbidden")
        # The gateway's own origin (a page it served), and no Origin at all.
        for headers in ({"origin": "http://127.0.0.1:4444"}, {"host": "localhost:4444"}, {}):
            self.rpc("ping", headers=headers)

    def test_only_json_is_taken(self):
        ping = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "json"):
            response, body = self.successResultOf(
                self.post_raw(ping, {"content-type": content_type})
            )
            self.assertEqual(response.code, 415, content_type)
            self.assertEqual(orjson.loads(body)["error"]["code"], "unsupported_media_type")
        self.rpc("ping", headers={"content-type": "Application/JSON; charset=utf-8"})


class TokenTests(McpTestCase):
    admin_token = "s3cret"

    def test_the_operator_token_is_required(self):
        response, body = self.successResultOf(
            self.post_raw(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        )
        self.assertEqual(response.code, 401)
        self.assertEqual(
            response.headers.getRawHeaders("www-authenticate"), ['Bearer realm="trapsandbox"']
        )
        response, _ = self.successResultOf(self.post_raw(b"{}", {"authorization": "Bearer wrong"}))
        self.assertEqual(response.code, 401)
        answer = self.rpc("ping", headers={"authorization": "Bearer s3cret"})
        self.assertEqual(answer["result"], {})

    def test_with_a_token_any_origin_may_call(self):
        headers = {"authorization": "Bearer s3cret", "origin": "https://inspector.example"}
        self.assertEqual(self.rpc("ping", headers=headers)["result"], {})


class ResolutionTests(McpTestCase):
    def test_omitted_with_one_computer(self):
        c = self.computer()
        c.files["a"] = b"x"
        self.assertIn("a  1 bytes", self.text(self.call("list_files", path="/")))

    def test_omitted_with_none_or_several(self):
        result = self.call("read_screen")
        self.assertTrue(result["isError"])
        self.assertIn("No computer is connected", self.text(result))
        self.computer("7:base")
        self.computer("8:")
        result = self.call("read_screen")
        self.assertTrue(result["isError"])
        self.assertIn("7:base, 8:", self.text(result))
        self.assertEqual(result["structuredContent"], {"ok": False, "code": "ambiguous"})

    def test_by_trapos_id_bare_id_and_label(self):
        self.computer("7:base")
        self.computer("8:")
        self.computer("12:mine")
        for name, expected in (
            ("7:base", "7:base"),
            ("8:", "8:"),
            ("8", "8:"),
            ("mine", "12:mine"),
            ("12", "12:mine"),
        ):
            self.assertIn(expected, self.text(self.call("read_screen", computer=name)), name)

    def test_ambiguity_lists_the_candidates(self):
        self.computer("7:base")
        self.computer("9:base")
        self.computer("9:other")
        for name, candidates in (("base", "7:base, 9:base"), ("9", "9:base, 9:other")):
            result = self.call("read_screen", computer=name)
            self.assertTrue(result["isError"])
            self.assertIn(candidates, self.text(result))
            self.assertIn("traposId", self.text(result))

    def test_unknown_computer_lists_the_connected(self):
        self.computer("7:base")
        result = self.call("read_screen", computer="nope")
        self.assertTrue(result["isError"])
        self.assertIn('No connected computer is "nope"', self.text(result))
        self.assertIn("Connected: 7:base", self.text(result))
        result = self.call("read_screen", computer=7)
        self.assertTrue(result["isError"])

    def test_outside_values_are_cut_in_answers_and_logs(self):
        # SPEC §4: a huge ``computer`` (or tool, or method name) is neither echoed nor
        # logged whole.
        self.computer("7:base")
        logs = LogCapture(self)
        huge = "x" * 1_900_000
        result = self.call("read_screen", computer=huge)
        self.assertTrue(result["isError"])
        self.assertLess(len(self.text(result)), 600)
        self.assertIn('"' + "x" * 199 + "\u2026", self.text(result))
        for answer in (
            self.rpc_error("tools/call", {"name": huge}),
            self.rpc_error(huge),
        ):
            self.assertLess(len(answer["message"]), 600)
        self.assertTrue(logs.events)
        self.assertLess(max(len(text) for text in logs.texts()), 2000)


class ToolTests(McpTestCase):
    def test_list_computers(self):
        self.assertIn("No computer is connected", self.text(self.call("list_computers")))
        self.computer("7:base")
        self.computer("8:", capabilities=())
        result = self.call("list_computers")
        text = self.text(result)
        self.assertIn("2 computers connected", text)
        self.assertIn('7:base (id 7, label "base"); allowed: eval, exec, fs.read', text)
        self.assertIn(
            '8: (id 8, no label); allowed: nothing (the player can run "sandbox allow', text
        )
        self.assertEqual(
            [c["traposId"] for c in result["structuredContent"]["computers"]], ["7:base", "8:"]
        )
        self.assertEqual(result["structuredContent"]["computers"][1]["label"], None)

    def test_run_lua(self):
        c = self.computer()
        d = self.call_async("run_lua", code="return 6*7")
        [run] = c.runs
        self.assertEqual(run["payload"], {"code": "return 6*7", "timeoutMs": 30000})
        answer = {
            "ok": True,
            "returns": ["42"],
            "stdout": "hi\n",
            "durationMs": 3,
            "timedOut": False,
        }
        c.answer(run, payload=answer)
        result = self.done(d)
        self.assertNotIn("isError", result)
        self.assertIn("Returned: 42", self.text(result))
        self.assertIn("hi", self.text(result))
        self.assertEqual(result["structuredContent"], answer)

    def test_run_lua_error_is_an_error_result(self):
        c = self.computer()
        d = self.call_async("run_lua", code="error('boom')")
        c.answer(
            c.runs[0],
            payload={
                "ok": False,
                "returns": [],
                "stdout": "",
                "error": "boom",
                "durationMs": 1,
                "timedOut": False,
            },
        )
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("failed on 7:base: boom", self.text(result))

    def test_run_command(self):
        c = self.computer()
        d = self.call_async("run_command", command="ls", args=["/"], timeoutSeconds=5)
        [run] = c.runs
        self.assertEqual(run["payload"], {"command": "ls", "args": ["/"], "timeoutMs": 5000})
        c.answer(run, partial=True, payload={"type": "stdout_delta", "data": "rom\n"})
        c.answer(
            run,
            payload={
                "exitCode": 0,
                "timedOut": False,
                "durationMs": 9,
                "stdout": "rom\n",
                "stderr": "oops",
            },
        )
        text = self.text(self.done(d))
        self.assertIn("ls on 7:base: exit code 0", text)
        self.assertIn("--- stdout ---\nrom", text)
        self.assertIn("--- stderr ---\noops", text)

    def test_a_long_timeout_is_kept_within_the_call(self):
        c = self.computer()
        self.call_async("run_command", command="sleep", timeoutSeconds=600)
        self.assertEqual(c.runs[0]["payload"]["timeoutMs"], limits.MCP_MAX_RUN_SECONDS * 1000)

    def test_a_run_that_times_out_on_the_computer_gives_its_output(self):
        c = self.computer()
        d = self.call_async("run_command", command="forever", timeoutSeconds=2)
        c.answer(
            c.runs[0],
            payload={
                "exitCode": 1,
                "timedOut": True,
                "durationMs": 2000,
                "stdout": "tick\ntick\n",
                "stderr": "",
            },
        )
        text = self.text(self.done(d))
        self.assertIn("stopped after 2 s (timed out)", text)
        self.assertIn("tick\ntick", text)

    def test_the_call_is_bounded_and_the_run_cancelled(self):
        c = self.computer()
        d = self.call_async("run_command", command="stuck", timeoutSeconds=45)
        [run] = c.runs
        c.answer(run, partial=True, payload={"type": "stdout_delta", "data": "so far"})
        self.clock.advance(limits.MCP_CALL_TIMEOUT - 0.1)
        self.http.flush()
        self.assertNoResult(d)
        self.clock.advance(0.2)
        result = self.done(d)
        self.assertIn("so far", self.text(result))
        self.assertIn("timed out", self.text(result))
        self.assertTrue(result["structuredContent"]["timedOut"])
        cancels = [frame for frame in c.sent if frame["type"] == "cancel"]
        self.assertEqual([f["payload"]["messageId"] for f in cancels], [run["messageId"]])

    def test_a_silent_stuck_call_is_a_timeout_error(self):
        c = self.computer()
        d = self.call_async("run_lua", code="while true do end", timeoutSeconds=45)
        self.clock.advance(limits.MCP_CALL_TIMEOUT + 1)
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("did not finish within 50 s", self.text(result))
        self.assertIn("cancelled", self.text(result))
        self.assertEqual([f["type"] for f in c.sent], ["eval", "cancel"])
        # A shorter run's own deadline (its timeout and the answer margin) comes first.
        d = self.call_async("run_lua", code="while true do end")
        self.clock.advance(limits.DEFAULT_RUN_TIMEOUT_MS / 1000 + limits.RUN_ANSWER_MARGIN)
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("timeout: no answer from the computer within 40 s", self.text(result))

    def test_files(self):
        c = self.computer()
        result = self.call("write_file", computer="base", path="/notes/a.txt", content="héllo")
        self.assertIn("Wrote 6 bytes to /notes/a.txt on 7:base", self.text(result))
        self.assertEqual(c.files["/notes/a.txt"], "héllo".encode())
        result = self.call("read_file", path="/notes/a.txt")
        self.assertIn("6 bytes, UTF-8 text:\nhéllo", self.text(result))
        self.assertEqual(result["structuredContent"]["encoding"], "utf-8")
        self.assertEqual(result["structuredContent"]["content"], "héllo")
        c.files["/bin"] = b"\xff\x00\x01"
        result = self.call("read_file", path="/bin")
        self.assertIn(
            "not UTF-8, so in base64:\n" + base64.b64encode(b"\xff\x00\x01").decode(),
            self.text(result),
        )
        self.assertEqual(result["structuredContent"]["encoding"], "base64")
        self.assertIn("/notes/a.txt  6 bytes", self.text(self.call("list_files", path="/")))
        self.assertIn("Deleted /bin", self.text(self.call("delete_file", path="/bin")))
        self.assertIn("does not exist", self.text(self.call("delete_file", path="/bin")))
        result = self.call("write_file", path="/empty", content="")
        self.assertEqual(c.files["/empty"], b"")

    def test_a_big_file_is_read_in_chunks(self):
        c = self.computer()
        c.files["/big"] = b"a" * 200_000
        result = self.call("read_file", path="/big")
        self.assertEqual(len(result["structuredContent"]["content"]), 200_000)
        self.assertEqual(len([f for f in c.sent if f["type"] == "read_file"]), 4)

    def test_read_screen(self):
        self.computer()
        text = self.text(self.call("read_screen"))
        self.assertIn("(51x19, cursor at column 1, line 2):\n> hi", text)

    def test_forbidden_says_how_to_allow_it(self):
        c = self.computer(capabilities=())
        for tool, arguments, capability in (
            ("run_lua", {"code": "return 1"}, "eval"),
            ("run_command", {"command": "ls"}, "exec"),
            ("read_file", {"path": "/a"}, "fs.read"),
            ("list_files", {"path": "/"}, "fs.read"),
            ("write_file", {"path": "/a", "content": ""}, "fs.write"),
            ("delete_file", {"path": "/a"}, "fs.write"),
            ("read_screen", {}, "screen"),
        ):
            result = self.call(tool, **arguments)
            self.assertTrue(result["isError"], tool)
            self.assertIn(f'run "sandbox allow {capability}"', self.text(result))
            self.assertIn("Only the player at 7:base can allow it", self.text(result))
            self.assertEqual(result["structuredContent"]["code"], "forbidden")
        self.assertEqual(c.sent, [])

    def test_the_settings_file_is_refused_without_asking_for_a_permission(self):
        c = self.computer()
        c.files["/.settings"] = b"secret"
        result = self.call("read_file", path="/.settings")
        self.assertTrue(result["isError"])
        self.assertEqual(result["structuredContent"]["code"], "forbidden")
        self.assertIn("holds its sandbox password", self.text(result))
        self.assertNotIn("allow", self.text(result))
        self.assertNotIn("secret", self.text(result))
        self.assertEqual(c.sent, [])

    def test_fs_error_says_what_paths_are(self):
        self.computer()
        result = self.call("write_file", path="/rom/x", content="no")
        self.assertTrue(result["isError"])
        self.assertIn("fs_error: /rom/x: Access denied", self.text(result))
        self.assertIn("/rom is read-only", self.text(result))
        result = self.call("read_file", path="/missing")
        self.assertIn("No such file", self.text(result))

    def test_not_connected_mid_call(self):
        c = self.computer()
        d = self.call_async("run_lua", code="sleep(5)")
        self.registry.remove(c.session)
        result = self.done(d)
        self.assertTrue(result["isError"])
        self.assertIn("not_connected", self.text(result))
        self.assertIn("list_computers", self.text(result))

    def test_bad_arguments_are_error_results_the_model_can_fix(self):
        self.computer()
        for tool, arguments, words in (
            ("run_lua", {}, "code is required"),
            ("run_lua", {"code": 5}, "code is required"),
            ("run_command", {"command": "ls", "args": "x"}, "args must be a list"),
            ("run_command", {"command": "ls", "timeoutSeconds": -1}, "timeoutSeconds"),
            ("read_file", {"path": ""}, "path is required"),
            ("write_file", {"path": "/a"}, "content is required"),
        ):
            result = self.call(tool, **arguments)
            self.assertTrue(result["isError"], tool)
            self.assertIn(words, self.text(result))
        big = "a" * (limits.MAX_FILE_BYTES + 1)
        self.assertIn("at most", self.text(self.call("write_file", path="/a", content=big)))


class ObservabilityTests(McpTestCase):
    def test_calls_are_logged_without_code_or_contents(self):
        logs = LogCapture(self)
        c = self.computer()
        self.call("write_file", path="/secret.txt", content="PASSWORD-IN-FILE")
        d = self.call_async("run_lua", code="return 'CODE-MARKER'")
        c.answer(
            c.runs[0],
            payload={
                "ok": True,
                "returns": ["1"],
                "stdout": "",
                "durationMs": 1,
                "timedOut": False,
            },
        )
        self.done(d)
        self.call("run_lua", computer="nope", code="x")
        lines = [
            text
            for event, text in zip(logs.events, logs.texts(), strict=True)
            if event.get("log_level") == LogLevel.info and "MCP" in text
        ]
        self.assertEqual(len(lines), 3, lines)
        self.assertIn("MCP write_file on 7:base: ok in 0.000 s", lines[0])
        self.assertIn("MCP run_lua on 7:base: ok", lines[1])
        self.assertIn("MCP run_lua on nope: not_connected", lines[2])
        for text in logs.texts():
            self.assertNotIn("PASSWORD-IN-FILE", text)
            self.assertNotIn("CODE-MARKER", text)

    def test_calls_are_counted(self):
        self.computer(capabilities=("fs.read",))
        self.call("list_files", path="/")
        self.call("run_lua", code="1")
        response = self.successResultOf(self.http.get("http://127.0.0.1:4444/metrics"))
        body = self.successResultOf(self.http.content(response)).decode()
        self.assertIn('trapsandbox_mcp_tool_calls_total{outcome="ok",tool="list_files"} 1.0', body)
        self.assertIn(
            'trapsandbox_mcp_tool_calls_total{outcome="forbidden",tool="run_lua"} 1.0', body
        )
        self.assertIn("trapsandbox_mcp_tool_call_seconds_count 2.0", body)

    def test_metric_labels_are_bounded(self):
        metrics = self.registry.metrics
        metrics.mcp_tool_call("evil" * 10, "weird", 0.1)
        self.assertEqual(list(metrics._mcp_calls._tallies), [("other", "other")])


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
methods = st.sampled_from(
    ["initialize", "ping", "tools/list", "tools/call", "notifications/cancelled", "x"]
)
messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "1.0"]), "method": methods | json_values},
    optional={
        "id": st.integers(-5, 5) | st.text(max_size=5) | json_values,
        "params": st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(TOOLS) | json_values,
                "arguments": st.dictionaries(
                    st.sampled_from(
                        ["computer", "code", "command", "args", "path", "content", "timeoutSeconds"]
                    ),
                    json_values,
                )
                | json_values,
                "protocolVersion": st.sampled_from(mcp.PROTOCOL_VERSIONS) | json_values,
            },
        )
        | json_values,
    },
)


class PropertyTests(McpTestCase):
    def check(self, data):
        d = self.post_raw(data)
        # Runs are answered by the computer's timeout, never left hanging.
        self.clock.advance(limits.MCP_CALL_TIMEOUT + 1)
        response, body = self.done(d)
        if response.code == 202:
            self.assertEqual(body, b"")
            return
        self.assertIn(response.code, (200, 400, 413), body)
        answer = orjson.loads(body)
        self.assertEqual(answer["jsonrpc"], "2.0")
        self.assertEqual(len({"result", "error"} & set(answer)), 1, answer)
        if "error" in answer:
            self.assertIn(answer["error"]["code"], (-32700, -32600, -32601, -32602))
        else:
            self.assertEqual(response.code, 200)

    def setUp(self):
        super().setUp()
        # setUp runs once for all of a property's examples: one computer for all.
        self.computer("7:base")

    @settings(max_examples=300)
    @given(json_values)
    def test_any_json_gets_an_answer(self, value):
        self.check(json.dumps(value).encode())

    @settings(max_examples=300)
    @given(messages)
    def test_any_message_gets_an_answer(self, message):
        self.check(json.dumps(message).encode())


class OpencodeConfigTests(SynchronousTestCase):
    def print_config(self, *argv, environ=None):
        self.patch(os, "environ", dict(environ or {}))
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        self.assertEqual(ctl.main([*argv, "opencode-config"]), 0)
        return json.loads(out.getvalue())

    def test_without_a_token(self):
        self.assertEqual(
            self.print_config(),
            {
                "mcp": {
                    "trapsandbox": {
                        "type": "remote",
                        "url": "http://127.0.0.1:4444/mcp",
                        "oauth": False,
                    }
                }
            },
        )

    def test_with_a_token_the_block_reads_it_from_the_environment(self):
        for argv, environ in (
            (("--url", "http://gw.example:4444/", "--token", "t0k"), {}),
            (("--url", "http://gw.example:4444"), {"SANDBOX_ADMIN_TOKEN": "t0k"}),
        ):
            server = self.print_config(*argv, environ=environ)["mcp"]["trapsandbox"]
            self.assertEqual(server["url"], "http://gw.example:4444/mcp")
            self.assertEqual(
                server["headers"], {"Authorization": "Bearer {env:SANDBOX_ADMIN_TOKEN}"}
            )
            self.assertIs(server["oauth"], False)
            self.assertNotIn("t0k", json.dumps(server))
