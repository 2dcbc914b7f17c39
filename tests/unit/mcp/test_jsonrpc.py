"""
JSON-RPC over Streamable HTTP on ``POST /mcp`` (SPEC §10, ``mcp.jsonrpc``): ids,
notifications, malformed messages and their errors and statuses; any JSON
gets an answer.
"""

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.mcp.helpers import TOOLS, McpTestCase
from trapsandbox import limits
from trapsandbox.mcp import jsonrpc


class TransportTests(McpTestCase):
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

    def test_a_session_id_is_issued_at_initialize_and_any_is_accepted(self):
        # One per client connection, so that their request ids (and cancels) are told apart.
        ids = set()
        for _ in range(2):
            response, _ = self.post(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": "x"},
                }
            )
            [issued] = response.headers.getRawHeaders("mcp-session-id")
            self.assertRegex(issued, "^[0-9a-f]{32}$")
            ids.add(issued)
        self.assertEqual(len(ids), 2)
        # No state: an unknown one does no harm, and other answers issue none.
        response, _ = self.post(
            {"jsonrpc": "2.0", "id": 2, "method": "ping"}, {"mcp-session-id": "abc"}
        )
        self.assertEqual(response.code, 200)
        self.assertFalse(response.headers.hasHeader("mcp-session-id"))


class MalformedTests(McpTestCase):
    def assertHttpError(self, data, status, code, headers=None, id=None):
        response, body = self.successResultOf(self.post_raw(data, headers))
        self.assertEqual(response.code, status, body)
        answer = orjson.loads(body)
        self.assertEqual(answer["jsonrpc"], "2.0")
        # The request's id whenever it could be read, else null.
        self.assertEqual(answer["id"], id)
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
            readable = message.get("id") if isinstance(message, dict) else None
            readable = readable if type(readable) is int and readable < 2**63 else None
            self.assertHttpError(orjson.dumps(message), 400, -32600, id=readable)

    def test_params_not_an_object(self):
        self.ids += 1
        _, body = self.post({"jsonrpc": "2.0", "id": 9, "method": "ping", "params": [1]})
        self.assertEqual(orjson.loads(body)["error"]["code"], -32602)

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
            id=1,
        )
        self.rpc("ping", headers={"mcp-protocol-version": "2025-06-18"})


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
                "protocolVersion": st.sampled_from(jsonrpc.PROTOCOL_VERSIONS) | json_values,
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
