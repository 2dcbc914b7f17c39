"""
Fakes for the opencode side in memory: a treq-like HTTP client whose answers
and event stream the tests drive (recorded event shapes, NOTES-opencode.md),
and ``AskTestsMixin``, an ``Asks`` over it.
"""

import os

import orjson
from hyperlink import DecodedURL
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

from trapsandbox import limits
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.client import OpencodeClient
from trapsandbox.opencode.directories import directory_name
from trapsandbox.opencode.queue import AskQueue
from trapsandbox.opencode.servers import Server
from trapsandbox.opencode.tokens import AskTokens
from trapsandbox.ops.metrics import Metrics

URL = "http://127.0.0.1:4096"
SES = "ses_1"


class FakeTransport:
    def __init__(self, protocol):
        self.protocol = protocol
        self.stopped = False

    def stopProducing(self):
        if not self.stopped:
            self.stopped = True
            self.protocol.connectionLost(Failure(ResponseFailed([Failure(ResponseDone())])))


class FakeResponse:
    """Enough of ``IResponse`` for ``treq.content`` and ``deliverBody``."""

    def __init__(self, code, body=b""):
        self.code = code
        self.body = body
        self.protocol = None
        self.headers = Headers()
        self.length = len(body) if body is not None else UNKNOWN_LENGTH

    def deliverBody(self, protocol):
        self.protocol = protocol
        protocol.makeConnection(FakeTransport(protocol))
        if self.body is not None:
            if self.body:
                protocol.dataReceived(self.body)
            protocol.connectionLost(Failure(ResponseDone()))


class FakeHTTP:
    """
    A treq-like client: ``request``/``get`` are recorded and answered by
    ``answers[(method, path)]`` (a JSON value, ``(code, value)``, an exception or
    a Deferred); ``GET /global/event`` answers from ``streams``.
    """

    def __init__(self):
        self.calls = []
        self.answers = {
            ("GET", "/config"): {
                "mcp": {"trapsandbox": {"type": "remote", "url": "http://gw/mcp"}}
            },
            ("GET", "/config/providers"): {"providers": [{"id": "fake"}], "default": {}},
            ("POST", "/mcp"): True,
            ("POST", "/session"): lambda body: {"id": f"ses_{self.sessions + 1}"},
            ("GET", "/session/status"): {},
        }
        self.sessions = 0
        self.stream_gets = []  # the Deferreds of GET /global/event, newest last
        self.auto_stream = True
        self.stream = None  # the open stream's FakeResponse

    def request(self, method, url, **kwargs):
        url = DecodedURL.fromText(str(url)) if not isinstance(url, DecodedURL) else url
        path = "/" + "/".join(url.path)
        body = orjson.loads(kwargs["data"]) if "data" in kwargs else None
        self.calls.append((method, path, url.get("directory")[:1], body, kwargs.get("auth")))
        key = (method, path)
        if key not in self.answers:
            prefix = "/".join(path.split("/")[:2])  # /session/ses_x/... -> /session
            parts = path.split("/")
            key = (method, "/".join(parts[:2] + ["*"] + parts[3:]))
            if key not in self.answers:
                key = (method, prefix + "/*")
        answer = self.answers.get(key, None)
        if callable(answer):
            answer = answer(body)
        if key == ("POST", "/session"):
            self.sessions += 1
        if isinstance(answer, Deferred):
            return answer
        if isinstance(answer, Exception):
            return fail(answer)
        code, value = answer if isinstance(answer, tuple) else (200, answer)
        return succeed(FakeResponse(code, b"" if value is None else orjson.dumps(value)))

    def get(self, url, **kwargs):
        if str(url).endswith("/global/event"):
            self.stream_kwargs = kwargs
            d = Deferred()
            self.stream_gets.append(d)
            if self.auto_stream:
                self.open()
            return d
        return self.request("GET", url, **kwargs)

    def open(self, code=200):
        response = FakeResponse(code, None if code == 200 else b"")
        self.stream = response
        self.stream_gets[-1].callback(response)

    def send(self, data):
        self.stream.protocol.dataReceived(data)

    def event(self, kind, directory="/d", **properties):
        payload = {"id": "evt", "type": kind, "properties": properties}
        self.send(b"data: " + orjson.dumps({"directory": directory, "payload": payload}) + b"\n\n")

    def drop(self):
        self.stream.protocol.connectionLost(Failure(ResponseFailed([Failure(ResponseDone())])))

    def paths(self, method=None):
        return [c[1] for c in self.calls if method is None or c[0] == method]


def build_asks(
    clients,
    clock,
    metrics=None,
    *,
    directory,
    tokens=None,
    queue=None,
    instance_idle=limits.ASK_INSTANCE_IDLE,
    max_instances=limits.ASK_MAX_INSTANCES,
    **options,
):
    """``Asks`` over ``clients`` (one ``OpencodeClient`` or several), built as ``tap.build``
    builds it; ``options`` are ``Asks``' own keyword arguments."""
    tokens = AskTokens() if tokens is None else tokens
    if isinstance(clients, OpencodeClient):
        clients = [clients]
    servers = [
        Server.build(client, clock, directory, tokens, instance_idle, max_instances)
        for client in clients
    ]
    queue = AskQueue(clock) if queue is None else queue
    return Asks(servers, clock, Metrics() if metrics is None else metrics, tokens, queue, **options)


class AskTestsMixin:
    def setUp(self):
        self.clock = Clock()
        self.http = FakeHTTP()
        self.client = OpencodeClient(self.http, self.clock, URL, password="pw")
        self.metrics = Metrics()
        self.root = os.path.abspath(self.mktemp())
        os.mkdir(self.root, 0o700)  # as state.prepare leaves it at start
        self.asks = build_asks(self.client, self.clock, self.metrics, directory=self.root)
        self.partials = []

    def asks_with(self, **options):
        """``self.asks`` again, built with ``options`` (``Asks``' keyword arguments)."""
        self.asks = build_asks(
            self.client, self.clock, self.metrics, directory=self.root, **options
        )

    def ask(self, prompt="hi", trapos="1:a", account="local", message_id="m1", **payload):
        emit = self.partials.append
        return Deferred.fromCoroutine(
            self.asks.ask(
                account,
                trapos,
                frozenset({"exec"}),
                message_id,
                {"prompt": prompt, **payload},
                emit,
            )
        )

    def block(self, trapos="1:a", account="local"):
        """The computer's MCP block as its directory's ``opencode.json`` holds it."""
        path = os.path.join(self.root, directory_name(account, trapos), "opencode.json")
        with open(path, "rb") as f:
            return orjson.loads(f.read())["mcp"]["trapsandbox"]

    def outcome(self, name):
        return self.metrics._asks.labels(name).value

    def assistant(self, message="msg_a", session=SES):
        self.http.event(
            "message.updated", info={"id": message, "sessionID": session, "role": "assistant"}
        )

    def busy(self, session=SES):
        self.http.event("session.status", sessionID=session, status={"type": "busy"})

    def idle(self, session=SES):
        self.http.event("session.status", sessionID=session, status={"type": "idle"})
        self.http.event("session.idle", sessionID=session)

    def tool(self, status, call="call_1", input=None, tool="trapsandbox_write_file", **state):
        self.http.event(
            "message.part.updated",
            part={
                "id": "prt_t",
                "sessionID": SES,
                "messageID": "msg_a",
                "type": "tool",
                "callID": call,
                "tool": tool,
                "state": {"status": status, "input": input or {}, **state},
            },
        )

    def permission(self, pid="per_1", call="call_1", tool="trapsandbox_write_file"):
        self.http.event(
            "permission.asked",
            id=pid,
            sessionID=SES,
            permission=tool,
            patterns=["*"],
            tool={"messageID": "msg_a", "callID": call},
        )
