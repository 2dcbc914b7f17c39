"""
The HTTP side, on the same port as the WebSocket: a Klein app.

    GET  /health                          open: {sandboxOk, opencodeOk, opencodeDetail?,
                                                 computers, version}
    /gateway                              the WebSocket endpoint for computers
    /operator                             operators: the WebSocket carrying many requests
                                          {id, traposId, type, ...} -> {id, status, ...}
                                          (``opsocket``)
    GET  /client/install.lua              open: the one-line installer for a computer
    GET  /client/<dir>/<file>             open: the Lua client files it downloads
    GET  /client/datapack.zip             open: the same files as a data pack (?url=URL|none)
    GET  /                                the web console (``console``), and its
    GET  /console/<name>                  files: open, with a strict CSP
    GET  /computers                       operators: {computers: [{traposId, accountId, peer,
                                                 connectedSince, version, inFlight,
                                                 capabilities}]}
    POST /computers/<traposId>/requests   operators: {type, payload?, timeoutMs?}
                                                 -> the computer's {ok, payload?, error?}
    GET  /metrics                         operators: Prometheus text format
    POST /mcp                             operators: MCP (Streamable HTTP, JSON-RPC 2.0),
                                          the computers as an agent's tools (``mcp``);
                                          other methods 405

  The computer as a sandbox (SPEC §9, ``trapsandbox.computers.sandbox``), operators:
    POST /computers/<traposId>/execute     {command, args?, cwd?, timeoutMs?, maxOutputBytes?}
                                           -> NDJSON: {type: stdout_delta|stderr_delta, data}...
                                              then {type: result, exitCode, timedOut, ...}
                                              or {type: error, error, code}
    POST /computers/<traposId>/eval        {code, timeoutMs?} -> the eval answer
    POST /computers/<traposId>/read-file   {path, offset?, length?} -> {ok, content (base64),
                                              sizeBytes, encoding, offset, bytesRead}
    POST /computers/<traposId>/write-file  {path, content (base64)} -> {ok, bytesWritten,
                                              sizeBytes}
    POST /computers/<traposId>/list-files  {path} -> {ok, path, entries}
    POST /computers/<traposId>/delete-file {path} -> {ok, deleted}
    GET  /computers/<traposId>/screen      -> {ok, width, height, cursorX, cursorY, lines, ...}
    POST /computers/<traposId>/input       {events} -> {ok, queued} (SPEC §14)
    GET  /computers/<traposId>/screen/stream?maxFps=n
                                           -> text/event-stream: data: {type: screen, width,
                                              height, cursorX, cursorY, cursorBlink, rows,
                                              palette?} per frame (``computers.screen``)
  Snapshots (SPEC §15, ``web.snapshotcalls``; /operator carries them too), operators:
    GET  /computers/<traposId>/snapshots                 -> {ok, snapshots: [{id, created,
                                                            reason, files, bytes, ...}]}
    POST /computers/<traposId>/snapshots                 {} -> {ok, id, files, bytes, fetched}
    GET  /computers/<traposId>/snapshots/<id>/changes    -> {ok, snapshot, added, modified,
                                                            deleted, diffs}
    POST /computers/<traposId>/snapshots/<id>/restore    {} -> {ok, restored, before,
                                                            deleted, written}
  Their failures are {ok: false, error: "<message>", code} with the status of
  ``errors.STATUS``; a caller leaving /execute cancels the run, and one
leaving /screen/stream the watch on the computer.

Operators present ``Authorization: Bearer <SANDBOX_ADMIN_TOKEN>`` (the
admin: every account) or an account's token (that account's computers only,
SPEC §12); with no admin token configured, loopback clients are the admin,
but not a web page's request (``auth.browser_refusal``: an ``Origin`` other
than the gateway's own, or a ``Host`` that is not this machine's), and every
operator POST must be ``application/json`` (415).  A client's address is
``GatewayApp.client_address``: the peer's, or behind a proxy listed in
``SANDBOX_TRUSTED_PROXIES`` the client it forwards.  An operator request is
decided when its head is complete, before its body is read
(``site.GatewayRequest`` asks ``decide``; ``fasthttp`` likewise): a refused
caller is answered there and the connection closed.  Per-computer routes resolve their
account in one place (``on_computer``); the admin may add
``?account=NAME``.  ``/metrics`` is the admin's alone.  Every answer, errors
included, is JSON (``{ok: false, error: {code, message}}``), never an HTML
traceback page: Klein's own errors too (``http_error``, ``_TextOnly``).

One router: every path, the WebSockets' included, is a Klein route.  Bodies
are checked by ``validation`` and answers written by ``answers``; the app
builds nothing (``trapsandbox.tap`` gives it its parts).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from typing import Any

from klein import Klein
from prometheus_client.exposition import choose_encoder
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import PathConverter

from trapsandbox import __version__, errors, limits
from trapsandbox.admission import auth
from trapsandbox.computers import callers, wire
from trapsandbox.computers.callers import Caller, Sender
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.limits import MAX_REQUEST_TIMEOUT_MS
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.probe import OpencodeProbe, ProbeResult
from trapsandbox.ops.metrics import Metrics
from trapsandbox.web import client, console, validation
from trapsandbox.web.answers import (
    gateway_error,
    json_body,
    json_error,
    ok_body,
    plain_body,
    sandbox_failed,
    write_answer,
)
from trapsandbox.web.operator import (
    NO_SUCH_COMPUTER,
    UNSUPPORTED_MEDIA_TYPE,
    Answer,
    OperatorRequests,
    in_scope,
    json_content,
)
from trapsandbox.web.site import ASK, PUBLIC, operator_route
from trapsandbox.web.snapshotcalls import SnapshotCalls
from trapsandbox.web.streaming import EventStream, OutputStream, ScreenStream
from trapsandbox.web.validation import read_body

log = Logger()


def _lua(request: IRequest, body: bytes) -> bytes:
    request.setHeader(b"content-type", b"text/x-lua; charset=utf-8")
    request.setHeader(b"cache-control", b"no-store")
    return body


def _console(request: IRequest, name: str) -> bytes:
    """A console file with its policy headers (``web.console``), or a 404."""
    found = console.read(name)
    if found is None:
        return json_error(request, 404, errors.NOT_FOUND, f'no console file "{wire.cut(name)}"')
    kind, body = found
    request.setHeader(b"content-type", kind)
    for header, value in console.HEADERS:
        request.setHeader(header, value)
    return body


def operators_only(route):
    """
    Serve ``route`` only to an operator (a bearer token, or loopback when no
    admin token is set); it is called with ``operator=`` the ``auth.Operator``.
    """

    @functools.wraps(route)
    def guarded(self: GatewayApp, request: IRequest, *args: Any, **kwargs: Any):
        operator = self._operator(request)
        if not isinstance(operator, auth.Operator):
            return operator
        return route(self, request, *args, operator=operator, **kwargs)

    return guarded


def _joined(request: IRequest, name: bytes) -> str | None:
    """All of a request's ``name`` header lines as one comma-separated list, or None."""
    values = request.requestHeaders.getRawHeaders(name)
    if not values:
        return None
    return ", ".join(value.decode("latin-1") for value in values)


def _asked_account(request: IRequest) -> str | None:
    """The ``?account=NAME`` of a request, if it has one."""
    values = request.args.get(b"account")
    if not values:
        return None
    return values[0].decode("utf-8", "replace")


def on_computer(route):
    """
    A §9 operator route on one computer, called with the ``Caller``: the
    operator, aimed at the computer of the account ``auth.Operator.account_of``
    resolves from it and ``?account=`` (and the route's other path parts as
    they are); its refusal (409 for the admin) is a §9 error answer.
    """

    @functools.wraps(route)
    def resolved(
        self: GatewayApp,
        request: IRequest,
        trapos_id: str,
        operator: auth.Operator,
        **path: str,
    ):
        try:
            account_id = operator.account_of(self._registry, trapos_id, _asked_account(request))
        except GatewayError as failure:
            return gateway_error(request, failure)
        # What the route sends the computer is this operator's, in its activity.
        return route(self, request, Caller.of_operator(operator, account_id, trapos_id), **path)

    return operators_only(resolved)


def _encoded(answer: dict[str, Any]) -> dict[str, Any]:
    return {
        **answer,
        "content": base64.b64encode(answer["content"]).decode("ascii"),
        "encoding": "base64",
    }


_EXECUTE = '{"command", "args"?, "cwd"?, "timeoutMs"?, "maxOutputBytes"?}'


class _Segment(PathConverter):
    """
    A traposId as its path segment decodes, whatever it holds: empty, or
    starting with "/" (``%2F``).  The operator route reads it so, as
    ``fasthttp`` does, rather than redirect to another path or answer a
    bare 404: such a computer is a missing one.
    """

    regex = ".*?"
    part_isolating = False  # it may span "/"


class _TextOnly(Resource):
    """
    Klein's resource, but for the one answer Klein gives before routing: a
    path or ``Host`` that is not UTF-8 (Klein's routes are text) would be a
    bare-text 400 and an error in the log.  No route's path holds such bytes,
    so such a path names nothing here: a 404 as JSON, the one of a missing
    computer under ``/computers`` (as ``fasthttp`` answers it).
    """

    isLeaf = True

    def __init__(self, routes: IResource) -> None:
        super().__init__()
        self._routes = routes

    def render(self, request: IRequest) -> Any:
        try:
            for segment in request.postpath:
                segment.decode("utf-8")
        except UnicodeDecodeError:
            if request.postpath[0] == b"computers":
                return write_answer(request, NO_SUCH_COMPUTER)
            return json_error(request, 404, errors.NOT_FOUND, NotFound.description)
        try:
            request.getRequestHostname().decode("utf-8")
        except UnicodeDecodeError:
            return json_error(request, 400, "bad_request", "the Host header is not UTF-8")
        return self._routes.render(request)


class GatewayApp:
    """
    The HTTP routes of the port, and the decision on a request from its
    head (``decide``).  Given every part it serves; builds none.
    """

    app = Klein()
    app.url_map.converters["segment"] = _Segment

    def __init__(
        self,
        registry: Registry,
        probe: OpencodeProbe,
        websocket: IResource,
        requests: OperatorRequests,
        sandbox: Sandbox,
        mcp: McpEndpoint,
        metrics: Metrics,
        cluster: Any = None,
        asks: Asks | None = None,
        operator_socket: IResource | None = None,
        managed: Any = None,
    ) -> None:
        self._registry = registry
        # The opencode servers the gateway runs (``opencode.managed``), if it does.
        self._managed = managed
        self._probe = probe
        self._websocket = websocket
        self._requests = requests
        self._sandbox = sandbox
        self._mcp = mcp
        self._metrics = metrics
        # Cluster mode: a ``trapsandbox.cluster.member.Cluster`` (not imported otherwise).
        self._cluster = cluster
        self._asks = asks
        self._operator_socket = operator_socket

    @property
    def requests(self) -> OperatorRequests:
        """``POST /computers/{id}/requests`` as a value, for ``fasthttp``."""
        return self._requests

    def resource(self) -> IResource:
        return _TextOnly(self.app.resource())

    def client_address(self, request: IRequest) -> object:
        """The request's client: its peer, or a trusted reverse proxy's client (SPEC §4)."""
        return self._requests.client_address(
            request.getClientAddress(),
            _joined(request, b"x-forwarded-for"),
            _joined(request, b"forwarded"),
        )

    def decide(self, request: IRequest, method: bytes, target: bytes) -> Any:
        """
        The decision on a request from its head alone (``site.GatewayRequest``),
        before its body is read: ``PUBLIC`` for no operator route; for one,
        the ``auth.Operator`` or the ``Answer`` refusing it (``_admit``), or
        ``ASK`` for an ask's own token on ``/mcp``.
        """
        route = operator_route(method, target)
        if route is None:
            return PUBLIC
        if route == "mcp" and self._ask_scope(request) is not None:
            # (A GET has no body: its stream, or its 405, is the route's to answer.)
            if method == b"POST" and not json_content(request.getHeader(b"content-type")):
                return UNSUPPORTED_MEDIA_TYPE
            return ASK
        return self._admit(request, method)

    def _admit(self, request: IRequest, method: bytes) -> auth.Operator | Answer:
        return self._requests.admit(
            method,
            self.client_address(request),
            request.getHeader(b"authorization"),
            request.getHeader(b"origin"),
            request.getHeader(b"host"),
            request.getHeader(b"content-type"),
        )

    def _ask_scope(self, request: IRequest) -> tuple[str, str] | None:
        if self._asks is None:
            return None
        return self._asks.tokens.scope_of(request.getHeader(b"authorization"))

    def _operator(self, request: IRequest) -> auth.Operator | bytes:
        """
        Who the request's operator is (decided at its head, or now for a
        request that was not: ``decide``), or the error answer for one that
        is not.
        """
        who = getattr(request, "admitted", None)
        if not isinstance(who, auth.Operator):
            who = self._admit(request, request.method)
        if isinstance(who, Answer):
            return write_answer(request, who)
        return who

    # -- The WebSockets ----------------------------------------------------------------------

    @app.route("/gateway")
    def gateway(self, request: IRequest) -> IResource:
        return self._websocket

    @app.route("/operator")
    def operator_socket(self, request: IRequest) -> IResource:
        if self._operator_socket is None:
            raise NotFound()
        return self._operator_socket

    # -- Open routes -------------------------------------------------------------------------

    @app.route("/health", methods=["GET"])
    def health(self, request: IRequest):
        d = self._probe.check()
        d.addCallback(self._health_body, request)
        return d

    def _health_body(self, result: ProbeResult, request: IRequest) -> bytes:
        body = result.to_payload()
        body["computers"] = len(self._registry)
        if self._managed is not None:
            body["opencodeManaged"] = self._managed.figures()
        if self._cluster is not None:
            body.update(self._cluster.health(len(self._registry)))
        body["version"] = __version__
        return json_body(request, body)

    @app.route("/", methods=["GET"])
    def console_page(self, request: IRequest) -> bytes:
        return _console(request, console.INDEX)

    @app.route("/console/<name>", methods=["GET"])
    def console_file(self, request: IRequest, name: str) -> bytes:
        return _console(request, name)

    @app.route("/client/install.lua", methods=["GET"])
    def client_installer(self, request: IRequest) -> bytes:
        body = client.installer(request.getHeader(b"host"), request.isSecure())
        if body is None:
            return json_error(request, 400, "bad_request", "the Host header is not host[:port]")
        return _lua(request, body)

    @app.route("/client/datapack.zip", methods=["GET"])
    def client_datapack(self, request: IRequest) -> bytes:
        # The pack names this gateway as its computers reach it: ?url=URL, or the Host header
        # without it; ?url=none names none (`sandbox setup` then asks each player).
        asked = request.args.get(b"url", [b""])[0].decode("utf-8", "replace")
        if asked == "none":
            url = None
        elif asked:
            if not client.valid_url(asked):
                return json_error(request, 400, "bad_request", "url is not http(s):// or ws(s)://")
            url = asked
        else:
            url = client.base_url(request.getHeader(b"host"), request.isSecure())
            if url is None:
                return json_error(request, 400, "bad_request", "the Host header is not host[:port]")
        request.setHeader(b"content-type", b"application/zip")
        request.setHeader(b"content-disposition", b'attachment; filename="trapsandbox.zip"')
        request.setHeader(b"cache-control", b"no-store")
        return client.datapack(url)

    @app.route("/client/<path:name>", methods=["GET"])
    def client_file(self, request: IRequest, name: str) -> bytes:
        body = client.read(name)
        if body is None:
            return json_error(request, 404, errors.NOT_FOUND, f'no client file "{wire.cut(name)}"')
        return _lua(request, body)

    # -- Operators ---------------------------------------------------------------------------

    @app.route("/computers", methods=["GET"])
    @operators_only
    def computers(self, request: IRequest, operator: auth.Operator) -> bytes:
        asked = _asked_account(request)
        listed = self._requests.listing(operator, asked)
        if self._cluster is None:
            return json_body(request, {"computers": listed})

        def scoped(body: dict[str, Any]) -> bytes:
            body["computers"] = in_scope(body["computers"], operator.scope(asked))
            return json_body(request, body)

        return self._cluster.computers(listed).addCallback(scoped)

    # A label may hold a "/" (sent as %2F, which Twisted decodes): ``segment``.
    @app.route("/computers/<segment:trapos_id>/requests", methods=["POST"], merge_slashes=False)
    def computer_request(self, request: IRequest, trapos_id: str):
        try:
            body: bytes | GatewayError = read_body(request)
        except GatewayError as error:
            body = error
        operator = self._operator(request)
        if not isinstance(operator, auth.Operator):
            return operator
        answer = self._requests.http(
            self.client_address(request),
            request.getHeader(b"authorization"),
            trapos_id,
            _asked_account(request),
            body,
            admitted=operator,
        )
        if isinstance(answer, Answer):
            return write_answer(request, answer)
        return answer.addCallback(lambda done: write_answer(request, done))

    # -- The computer as a sandbox (SPEC §9) -------------------------------------------------

    @app.route("/computers/<path:trapos_id>/execute", methods=["POST"])
    @on_computer
    def execute(self, request: IRequest, caller: Caller):
        try:
            body = validation.json_object(read_body(request), _EXECUTE)
            command = validation.string(body, "command")
            args = validation.strings(body, "args")
            cwd = validation.string(body, "cwd", required=False)
            timeout_ms = validation.number(body, "timeoutMs", MAX_REQUEST_TIMEOUT_MS)
            max_output = validation.number(
                body, "maxOutputBytes", limits.MAX_OUTPUT_BYTES, integer=True
            )
        except GatewayError as error:
            return gateway_error(request, error)
        stream = OutputStream(request)
        d = self._sandbox.execute(
            caller,
            command,
            args,
            cwd,
            timeout_ms,
            max_output,
            on_output=stream.output,
        )
        if not d.called:
            stream.begin()  # it went out: from now on, failures are lines of the stream
        d.addCallbacks(stream.result, stream.failed)
        return d

    @app.route("/computers/<path:trapos_id>/eval", methods=["POST"])
    @on_computer
    def eval(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.eval(
                caller,
                validation.string(body, "code"),
                validation.number(body, "timeoutMs", MAX_REQUEST_TIMEOUT_MS),
                validation.number(body, "maxOutputBytes", limits.MAX_OUTPUT_BYTES, integer=True),
            )

        # The answer has its own ok: false when the code failed, and is still a 200.
        return self._sandbox_call(request, '{"code", "timeoutMs"?}', call, ok=False)

    @app.route("/computers/<path:trapos_id>/read-file", methods=["POST"])
    @on_computer
    def read_file(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            validation.base64_encoding(body)
            offset = validation.offset(body, "offset")
            length = validation.number(body, "length", limits.MAX_FILE_BYTES, integer=True)
            return self._sandbox.read_file(
                caller,
                validation.string(body, "path"),
                offset,
                length,
            ).addCallback(_encoded)

        return self._sandbox_call(request, '{"path", "offset"?, "length"?}', call)

    @app.route("/computers/<path:trapos_id>/write-file", methods=["POST"])
    @on_computer
    def write_file(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            path = validation.string(body, "path")
            validation.base64_encoding(body)
            data = validation.base64_bytes(body, "content")
            return self._sandbox.write_file(caller, path, data)

        return self._sandbox_call(request, '{"path", "content", "encoding": "base64"}', call)

    @app.route("/computers/<path:trapos_id>/list-files", methods=["POST"])
    @on_computer
    def list_files(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.list_files(
                caller,
                validation.string(body, "path"),
            )

        return self._sandbox_call(request, '{"path"}', call)

    @app.route("/computers/<path:trapos_id>/delete-file", methods=["POST"])
    @on_computer
    def delete_file(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.delete_file(
                caller,
                validation.string(body, "path"),
            )

        return self._sandbox_call(request, '{"path"}', call)

    @app.route("/computers/<path:trapos_id>/screen", methods=["GET"])
    @on_computer
    def screen(self, request: IRequest, caller: Caller):
        d = self._sandbox.screen(caller)
        d.addCallbacks(ok_body, sandbox_failed, (request,), None, (request,))
        return d

    @app.route("/computers/<path:trapos_id>/input", methods=["POST"])
    @on_computer
    def input(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            events = validation.objects(body, "events", limits.MAX_INPUT_EVENTS)
            return self._sandbox.input(caller, events)

        return self._sandbox_call(request, '{"events": [{"char"}, {"key"}, ...]}', call)

    @app.route("/computers/<path:trapos_id>/screen/stream", methods=["GET"])
    @on_computer
    def screen_stream(self, request: IRequest, caller: Caller):
        try:
            max_fps = validation.query_number(request, b"maxFps", 1, 20)
        except GatewayError as error:
            return gateway_error(request, error)
        stream = ScreenStream(request, self._registry.streams.held(request))
        d = self._sandbox.watch_screen(caller, stream.frame, max_fps, stream.room)
        if not d.called:
            stream.begin()  # it went out: from now on, its end is an event of the stream
        # Klein cancels ``d`` when the caller leaves: the watch is cancelled on the computer.
        d.addBoth(stream.ended)
        return d

    # -- Snapshots (SPEC §15) ----------------------------------------------------------------
    # A label may hold a "/": the snapshot id is the last segments, the traposId the rest.

    @app.route("/computers/<path:trapos_id>/snapshots", methods=["GET"])
    @on_computer
    def snapshots(self, request: IRequest, caller: Caller):
        return self._snapshot_call(request, lambda s: s.list(caller))

    @app.route("/computers/<path:trapos_id>/snapshots", methods=["POST"])
    @on_computer
    def take_snapshot(self, request: IRequest, caller: Caller):
        return self._snapshot_call(request, lambda s: s.take(caller), body=True)

    @app.route("/computers/<path:trapos_id>/snapshots/<snapshot_id>/changes", methods=["GET"])
    @on_computer
    def snapshot_changes(self, request: IRequest, caller: Caller, snapshot_id: str):
        return self._snapshot_call(request, lambda s: s.changes(caller, snapshot_id))

    @app.route("/computers/<path:trapos_id>/snapshots/<snapshot_id>/restore", methods=["POST"])
    @on_computer
    def restore_snapshot(self, request: IRequest, caller: Caller, snapshot_id: str):
        return self._snapshot_call(request, lambda s: s.restore(caller, snapshot_id), body=True)

    def _snapshot_call(
        self, request: IRequest, call: Callable[[SnapshotCalls], Deferred], body: bool = False
    ):
        """
        A snapshot operation (``snapshotcalls``, whose answers ``/operator`` gives too):
        its body (if any) must be empty or a JSON object.
        """
        try:
            if body:
                raw = read_body(request)
                if raw.strip():
                    validation.json_object(raw, "{}")
        except GatewayError as error:
            return gateway_error(request, error)
        d = call(self._requests.snapshots)
        d.addCallbacks(ok_body, sandbox_failed, (request,), None, (request,))
        return d

    # -- Peripherals and turtles (SPEC §16) --------------------------------------------------

    @app.route("/computers/<path:trapos_id>/peripherals", methods=["GET"])
    @on_computer
    def peripherals(self, request: IRequest, caller: Caller):
        d = self._sandbox.list_peripherals(caller)
        d.addCallbacks(ok_body, sandbox_failed, (request,), None, (request,))
        return d

    @app.route("/computers/<path:trapos_id>/peripherals/<name>/call", methods=["POST"])
    @on_computer
    def call_peripheral(self, request: IRequest, caller: Caller, name: str):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.call_peripheral(
                caller,
                name,
                validation.string(body, "method"),
                validation.values(body, "args"),
            )

        return self._sandbox_call(request, '{"method", "args"?}', call)

    @app.route("/computers/<path:trapos_id>/peripherals/events", methods=["GET"])
    @on_computer
    def peripheral_events(self, request: IRequest, caller: Caller):
        try:
            events = validation.query_names(request, b"events")
            timeout_ms = validation.query_number(
                request, b"timeoutMs", 1, limits.MAX_PERIPHERAL_EVENTS_TIMEOUT_MS
            )
        except GatewayError as error:
            return gateway_error(request, error)
        stream = EventStream(request, self._registry.streams.held(request))
        d = self._sandbox.watch_peripheral_events(
            caller,
            stream.frame,
            events,
            timeout_ms,
        )
        if not d.called:
            stream.watch = d
            stream.begin()
        # Klein cancels ``d`` when the caller leaves: the watch is cancelled on the computer.
        d.addBoth(stream.ended)
        return d

    @app.route("/computers/<path:trapos_id>/turtle", methods=["POST"])
    @on_computer
    def turtle(self, request: IRequest, caller: Caller):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.turtle(
                caller,
                validation.string(body, "action"),
                validation.values(body, "args"),
            )

        return self._sandbox_call(request, '{"action", "args"?}', call)

    def _sandbox_call(
        self,
        request: IRequest,
        shape: str,
        call: Callable[[dict[str, Any]], Deferred],
        ok: bool = True,
    ):
        try:
            d = call(validation.json_object(read_body(request), shape))
        except GatewayError as error:
            return gateway_error(request, error)
        d.addCallbacks(ok_body if ok else plain_body, sandbox_failed, (request,), None, (request,))
        return d

    # -- MCP (SPEC §10) ----------------------------------------------------------------------

    @app.route("/mcp", methods=["POST"])
    def mcp(self, request: IRequest):
        # An ask's own token (SPEC §11) reaches the asking computer only. Any other
        # caller must be an operator: an account token's tools reach its computers
        # only; the admin's every account's, or one account's with /mcp?account=NAME.
        # The tools' requests are the agent's in the computer's activity: an ask's own
        # (the agent in ``sandbox ask``), or an operator's MCP client's.
        pin = self._ask_scope(request)
        if pin is not None and not json_content(request.getHeader(b"content-type")):
            return write_answer(request, UNSUPPORTED_MEDIA_TYPE)
        if pin is not None:
            caller = Caller(*pin, Sender(callers.ASK))
        else:
            operator = self._operator(request)
            if not isinstance(operator, auth.Operator):
                return operator
            scope = operator.scope(_asked_account(request))
            caller = Caller(scope, None, Sender(callers.AGENT, operator.account))
        try:
            body = read_body(request)
        except GatewayError as error:
            return self._mcp.post(request, None, error.message, caller)
        return self._mcp.post(request, body, None, caller)

    @app.route("/mcp", methods=["GET"])
    def mcp_stream(self, request: IRequest):
        # A legacy client's stream of its resource subscriptions' updates (SPEC §17), for
        # the caller it subscribed as; without subscriptions, a 405 as ever.
        if self._ask_scope(request) is None:
            operator = self._operator(request)
            if not isinstance(operator, auth.Operator):
                return operator
        return self._mcp.get(request) or self.mcp_other(request)

    @app.route("/mcp", methods=["PUT", "DELETE", "PATCH", "OPTIONS"])
    def mcp_other(self, request: IRequest) -> bytes:
        # No sessions to end (DELETE); GET streams only a client's subscriptions.
        request.setHeader(b"allow", b"POST")
        return json_error(request, 405, "method_not_allowed", "POST one JSON-RPC message to /mcp")

    @app.route("/metrics", methods=["GET"])
    @operators_only
    def metrics(self, request: IRequest, operator: auth.Operator) -> bytes:
        if not operator.admin:
            # Counts of every account's computers are the admin's alone.
            return json_error(request, 403, "forbidden", "/metrics needs the admin token")
        accept = (request.getHeader(b"accept") or b"").decode("latin-1")
        encoder, content_type = choose_encoder(accept)
        request.setHeader(b"content-type", content_type.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        return encoder(self._metrics.registry)

    # -- Klein's own errors, as JSON ---------------------------------------------------------

    @app.handle_errors(HTTPException)
    def http_error(self, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        name = (error.name or "error").lower().replace(" ", "_")
        return json_error(request, error.code or 500, name, error.description or error.name)

    @app.handle_errors
    def internal_error(self, request: IRequest, failure: Failure) -> bytes:
        log.failure(
            "{method} {uri} failed", failure, method=request.method, uri=wire.cut(request.uri)
        )
        return json_error(request, 500, "internal", "the gateway failed to handle this request")
