"""
The MCP endpoint in memory (SPEC §10): the methods, the route behind the
operator rules, auth, each call's log line and metrics, and the config
block ``trapsandbox-ctl opencode-config`` prints for it.
"""

import io
import json
import os
import sys

import orjson
from twisted.logger import LogLevel
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.logcapture import LogCapture
from tests.unit.mcp.helpers import McpTestCase
from trapsandbox import __version__
from trapsandbox.mcp import revision
from trapsandbox.ops import ctl


class MethodTests(McpTestCase):
    def test_initialize_agrees_on_the_clients_version_when_it_is_known(self):
        for version in ("2025-03-26", "2025-06-18", "2025-11-25"):
            result = self.result(
                "initialize",
                {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t"}},
            )
            self.assertEqual(result["protocolVersion"], version)
            self.assertEqual(result["capabilities"], revision.CAPABILITIES)
            self.assertEqual(result["serverInfo"]["name"], "trapsandbox")
            self.assertEqual(result["serverInfo"]["version"], __version__)

    def test_initialize_offers_the_newest_for_an_unknown_version(self):
        for version in ("2024-11-05", "2099-01-01", "x"):
            result = self.result("initialize", {"protocolVersion": version})
            self.assertEqual(result["protocolVersion"], "2025-11-25")

    def test_initialize_without_a_version_is_invalid_params(self):
        self.assertEqual(self.rpc_error("initialize", {})["code"], -32602)
        self.assertEqual(self.rpc_error("initialize")["code"], -32602)

    def test_ping(self):
        self.assertEqual(self.result("ping"), {})
        self.assertEqual(self.result("ping", {"_meta": {}}), {})

    def test_unknown_method(self):
        error = self.rpc_error("tools/destroy")
        self.assertEqual(error["code"], -32601)
        self.assertIn("tools/destroy", error["message"])

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


class RouteTests(McpTestCase):
    def test_get_and_other_methods_are_405_with_allow(self):
        for method in ("GET", "DELETE", "PUT"):
            response, body = self.successResultOf(self.post_raw(None, method=method))
            self.assertEqual(response.code, 405)
            self.assertEqual(response.headers.getRawHeaders("allow"), ["POST"])
            self.assertEqual(orjson.loads(body)["error"]["code"], "method_not_allowed")

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
