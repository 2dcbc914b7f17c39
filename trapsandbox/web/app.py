"""
The HTTP side, on the same port as the WebSocket: a Klein app.

    GET  /health                          open: {sandboxOk, opencodeOk, opencodeDetail?,
                                                 computers, version}
    /gateway                              the WebSocket endpoint for computers (routed
                                          ahead of Klein, by ``_Root``)
    /operator                             operators: the WebSocket carrying many requests
                                          {id, traposId, type, ...} -> {id, status, ...}
                                          (``opsocket``; routed ahead of Klein)
    GET  /client/install.lua              open: the one-line installer for a computer
    GET  /client/<dir>/<file>             open: the Lua client files it downloads
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
  Their failures are {ok: false, error: "<message>", code} with the status of
  ``STATUS_OF_ERROR``; a caller leaving /execute cancels the run.

Operators present ``Authorization: Bearer <SANDBOX_ADMIN_TOKEN>`` (the
admin: every account) or an account's token (that account's computers only,
SPEC §12); with no admin token configured, loopback clients are the admin,
but not a web page's request (``auth.browser_refusal``: an ``Origin`` other
than the gateway's own, or a ``Host`` that is not this machine's), and every
operator POST must be ``application/json`` (415).  A client's address is
``GatewayApp.client_address``: the peer's, or behind a proxy listed in
``SANDBOX_TRUSTED_PROXIES`` the client it forwards.  An operator request is
decided when its head is complete, before its body is read
(``GatewayRequest``; ``fasthttp`` likewise): a refused caller is answered
there and the connection closed.  Per-computer routes resolve their
account in one place (``on_computer``); the admin may add
``?account=NAME``.  ``/metrics`` is the admin's alone.  Every answer, errors
included, is JSON (``{ok: false, error: {code, message}}``), never an HTML
traceback page.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
from klein import Klein
from prometheus_client.exposition import choose_encoder
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import datetimeToString
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from werkzeug.exceptions import HTTPException

from trapsandbox import __version__, limits
from trapsandbox.admission import auth
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry, Session
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.wire import GatewayError
from trapsandbox.fast import fixes
from trapsandbox.fast.fasthttp import ABORT_AFTER, response
from trapsandbox.limits import MAX_BODY_BYTES, MAX_REQUEST_TIMEOUT_MS
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.probe import OpencodeProbe, ProbeResult
from trapsandbox.ops.metrics import Metrics
from trapsandbox.web import client
from trapsandbox.web.operator import (
    REQUEST_TIMEOUT,
    STATUS_OF_ERROR,
    UNSUPPORTED_MEDIA_TYPE,
    Answer,
    BadBody,
    OperatorRequests,
    json_content,
    json_object,
    too_large,
)

log = Logger()


def json_body(request: IRequest, body: Any, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return orjson.dumps(body)


def json_error(request: IRequest, code: int, error: str, message: str) -> bytes:
    return json_body(request, {"ok": False, "error": {"code": error, "message": message}}, code)


def write_answer(request: IRequest, answer: Answer) -> bytes:
    """An ``operator.Answer`` onto ``request``: its status and headers set, its body returned."""
    status, body, headers = answer.encoded()
    request.setResponseCode(status)
    for name, value in headers:
        request.setHeader(name, value)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return body


def _lua(request: IRequest, body: bytes) -> bytes:
    request.setHeader(b"content-type", b"text/x-lua; charset=utf-8")
    request.setHeader(b"cache-control", b"no-store")
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


def on_computer(error: Callable[[IRequest, int, str, str], bytes]):
    """
    An operator route on one computer: its account is resolved here, in one
    place, from the operator and ``?account=`` (``auth.Operator.account_of``),
    and the route is called with ``account_id=``.  Another account's computer
    answers as a missing one does; ``error`` makes the body of an answer given
    here (409 for the admin).
    """

    def decorate(route):
        @functools.wraps(route)
        def resolved(self: GatewayApp, request: IRequest, trapos_id: str, operator: auth.Operator):
            try:
                account_id = operator.account_of(self._registry, trapos_id, _asked_account(request))
            except GatewayError as failure:
                return error(
                    request, STATUS_OF_ERROR.get(failure.code, 500), failure.code, failure.message
                )
            # A missing computer and another account's take the same path from here
            # (the body is checked, then the request finds nothing), so their answers
            # cannot differ.
            return route(self, request, trapos_id, account_id=account_id)

        return operators_only(resolved)

    return decorate


class _CappedContent(io.BytesIO):
    """A request body kept in memory up to a limit; past it, dropped and flagged."""

    def __init__(self, limit: int, over_limit: bool = False) -> None:
        super().__init__()
        self._limit = limit
        self.over_limit = over_limit

    def write(self, data: bytes) -> int:
        if not self.over_limit:
            if self.tell() + len(data) > self._limit:
                self.over_limit = True
                self.seek(0)
                self.truncate()
            else:
                super().write(data)
        return len(data)


# The head's decision on a request for no operator route: nothing to admit, and
# no route of it reads a body.
PUBLIC = "public"
# ... on ``POST /mcp`` with an ask's own token (SPEC §11): the route finds its scope.
ASK = "ask"


def operator_route(method: bytes, target: bytes) -> str | None:
    """
    The operator route a request line names: ``computers``, ``metrics``,
    ``mcp`` (POST only: other methods are a 405 for anyone), or None.  The
    first path segment is %-decoded as twisted.web's traversal decodes it.
    """
    if not target.startswith(b"/"):
        return None
    first = unquote_to_bytes(target[1:].split(b"?", 1)[0].split(b"/", 1)[0])
    if first in (b"computers", b"metrics") or (first == b"mcp" and method == b"POST"):
        return first.decode("ascii")
    return None


class GatewayChannel(fixes.BoundedContentLength):
    """
    twisted.web's channel, bounded for strangers (SPEC §4 "Nothing is buffered
    for a stranger"): a request's head and body must arrive within
    ``REQUEST_DEADLINE`` of its first byte (else 408 and close; Twisted's own
    idle timeout is reset by every byte), and a refused request's answer is
    the connection's last (``refuse``).
    """

    # Set by what listens (``front.hand_over``, ``listener.CountedSite``): the place of the
    # connection among its address's connections not yet admitted (``admission.strangers``).
    ticket: Any = None
    _deadline: Any = None
    _abort: Any = None
    # A request is whole and being answered (no deadline), or the connection is closing.
    _answering = False
    _closing = False

    def dataReceived(self, data: bytes) -> None:
        if self._deadline is None and not self._answering and not self._closing:
            self._deadline = self.callLater(limits.REQUEST_DEADLINE, self._too_slow)
        super().dataReceived(data)

    def allContentReceived(self) -> None:
        self._stop_deadline()
        self._answering = True
        super().allContentReceived()

    def requestDone(self, request: IRequest) -> None:
        self._answering = False
        # (Requests that arrived meanwhile are read now: dataReceived again.)
        super().requestDone(request)

    def admitted(self) -> None:
        """A request on this connection was admitted: it is no stranger's."""
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            ticket.admitted()

    def refuse(self, answer: Answer) -> None:
        """Send ``answer`` as the connection's last, and close it without reading more."""
        self._closing = True
        self._stop_deadline()
        self.persistent = False
        self.write(response(answer, datetimeToString(), close=True))
        self.loseConnection()
        # A client that does not read its answer is not waited for (as fasthttp).
        self.setTimeout(None)
        self._abort = self.callLater(ABORT_AFTER, self.transport.abortConnection)

    def _too_slow(self) -> None:
        self._deadline = None
        if not self._answering and not self._closing:
            self.refuse(REQUEST_TIMEOUT)

    def _stop_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None and deadline.active():
            deadline.cancel()

    def connectionLost(self, reason: Failure) -> None:
        self._stop_deadline()
        if self._abort is not None and self._abort.active():
            self._abort.cancel()
        self.admitted()  # gone: no longer waiting
        super().connectionLost(reason)


class GatewayRequest(Request):
    """
    A request decided at its head: who asks is known before any byte of its
    body is read, and a caller who may not send one is answered at once
    (``GatewayChannel.refuse``), its body never kept.
    """

    # The head's decision: an ``auth.Operator``, ``PUBLIC``, ``ASK``, or None
    # (not decided at the head: the route decides).
    admitted: Any = None
    _refused = False

    def gotLength(self, length: int | None) -> None:
        # Called by HTTPChannel.allHeadersReceived, before the body (fixes.request_line).
        channel = self.channel
        line = fixes.request_line(self)
        decide = getattr(channel.site, "decide", None)
        decision = None if line is None or decide is None else decide(self, *line)
        if isinstance(decision, Answer):
            self._refused = True
            # No "100 Continue" after the answer (HTTPChannel sends it after gotLength).
            self.requestHeaders.removeHeader(b"expect")
            self.content = _CappedContent(0)
            channel.refuse(decision)
            return
        self.admitted = decision
        if decision is not None:
            channel.admitted()
        if decision is PUBLIC:
            self.content = _CappedContent(0)  # no such route reads a body: keep none
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if not self._refused:
            super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if not self._refused:  # (what a refused request's body held is not served)
            super().requestReceived(command, path, version)


class GatewaySite(Site):
    """
    A ``Site`` that never spools a large request body to memory or disk, and
    reads an operator request's body only once its head is admitted
    (``decide``, ``GatewayApp.decide``).
    """

    displayTracebacks = False
    protocol = GatewayChannel
    requestFactory = GatewayRequest

    def __init__(
        self,
        resource: IResource,
        timeout: float = limits.HTTP_IDLE_TIMEOUT,
        decide: Callable[[IRequest, bytes, bytes], Any] | None = None,
    ) -> None:
        # No route reads form fields: skip parsing every POST's content type
        # for them (a quarter of an operator request's CPU).
        super().__init__(resource, timeout=timeout, parsePOSTFormSubmission=False)
        self.decide = decide

    def getContentFile(self, length: int | None) -> _CappedContent:
        return _CappedContent(MAX_BODY_BYTES, length is not None and length > MAX_BODY_BYTES)

    def log(self, request: IRequest) -> None:
        # No access line per HTTP request: an agent or a fleet's operator pings make
        # thousands a second (a tenth of a request's CPU, and a flooded journal).
        # Refusals, failures and every computer's connect and close are logged.
        pass


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _in_scope(body: dict[str, Any], scope: str | None) -> dict[str, Any]:
    """A cluster-wide listing cut down to the computers of ``scope`` (None: all)."""
    if scope is not None:
        body["computers"] = [c for c in body["computers"] if c.get("accountId") == scope]
    return body


def describe_session(session: Session) -> dict[str, Any]:
    """A computer's entry in ``/computers``."""
    return {
        "traposId": session.trapos_id,
        "accountId": session.account_id,
        "peer": session.peer,
        "connectedSince": _iso(session.connected_at),
        "version": session.version,
        "inFlight": session.in_flight,
        "capabilities": sorted(session.capabilities),
    }


def _take_body(request: IRequest) -> bytes:
    """The request's body, which the request keeps no copy of; raises ``BadBody``."""
    body = request.content.read(MAX_BODY_BYTES + 1)
    if getattr(request.content, "over_limit", False) or len(body) > MAX_BODY_BYTES:
        raise too_large()
    # The request object lives until the computer answers: keep no copy of
    # a body that may be megabytes.
    request.content.close()
    request.content = io.BytesIO()
    return body


def _string(obj: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    if type(value) is not str or (required and not value):
        raise BadBody(f"{name} must be a non-empty string")
    return value


def _number(obj: dict[str, Any], name: str, high: float, integer: bool = False) -> Any:
    """An optional positive number of at most ``high``."""
    value = obj.get(name)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if type(value) not in kinds or not math.isfinite(value) or not 0 < value <= high:
        kind = "whole number" if integer else "number"
        raise BadBody(f"{name} must be a {kind} from 1 to {high}")
    return value


def _strings(obj: dict[str, Any], name: str) -> list[str]:
    try:
        value = obj.get(name)
        return [] if value is None else wire.string_list(value)
    except TypeError:
        raise BadBody(f"{name} must be a list of strings") from None


def _base64(obj: dict[str, Any]) -> None:
    encoding = obj.get("encoding", "base64")
    if encoding != "base64":
        raise BadBody('encoding must be "base64"')


_EXECUTE = '{"command", "args"?, "cwd"?, "timeoutMs"?, "maxOutputBytes"?}'


def sandbox_error(request: IRequest, status: int, code: str, message: str) -> bytes:
    """A failure of a §9 endpoint: ``{ok: false, error: "<message>", code}``."""
    return json_body(request, {"ok": False, "error": message, "code": code}, status)


def _sandbox_failed(failure: Failure, request: IRequest) -> bytes | Failure:
    if failure.check(GatewayError):
        error = failure.value
        return sandbox_error(
            request, STATUS_OF_ERROR.get(error.code, 500), error.code, error.message
        )
    return failure  # cancelled (the client went away), or a bug for internal_error


def _relayable(request: IRequest, body: dict[str, Any]) -> bytes:
    try:
        return json_body(request, body)
    except orjson.JSONEncodeError as error:
        # orjson reads deeper nesting (1024) than it writes (254).
        return sandbox_error(
            request, 502, wire.INTERNAL, f"the computer's answer cannot be relayed: {error}"
        )


def _ok_body(payload: dict[str, Any], request: IRequest) -> bytes:
    return _relayable(request, {"ok": True, **payload})


def _plain_body(payload: dict[str, Any], request: IRequest) -> bytes:
    return _relayable(request, payload)


def _encoded(answer: dict[str, Any]) -> dict[str, Any]:
    return {
        **answer,
        "content": base64.b64encode(answer["content"]).decode("ascii"),
        "encoding": "base64",
    }


class _OutputStream:
    """
    ``/execute``'s answer: NDJSON lines written as the computer's output
    arrives, then one ``result`` (or ``error``) line.  Until the request has
    gone out, a failure is an ordinary JSON answer with its status.
    """

    def __init__(self, request: IRequest) -> None:
        self._request = request
        self._begun = False
        # What the deltas carried so far, so that the final answer's full
        # output can fill in what no partial did.
        self._sent = {"stdout_delta": 0, "stderr_delta": 0}

    def begin(self) -> None:
        if not self._begun:
            self._begun = True
            request = self._request
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"application/x-ndjson")
            request.setHeader(b"cache-control", b"no-store")

    def _line(self, obj: dict[str, Any]) -> None:
        self.begin()
        self._request.write(orjson.dumps(obj) + b"\n")

    def output(self, kind: str, data: str) -> None:
        self._sent[kind] += len(data)
        self._line({"type": kind, "data": data})

    def result(self, answer: dict[str, Any]) -> bytes:
        for kind, name in (("stdout_delta", "stdout"), ("stderr_delta", "stderr")):
            full = answer.get(name)
            if isinstance(full, str) and len(full) > self._sent[kind]:
                self.output(kind, full[self._sent[kind] :])
        line: dict[str, Any] = {"type": "result"}
        for name in ("exitCode", "timedOut", "durationMs", "stdoutTruncated", "stderrTruncated"):
            if name in answer:
                line[name] = answer[name]
        self._line(line)
        return b""

    def failed(self, failure: Failure) -> bytes | Failure:
        if not failure.check(GatewayError):
            return failure  # cancelled: the caller is gone
        if not self._begun:
            return _sandbox_failed(failure, self._request)
        error = failure.value
        self._line({"type": "error", "error": error.message, "code": error.code})
        return b""


class _Direct(Resource):
    """
    One hot route served without Klein (whose routing cost a fifth of an
    operator request): ``handler(request)`` answers with bytes or a Deferred
    of bytes, as a Klein route does, and a client that goes away cancels it.
    """

    isLeaf = True

    def __init__(self, handler: Callable[[IRequest], Any], failed: Callable) -> None:
        super().__init__()
        self._handler = handler
        self._failed = failed

    def render(self, request: IRequest) -> Any:
        result = self._handler(request)
        if not isinstance(result, Deferred):
            return result
        gone: list[object] = []
        request.notifyFinish().addBoth(gone.append)

        def write(body: bytes) -> None:
            if not gone:
                request.write(body)
                request.finish()

        def failed(failure: Failure) -> None:
            if not gone and not failure.check(CancelledError):
                write(self._failed(request, failure))

        result.addCallbacks(write, failed)
        if not gone:
            request.notifyFinish().addErrback(lambda _: result.cancel())
        return NOT_DONE_YET


class _Root(Resource):
    """
    Sends ``/gateway`` straight to the WebSocket, ``POST /computers/{id}/requests``
    straight to its route, and everything else to Klein: every computer's
    connect and every operator request would otherwise pay for Klein's routing.
    """

    def __init__(
        self, websocket: IResource, app: IResource, requests: _Direct, operator: Any = None
    ) -> None:
        super().__init__()
        self._websocket = websocket
        self._operator = operator
        self._app = app
        self._requests = requests

    def getChildWithDefault(self, name: bytes, request: IRequest) -> IResource:
        postpath = request.postpath
        if name == b"gateway" and not postpath:
            return self._websocket
        if name == b"operator" and not postpath and self._operator is not None:
            return self._operator
        if (
            name == b"computers"
            and request.method == b"POST"
            and len(postpath) == 2
            and postpath[1] == b"requests"
        ):
            return self._requests
        # Klein routes on the whole path: give it back the segment just taken.
        postpath.insert(0, request.prepath.pop())
        return self._app

    def render(self, request: IRequest) -> bytes:
        return self._app.render(request)


class GatewayApp:
    app = Klein()

    def __init__(
        self,
        registry: Registry,
        probe: OpencodeProbe,
        websocket: IResource,
        metrics: Metrics | None = None,
        admission: auth.Admission | None = None,
        cluster: Any = None,
        asks: Asks | None = None,
        operator_socket: IResource | None = None,
    ) -> None:
        self._registry = registry
        self._operator_socket = operator_socket
        # Cluster mode: a ``trapsandbox.cluster.member.Cluster`` (not imported otherwise).
        self._cluster = cluster
        self._asks = asks
        self._sandbox = Sandbox(registry)
        self._probe = probe
        self._websocket = websocket
        self._metrics = registry.metrics if metrics is None else metrics
        self._admission = auth.Admission(registry.clock) if admission is None else admission
        self._requests = OperatorRequests(registry, self._admission)
        self._mcp = McpEndpoint(registry, self._sandbox, self._metrics)

    @property
    def requests(self) -> OperatorRequests:
        """``POST /computers/{id}/requests`` as a value, for ``fasthttp``."""
        return self._requests

    def resource(self) -> IResource:
        return _Root(
            self._websocket,
            self.app.resource(),
            _Direct(self._direct_request, self.internal_error),
            self._operator_socket,
        )

    def _direct_request(self, request: IRequest) -> Any:
        # postpath is [traposId, "requests"], each segment already %-decoded.
        try:
            trapos_id = request.postpath[0].decode("utf-8")
        except UnicodeDecodeError:
            return json_error(request, 404, "not_found", "no such computer")
        return self.computer_request(request, trapos_id)

    def client_address(self, request: IRequest) -> object:
        """The request's client: its peer, or a trusted reverse proxy's client (SPEC §4)."""
        return self._admission.client_address(
            request.getClientAddress(),
            _joined(request, b"x-forwarded-for"),
            _joined(request, b"forwarded"),
        )

    def decide(self, request: IRequest, method: bytes, target: bytes) -> Any:
        """
        The decision on a request from its head alone (``GatewayRequest``),
        before its body is read: ``PUBLIC`` for no operator route; for one,
        the ``auth.Operator`` or the ``Answer`` refusing it (``_admit``), or
        ``ASK`` for an ask's own token on ``/mcp``.
        """
        route = operator_route(method, target)
        if route is None:
            return PUBLIC
        if route == "mcp" and self._ask_scope(request) is not None:
            if not json_content(request.getHeader(b"content-type")):
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

    @app.route("/health", methods=["GET"])
    def health(self, request: IRequest):
        d = self._probe.check()
        d.addCallback(self._health_body, request)
        return d

    def _health_body(self, result: ProbeResult, request: IRequest) -> bytes:
        body = result.to_payload()
        body["computers"] = len(self._registry)
        if self._cluster is not None:
            body.update(self._cluster.health(len(self._registry)))
        body["version"] = __version__
        return json_body(request, body)

    @app.route("/client/install.lua", methods=["GET"])
    def client_installer(self, request: IRequest) -> bytes:
        body = client.installer(request.getHeader(b"host"), request.isSecure())
        if body is None:
            return json_error(request, 400, "bad_request", "the Host header is not host[:port]")
        return _lua(request, body)

    @app.route("/client/<path:name>", methods=["GET"])
    def client_file(self, request: IRequest, name: str) -> bytes:
        body = client.read(name)
        if body is None:
            return json_error(request, 404, "not_found", f'no client file "{wire.cut(name)}"')
        return _lua(request, body)

    @app.route("/computers", methods=["GET"])
    @operators_only
    def computers(self, request: IRequest, operator: auth.Operator) -> bytes:
        scope = operator.scope(_asked_account(request))
        sessions = sorted(
            self._registry.of_account(scope), key=lambda s: (s.account_id, s.trapos_id)
        )
        listed = [describe_session(session) for session in sessions]
        if self._cluster is not None:
            d = self._cluster.computers(listed)
            return d.addCallback(lambda body: json_body(request, _in_scope(body, scope)))
        return json_body(request, {"computers": listed})

    # ``path``: a label may hold a "/" (sent as %2F, which Twisted decodes).
    @app.route("/computers/<path:trapos_id>/requests", methods=["POST"])
    def computer_request(self, request: IRequest, trapos_id: str):
        try:
            body: bytes | BadBody = _take_body(request)
        except BadBody as error:
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

    def _sandbox_body(self, request: IRequest, shape: str) -> dict[str, Any]:
        return json_object(_take_body(request), shape)

    @app.route("/computers/<path:trapos_id>/execute", methods=["POST"])
    @on_computer(sandbox_error)
    def execute(self, request: IRequest, trapos_id: str, account_id: str):
        try:
            body = self._sandbox_body(request, _EXECUTE)
            command = _string(body, "command")
            args = _strings(body, "args")
            cwd = _string(body, "cwd", required=False)
            timeout_ms = _number(body, "timeoutMs", MAX_REQUEST_TIMEOUT_MS)
            max_output = _number(body, "maxOutputBytes", limits.MAX_OUTPUT_BYTES, integer=True)
        except BadBody as error:
            return sandbox_error(request, error.status, error.code, str(error))
        stream = _OutputStream(request)
        d = self._sandbox.execute(
            trapos_id,
            command,
            args,
            cwd,
            timeout_ms,
            max_output,
            on_output=stream.output,
            account_id=account_id,
        )
        if not d.called:
            stream.begin()  # it went out: from now on, failures are lines of the stream
        d.addCallbacks(stream.result, stream.failed)
        return d

    @app.route("/computers/<path:trapos_id>/eval", methods=["POST"])
    @on_computer(sandbox_error)
    def eval(self, request: IRequest, trapos_id: str, account_id: str):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.eval(
                trapos_id,
                _string(body, "code"),
                _number(body, "timeoutMs", MAX_REQUEST_TIMEOUT_MS),
                _number(body, "maxOutputBytes", limits.MAX_OUTPUT_BYTES, integer=True),
                account_id=account_id,
            )

        # The answer has its own ok: false when the code failed, and is still a 200.
        return self._sandbox_call(request, '{"code", "timeoutMs"?}', call, ok=False)

    @app.route("/computers/<path:trapos_id>/read-file", methods=["POST"])
    @on_computer(sandbox_error)
    def read_file(self, request: IRequest, trapos_id: str, account_id: str):
        def call(body: dict[str, Any]) -> Deferred:
            _base64(body)
            offset = body.get("offset", 0)
            if type(offset) is not int or offset < 0:
                raise BadBody("offset must be a whole number of bytes, 0 or more")
            length = _number(body, "length", limits.MAX_FILE_BYTES, integer=True)
            return self._sandbox.read_file(
                trapos_id, _string(body, "path"), offset, length, account_id=account_id
            ).addCallback(_encoded)

        return self._sandbox_call(request, '{"path", "offset"?, "length"?}', call)

    @app.route("/computers/<path:trapos_id>/write-file", methods=["POST"])
    @on_computer(sandbox_error)
    def write_file(self, request: IRequest, trapos_id: str, account_id: str):
        def call(body: dict[str, Any]) -> Deferred:
            path = _string(body, "path")
            _base64(body)
            content = body.get("content")
            try:
                if type(content) is not str:
                    raise ValueError
                data = base64.b64decode(content, validate=True)
            except (ValueError, binascii.Error):
                raise BadBody("content must be the file's bytes in base64") from None
            return self._sandbox.write_file(trapos_id, path, data, account_id=account_id)

        return self._sandbox_call(request, '{"path", "content", "encoding": "base64"}', call)

    @app.route("/computers/<path:trapos_id>/list-files", methods=["POST"])
    @on_computer(sandbox_error)
    def list_files(self, request: IRequest, trapos_id: str, account_id: str):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.list_files(trapos_id, _string(body, "path"), account_id=account_id)

        return self._sandbox_call(request, '{"path"}', call)

    @app.route("/computers/<path:trapos_id>/delete-file", methods=["POST"])
    @on_computer(sandbox_error)
    def delete_file(self, request: IRequest, trapos_id: str, account_id: str):
        def call(body: dict[str, Any]) -> Deferred:
            return self._sandbox.delete_file(
                trapos_id, _string(body, "path"), account_id=account_id
            )

        return self._sandbox_call(request, '{"path"}', call)

    @app.route("/computers/<path:trapos_id>/screen", methods=["GET"])
    @on_computer(sandbox_error)
    def screen(self, request: IRequest, trapos_id: str, account_id: str):
        d = self._sandbox.screen(trapos_id, account_id=account_id)
        d.addCallbacks(_ok_body, _sandbox_failed, (request,), None, (request,))
        return d

    def _sandbox_call(
        self,
        request: IRequest,
        shape: str,
        call: Callable[[dict[str, Any]], Deferred],
        ok: bool = True,
    ):
        try:
            d = call(self._sandbox_body(request, shape))
        except BadBody as error:
            return sandbox_error(request, error.status, error.code, str(error))
        except GatewayError:
            return _sandbox_failed(Failure(), request)
        d.addCallbacks(
            _ok_body if ok else _plain_body, _sandbox_failed, (request,), None, (request,)
        )
        return d

    # -- MCP (SPEC §10) ----------------------------------------------------------------------

    @app.route("/mcp", methods=["POST"])
    def mcp(self, request: IRequest):
        # An ask's own token (SPEC §11) reaches the asking computer only. Any other
        # caller must be an operator: an account token's tools reach its computers
        # only; the admin's every account's, or one account's with /mcp?account=NAME.
        pin = self._ask_scope(request)
        scope = None
        if pin is not None and not json_content(request.getHeader(b"content-type")):
            return write_answer(request, UNSUPPORTED_MEDIA_TYPE)
        if pin is None:
            operator = self._operator(request)
            if not isinstance(operator, auth.Operator):
                return operator
            scope = operator.scope(_asked_account(request))
        try:
            body = _take_body(request)
        except BadBody as error:
            return self._mcp.post(request, None, str(error), scope=scope, pin=pin)
        return self._mcp.post(request, body, scope=scope, pin=pin)

    @app.route("/mcp", methods=["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
    def mcp_other(self, request: IRequest) -> bytes:
        # No server-to-client stream (GET) and no sessions to end (DELETE).
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
