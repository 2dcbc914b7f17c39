"""
Both MCP revisions on one endpoint (SPEC §17, ``trapsandbox.mcp.revision``):
2026-07-28's stateless envelope beside the legacy revisions, chosen per
request; errors with the request's id; logging; prompts; completions.
"""

import orjson
from treq.testing import StubTreq

from tests.harness.apps import gateway_app
from tests.unit.mcp.helpers import McpTestCase, events
from trapsandbox.admission import auth
from trapsandbox.mcp import revision
from trapsandbox.mcp.schemas import TOOLS

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


class ModernMixin:
    def modern_raw(self, method, params=None, headers=None, meta=META, id=None):
        """A 2026-07-28 request as a conformant client sends it: (response, answer)."""
        self.ids += 1
        params = dict(params or {})
        if meta is not None:
            params["_meta"] = {**meta, **params.get("_meta", {})}
        sent = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": MODERN,
            "mcp-method": method,
        }
        if method in NAMED and type(params.get(NAMED[method])) is str:
            sent["mcp-name"] = params[NAMED[method]]
        for name, value in (headers or {}).items():
            sent.pop(name.lower(), None)
            if value is not None:
                sent[name.lower()] = value
        message = {"jsonrpc": "2.0", "id": self.ids if id is None else id, "method": method}
        message["params"] = params
        response, body = self.post(message, sent)
        kind = response.headers.getRawHeaders("content-type", [""])[0]
        if kind == "text/event-stream":
            return response, events(body)
        return response, orjson.loads(body)

    def modern(self, method, params=None, **kwargs):
        response, answer = self.modern_raw(method, params, **kwargs)
        self.assertEqual(response.code, 200, answer)
        self.assertNotIn("error", answer)
        self.assertEqual(answer["id"], self.ids)
        return answer["result"]

    def modern_error(self, method, params=None, status=400, **kwargs):
        response, answer = self.modern_raw(method, params, **kwargs)
        self.assertEqual(response.code, status, answer)
        self.assertNotIn("result", answer)
        self.assertEqual(answer["id"], kwargs.get("id", self.ids))
        return answer["error"]


class ModernTests(ModernMixin, McpTestCase):
    def test_a_request_needs_no_earlier_one(self):
        self.computer("7:base")
        result = self.modern("tools/call", {"name": "list_computers", "arguments": {}})
        self.assertEqual(result["structuredContent"]["computers"][0]["traposId"], "7:base")
        self.assertEqual(result["resultType"], "complete")
        self.assertEqual(
            result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "trapsandbox"
        )

    def test_discover_lists_both_eras(self):
        result = self.modern("server/discover")
        self.assertEqual(result["supportedVersions"][0], MODERN)
        self.assertIn("2025-11-25", result["supportedVersions"])
        self.assertEqual(result["capabilities"], revision.CAPABILITIES)

    def test_lists_and_reads_carry_caching_hints(self):
        self.computer("7:base")
        for method, params in (
            ("tools/list", None),
            ("prompts/list", None),
            ("resources/list", None),
            ("resources/templates/list", None),
            ("resources/read", {"uri": "trapsandbox://7%3Abase/screen"}),
        ):
            result = self.modern(method, params)
            self.assertEqual(result["cacheScope"], "private", method)
            self.assertIsInstance(result["ttlMs"], int, method)
        # What changes any moment is never kept.
        self.assertEqual(self.modern("resources/list")["ttlMs"], 0)

    def test_an_incomplete_meta_is_a_400_with_the_id(self):
        for meta in (
            None,
            {"io.modelcontextprotocol/clientCapabilities": {}},
            {"io.modelcontextprotocol/protocolVersion": MODERN},
        ):
            error = self.modern_error("tools/list", meta=meta)
            self.assertEqual(error["code"], -32602, meta)

    def test_headers_must_match_the_body(self):
        for headers in (
            {"mcp-protocol-version": None},
            {"mcp-method": None},
            {"mcp-method": "prompts/list"},
            {"mcp-method": "TOOLS/LIST"},
        ):
            self.assertEqual(self.modern_error("tools/list", headers=headers)["code"], -32020)
        call = {"name": "list_computers", "arguments": {}}
        self.assertEqual(
            self.modern_error("tools/call", call, headers={"mcp-name": "x"})["code"], -32020
        )
        # Whitespace around a value is not part of it; base64 is decoded.
        self.modern("tools/call", call, headers={"mcp-name": "  list_computers "})
        self.modern("tools/call", call, headers={"mcp-name": "=?base64?bGlzdF9jb21wdXRlcnM=?="})

    def test_the_computer_argument_comes_as_its_header_too(self):
        self.computer("7:base")
        call = {"name": "read_screen", "arguments": {"computer": "7:base"}}
        self.assertTrue(any("x-mcp-header" in str(tool["inputSchema"]) for tool in TOOLS))
        self.assertEqual(self.modern_error("tools/call", call)["code"], -32020)
        for wrong in ("8", "=?base64?SGVsbG8?="):
            error = self.modern_error("tools/call", call, headers={"mcp-param-computer": wrong})
            self.assertEqual(error["code"], -32020)
        result = self.modern("tools/call", call, headers={"mcp-param-computer": "7:base"})
        self.assertFalse(result.get("isError"), result)
        # Issue 43: twice is refused, whichever comes first (the last one was checked, while a
        # balancer routes by the first).
        for twice in (["8", "7:base"], ["7:base", "8"], ["7:base", "7:base"]):
            error = self.modern_error("tools/call", call, headers={"mcp-param-computer": twice})
            self.assertEqual(error["code"], -32020)
            self.assertEqual(error["message"], "the Mcp-Param-Computer header is given 2 times")

    def test_an_unsupported_version_lists_ours(self):
        meta = {**META, "io.modelcontextprotocol/protocolVersion": "1900-01-01"}
        error = self.modern_error(
            "tools/list", meta=meta, headers={"mcp-protocol-version": "1900-01-01"}
        )
        self.assertEqual(error["code"], -32022)
        self.assertEqual(error["data"]["requested"], "1900-01-01")
        self.assertEqual(error["data"]["supported"], list(revision.SUPPORTED))
        # The header and _meta disagreeing is a mismatch first.
        self.assertEqual(self.modern_error("tools/list", meta=meta)["code"], -32020)

    def test_removed_and_unknown_methods_are_404(self):
        for method in ("initialize", "ping", "logging/setLevel", "resources/subscribe", "x/y"):
            error = self.modern_error(method, status=404)
            self.assertEqual(error["code"], -32601, method)

    def test_no_session_is_minted_or_needed(self):
        response, _ = self.modern_raw("tools/list", headers={"mcp-session-id": "whatever"})
        self.assertEqual(response.code, 200)
        self.assertIsNone(response.headers.getRawHeaders("mcp-session-id"))

    def test_a_missing_resource_is_invalid_params_with_its_uri(self):
        for uri in ("trapsandbox://9/screen", "test://nothing"):
            error = self.modern_error("resources/read", {"uri": uri}, status=200)
            self.assertEqual(error["code"], -32602)
            self.assertEqual(error["data"], {"uri": uri})
        # Legacy clients keep -32002 for a computer that is not there.
        self.assertEqual(
            self.rpc_error("resources/read", {"uri": "trapsandbox://9/screen"})["code"], -32002
        )

    def test_legacy_clients_see_what_they_saw(self):
        response, body = self.post(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
            }
        )
        result = orjson.loads(body)["result"]
        self.assertEqual(result["protocolVersion"], "2025-11-25")
        self.assertNotIn("resultType", result)
        self.assertIsNotNone(response.headers.getRawHeaders("mcp-session-id"))
        tools = self.result("tools/list")
        self.assertNotIn("ttlMs", tools)
        self.assertEqual(self.result("ping"), {})


class ErrorIdTests(McpTestCase):
    def test_errors_carry_the_id_whenever_it_can_be_read(self):
        for message, id in (
            ({"jsonrpc": "2.0", "id": 5, "method": 3}, 5),
            ({"jsonrpc": "1.0", "id": "a", "method": "ping"}, "a"),
            ({"jsonrpc": "2.0", "id": 6, "method": "ping", "params": []}, 6),
            ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, None),
        ):
            _, body = self.post(message)
            self.assertEqual(orjson.loads(body)["id"], id, message)


SSE = {"accept": "application/json, text/event-stream"}


class LoggingTests(ModernMixin, McpTestCase):
    def call_events(self, headers=None, meta=None):
        self.ids += 1
        params = {"name": "run_command", "arguments": {"command": "ls"}}
        if meta:
            params["_meta"] = meta
        message = {"jsonrpc": "2.0", "id": self.ids, "method": "tools/call", "params": params}
        response, body = self.post(message, {**SSE, **(headers or {})})
        kind = response.headers.getRawHeaders("content-type")[0]
        return events(body) if kind == "text/event-stream" else [orjson.loads(body)]

    def test_a_refusal_is_logged_once_the_client_set_a_level(self):
        self.computer("7:base", capabilities=("screen",))
        # opencode never sets a level: its answers stay plain JSON.
        [answer] = self.call_events()
        self.assertTrue(answer["result"]["isError"])
        _, body = self.post(
            {
                "jsonrpc": "2.0",
                "id": 99,
                "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
            }
        )
        session = {"mcp-session-id": "s1"}
        self.post(
            {"jsonrpc": "2.0", "id": 100, "method": "logging/setLevel", "params": {"level": "x"}},
            session,
        )
        self.post(
            {
                "jsonrpc": "2.0",
                "id": 101,
                "method": "logging/setLevel",
                "params": {"level": "warning"},
            },
            session,
        )
        *notes, answer = self.call_events(session)
        [note] = notes
        self.assertEqual(note["method"], "notifications/message")
        self.assertEqual(note["params"]["level"], "error")
        self.assertIn("sandbox allow exec", note["params"]["data"]["message"])
        self.assertTrue(answer["result"]["isError"])
        # Another connection of the same caller set nothing.
        self.assertEqual(len(self.call_events({"mcp-session-id": "s2"})), 1)

    def test_modern_requests_log_only_when_they_ask(self):
        self.computer("7:base", capabilities=("screen",))
        params = {"name": "run_command", "arguments": {"command": "ls"}}
        _, answer = self.modern_raw("tools/call", params)
        self.assertIsInstance(answer, dict)  # plain JSON: nothing was logged
        wanted = {"_meta": {"io.modelcontextprotocol/logLevel": "info"}}
        _, messages = self.modern_raw("tools/call", {**params, **wanted})
        levels = [m["params"]["level"] for m in messages if m.get("method")]
        self.assertEqual(levels, ["info", "error"])  # the call, then its refusal
        bad = {"_meta": {"io.modelcontextprotocol/logLevel": "loud"}}
        self.assertEqual(self.modern_error("tools/call", {**params, **bad})["code"], -32602)


class PromptTests(ModernMixin, McpTestCase):
    def test_prompts_are_listed_and_filled_in(self):
        names = [p["name"] for p in self.result("prompts/list")["prompts"]]
        self.assertEqual(names, ["debug_program", "write_program", "plan_turtle"])
        got = self.result(
            "prompts/get",
            {"name": "debug_program", "arguments": {"computer": "7:base", "program": "/a.lua"}},
        )
        [message] = got["messages"]
        self.assertEqual(message["role"], "user")
        self.assertIn("/a.lua on the ComputerCraft computer 7:base", message["content"]["text"])
        self.assertEqual(self.modern("prompts/list")["cacheScope"], "private")

    def test_bad_prompt_requests_say_why(self):
        for params, says in (
            ({"name": "nope"}, "no prompt"),
            ({"name": "plan_turtle", "arguments": {"computer": "7"}}, "needs job"),
            ({"name": "plan_turtle", "arguments": [1]}, "arguments must be an object"),
        ):
            error = self.rpc_error("prompts/get", params)
            self.assertEqual(error["code"], -32602)
            self.assertIn(says, error["message"])


class CompletionTests(ModernMixin, McpTestCase):
    def complete(self, ref, name, value, context=None, error=False):
        params = {"ref": ref, "argument": {"name": name, "value": value}}
        if context is not None:
            params["context"] = {"arguments": context}
        if error:
            return self.rpc_error("completion/complete", params)
        return self.result("completion/complete", params)["completion"]["values"]

    TEMPLATE = {"type": "ref/resource", "uri": "trapsandbox://{traposId}/files/{+path}"}
    PROMPT = {"type": "ref/prompt", "name": "debug_program"}

    def test_computers_and_their_files(self):
        self.computer("7:base").files.update({"startup.lua": b"", "stats.txt": b"", "x": b""})
        self.computer("8:mine")
        self.assertEqual(self.complete(self.TEMPLATE, "traposId", ""), ["7:base", "8:mine"])
        self.assertEqual(self.complete(self.TEMPLATE, "traposId", "mi"), ["8:mine"])
        self.assertEqual(self.complete(self.PROMPT, "computer", "7"), ["7:base"])
        self.assertEqual(
            self.complete(self.TEMPLATE, "path", "st", {"traposId": "7:base"}),
            ["startup.lua", "stats.txt"],
        )
        self.assertEqual(
            self.complete(self.PROMPT, "program", "/stat", {"computer": "base"}), ["/stats.txt"]
        )
        # No computer named, one that is not there, or one that refuses: nothing.
        self.assertEqual(self.complete(self.TEMPLATE, "path", "s"), [])
        self.assertEqual(self.complete(self.TEMPLATE, "path", "s", {"traposId": "9"}), [])
        self.assertEqual(self.complete(self.PROMPT, "program", "s", {"computer": "8"}), [])

    def test_bad_references_are_invalid_params(self):
        for ref in ({"type": "ref/prompt", "name": "x"}, {"type": "ref/resource", "uri": "x"}, {}):
            self.assertEqual(self.complete(ref, "a", "", error=True)["code"], -32602)
        self.assertEqual(
            self.rpc_error("completion/complete", {"ref": self.PROMPT})["code"], -32602
        )


class AccountTests(ModernMixin, McpTestCase):
    """An account's token completes, reads and subscribes to its own computers only."""

    def setUp(self):
        from tests.unit.admission.test_accounts import some

        super().setUp()
        admission = auth.Admission(self.clock, admin_token="admin", accounts=some("alice", "bob"))
        app = gateway_app(self.registry, admission=admission)
        self.http = StubTreq(app.resource())
        self.alice = self.computer("5:a", account_id="alice")
        self.bob = self.computer("6:b", account_id="bob")
        self.bob.files["secret.txt"] = b"bob's"

    def as_alice(self, method, params, modern=False):
        headers = {"authorization": "Bearer token-of-alice"}
        if modern:
            _, answer = self.modern_raw(method, params, headers=headers)
            return answer
        return self.rpc(method, params, headers=headers)

    def test_another_accounts_computer_cannot_be_completed_read_or_subscribed_to(self):
        template = {"type": "ref/resource", "uri": "trapsandbox://{traposId}/files/{+path}"}
        for modern in (False, True):
            completed = self.as_alice(
                "completion/complete",
                {"ref": template, "argument": {"name": "traposId", "value": ""}},
                modern,
            )
            self.assertEqual(completed["result"]["completion"]["values"], ["5:a"])
            completed = self.as_alice(
                "completion/complete",
                {
                    "ref": template,
                    "argument": {"name": "path", "value": "se"},
                    "context": {"arguments": {"traposId": "6:b"}},
                },
                modern,
            )
            self.assertEqual(completed["result"]["completion"]["values"], [])
            read = self.as_alice(
                "resources/read", {"uri": "trapsandbox://6%3Ab/files/secret.txt"}, modern
            )
            self.assertEqual(read["error"]["code"], -32602 if modern else -32002)
        subscribed = self.as_alice("resources/subscribe", {"uri": "trapsandbox://6%3Ab/screen"})
        self.assertEqual(subscribed["error"]["code"], -32002)
        self.assertEqual(self.bob.sent, [])  # nothing ever reached bob's computer
