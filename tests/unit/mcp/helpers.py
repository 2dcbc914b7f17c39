"""
The MCP endpoint in memory (SPEC §10), shared by the tests of ``trapsandbox.mcp``:
the whole ``GatewayApp`` behind ``StubTreq``, with in-memory §9 computers.
"""

import orjson
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.apps import gateway_app
from tests.harness.fakes import FixedProbe, SandboxComputer
from trapsandbox.admission import auth
from trapsandbox.computers.registry import Registry
from trapsandbox.opencode.probe import ProbeResult

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
    "send_input",
    "list_peripherals",
    "call_peripheral",
    "turtle",
)


class McpTestCase(SynchronousTestCase):
    admin_token = None

    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=60)
        admission = auth.Admission(self.clock, admin_token=self.admin_token)
        app = gateway_app(self.registry, FixedProbe(ProbeResult(True, "")), admission)
        self.endpoint = app._mcp
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


def events(body):
    """The JSON-RPC messages of an SSE answer, in order."""
    found = []
    for block in body.decode().split("\n\n"):
        lines = block.split("\n")
        if not block:
            continue
        assert lines[0] == "event: message", block
        assert lines[1].startswith("data: "), block
        found.append(orjson.loads(lines[1][len("data: ") :]))
    return found


class StreamingMixin:
    """tools/call as a client that takes progress sends it."""

    def call_streaming(self, tool, token="tok", headers=None, **arguments):
        """A tools/call with a progressToken, Accept: SSE; a Deferred of (response, body)."""
        self.ids += 1
        message = {
            "jsonrpc": "2.0",
            "id": self.ids,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": {"progressToken": token}},
        }
        headers = {"accept": "application/json, text/event-stream", **(headers or {})}
        return self.post_raw(orjson.dumps(message), headers)
