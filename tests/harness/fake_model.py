"""
A scripted OpenAI-compatible model for the real opencode, offline
(``../shared/NOTES-opencode.md``): a twisted.web server answering
``POST /v1/chat/completions`` with SSE chunks in OpenAI's format.

A request without tools (opencode's title generator) gets a short text.  A
request whose history has no ``role: "tool"`` message yet gets one
``tool_calls`` delta calling ``tool`` with ``arguments``; once a tool result is
in the history, plain text.  Every request body is kept in ``requests``;
``tool_result()`` fires with the content of the first tool message received.

    model = start_fake_model(testcase, "trapsandbox_run_lua", {"code": "return 6*7"})
    config = {**model.opencode_config(), "mcp": ...}
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import endpoints
from twisted.internet.defer import Deferred
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from tests.harness.support import bounded, reactor


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def tool_messages(request: dict[str, Any]) -> list[str]:
    """The contents of the ``role: "tool"`` messages of one request, as text."""
    found = []
    for message in request.get("messages", []):
        if message.get("role") == "tool":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(
                    part.get("text", "") for part in content if isinstance(part, dict)
                )
            found.append(content if isinstance(content, str) else json.dumps(content))
    return found


class FakeModel(Resource):
    isLeaf = True

    def __init__(
        self,
        tool: str,
        arguments: dict[str, Any],
        answer: str = "Done.",
        script: list[tuple[str, dict[str, Any]]] | None = None,
        hold: bool = False,
    ) -> None:
        super().__init__()
        # ``script``: tool calls made one after the other (the Nth once N-1 results are in);
        # ``hold``: the closing text starts and never ends (until opencode hangs up).
        self.script = script or [(tool, arguments)]
        self.tool = tool
        self.arguments = arguments
        self.answer = answer
        self.hold = hold
        self.held: list[Any] = []
        self.hung_up: Deferred = Deferred()
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._waiting: list[Deferred] = []

    def render_POST(self, request):
        if request.path != b"/v1/chat/completions":
            request.setResponseCode(404)
            return b"{}"
        body = json.loads(request.content.read())
        self.requests.append(body)
        request.setHeader(b"content-type", b"text/event-stream")
        request.setHeader(b"cache-control", b"no-cache")
        results = tool_messages(body)
        if results:
            waiting, self._waiting = self._waiting, []
            for d in waiting:
                d.callback(results[0])
        if not body.get("tools") or len(results) >= len(self.script):
            text = self.answer if body.get("tools") else "A title"
            request.write(_chunk({"role": "assistant", "content": text}))
            if self.hold and body.get("tools"):
                self.held.append(request)
                request.notifyFinish().addBoth(
                    lambda _: self.hung_up.called or self.hung_up.callback(None)
                )
                return NOT_DONE_YET
            request.write(_chunk({}, "stop"))
        else:
            tool, arguments = self.script[len(results)]
            call = {
                "index": 0,
                "id": f"call_fake_{len(results) + 1}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments)},
            }
            request.write(_chunk({"role": "assistant", "content": None, "tool_calls": [call]}))
            request.write(_chunk({}, "tool_calls"))
        request.write(b"data: [DONE]\n\n")
        request.finish()
        return NOT_DONE_YET

    def offered_tools(self) -> set[str]:
        """The tool names opencode offered in any request."""
        return {
            tool.get("function", {}).get("name")
            for body in self.requests
            for tool in body.get("tools") or []
        }

    def tool_result(self, seconds: float = 60) -> Deferred:
        """Fires with the text of the first tool result the model is sent."""
        for body in self.requests:
            results = tool_messages(body)
            if results:
                d: Deferred = Deferred()
                d.callback(results[0])
                return d
        d = Deferred()
        self._waiting.append(d)
        return bounded(d, seconds)

    def opencode_config(self) -> dict[str, Any]:
        """opencode.json settings that make this the only model."""
        return {
            "provider": {
                "fake": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake",
                    "options": {"baseURL": f"http://127.0.0.1:{self.port}/v1", "apiKey": "x"},
                    "models": {"m1": {"name": "m1", "tool_call": True}},
                }
            },
            "model": "fake/m1",
            "small_model": "fake/m1",
            "autoupdate": False,
            "share": "disabled",
        }


async def start_fake_model(
    testcase, tool: str, arguments: dict[str, Any], port: int = 0, **options: Any
) -> FakeModel:
    """A ``FakeModel`` listening on 127.0.0.1 (on ``port``, default any; stopped at
    cleanup)."""
    model = FakeModel(tool, arguments, **options)
    endpoint = endpoints.TCP4ServerEndpoint(reactor(), port, interface="127.0.0.1")
    port = await bounded(endpoint.listen(Site(model)))
    testcase.addCleanup(port.stopListening)
    model.port = port.getHost().port
    return model
