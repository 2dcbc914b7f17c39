"""
The HTTP side, on the same port as the WebSocket: a Klein app.

    GET  /health                          open: {sandboxOk, opencodeOk, opencodeDetail?,
                                                 computers, version}
    /gateway                              the WebSocket endpoint for computers (routed
                                          ahead of Klein, by ``_Root``)
    GET  /client/install.lua              open: the one-line installer for a computer
    GET  /client/<dir>/<file>             open: the Lua client files it downloads
    GET  /computers                       operators: {computers: [{traposId, accountId, peer,
                                                 connectedSince, version, inFlight}]}
    POST /computers/<traposId>/requests   operators: {type, payload?, timeoutMs?}
                                                 -> the computer's {ok, payload?, error?}
    GET  /metrics                         operators: Prometheus text format

Operators present ``Authorization: Bearer <SANDBOX_ADMIN_TOKEN>``; with no
token configured only loopback clients are served.  Every answer, errors
included, is JSON (``{ok: false, error: {code, message}}``), never an HTML
traceback page.
"""

from __future__ import annotations

import functools
import io
import math
from datetime import UTC, datetime
from typing import Any

import orjson
from klein import Klein
from prometheus_client.exposition import choose_encoder
from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from twisted.web.server import Site
from werkzeug.exceptions import HTTPException

from trapsandbox import __version__, auth, client, limits, wire
from trapsandbox.limits import MAX_BODY_BYTES, MAX_REQUEST_TIMEOUT_MS
from trapsandbox.metrics import Metrics
from trapsandbox.probe import OpencodeProbe, ProbeResult
from trapsandbox.registry import Registry
from trapsandbox.wire import GatewayError

# The HTTP status for each way a request to a computer can fail.
STATUS_OF_ERROR = {
    wire.BAD_REQUEST: 400,
    wire.NOT_CONNECTED: 404,
    wire.TOO_LARGE: 413,
    wire.OVERLOADED: 503,
    wire.TIMEOUT: 504,
}

log = Logger()


def json_body(request: IRequest, body: Any, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return orjson.dumps(body)


def json_error(request: IRequest, code: int, error: str, message: str) -> bytes:
    return json_body(request, {"ok": False, "error": {"code": error, "message": message}}, code)


def _lua(request: IRequest, body: bytes) -> bytes:
    request.setHeader(b"content-type", b"text/x-lua; charset=utf-8")
    request.setHeader(b"cache-control", b"no-store")
    return body


def operators_only(route):
    """Serve ``route`` only to an operator: the bearer token, or loopback when there is none."""

    @functools.wraps(route)
    def guarded(self: GatewayApp, request: IRequest, *args: Any, **kwargs: Any):
        refusal = self._refuse(request)
        if refusal is not None:
            return refusal
        return route(self, request, *args, **kwargs)

    return guarded


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


class GatewaySite(Site):
    """A ``Site`` that never spools a large request body to memory or disk."""

    displayTracebacks = False

    def __init__(self, resource: IResource, timeout: float = limits.HTTP_IDLE_TIMEOUT) -> None:
        # No route reads form fields: skip parsing every POST's content type
        # for them (a quarter of an operator request's CPU).
        super().__init__(resource, timeout=timeout, parsePOSTFormSubmission=False)

    def getContentFile(self, length: int | None) -> _CappedContent:
        return _CappedContent(MAX_BODY_BYTES, length is not None and length > MAX_BODY_BYTES)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class _BadBody(ValueError):
    pass


def _parse_request_body(body: bytes) -> tuple[str, dict[str, Any], float | None]:
    """``(type, payload, timeout in seconds or None)``; raises ``_BadBody``."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise _BadBody(f"the body is not JSON: {error}") from None
    if type(obj) is not dict:
        raise _BadBody('the body must be a JSON object: {"type", "payload"?, "timeoutMs"?}')
    kind = obj.get("type")
    if type(kind) is not str or not 0 < len(kind) <= limits.MAX_TYPE_LENGTH:
        raise _BadBody(f"type must be a string of 1 to {limits.MAX_TYPE_LENGTH} characters")
    payload = obj.get("payload")
    if payload is None:
        payload = {}
    elif type(payload) is not dict:
        raise _BadBody("payload must be a JSON object")
    timeout = obj.get("timeoutMs")
    if timeout is not None:
        if (
            type(timeout) not in (int, float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_REQUEST_TIMEOUT_MS
        ):
            raise _BadBody(
                f"timeoutMs must be a number of milliseconds, 1 to {MAX_REQUEST_TIMEOUT_MS}"
            )
        timeout = timeout / 1000
    return kind, payload, timeout


class _Root(Resource):
    """
    Sends ``/gateway`` straight to the WebSocket and everything else to
    Klein: every computer's connect would otherwise pay for Klein's routing.
    """

    def __init__(self, websocket: IResource, app: IResource) -> None:
        super().__init__()
        self._websocket = websocket
        self._app = app

    def getChildWithDefault(self, name: bytes, request: IRequest) -> IResource:
        if name == b"gateway" and not request.postpath:
            return self._websocket
        # Klein routes on the whole path: give it back the segment just taken.
        request.postpath.insert(0, request.prepath.pop())
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
    ) -> None:
        self._registry = registry
        self._probe = probe
        self._websocket = websocket
        self._metrics = registry.metrics if metrics is None else metrics
        self._admission = auth.Admission(registry.clock) if admission is None else admission

    def resource(self) -> IResource:
        return _Root(self._websocket, self.app.resource())

    def _refuse(self, request: IRequest) -> bytes | None:
        """The error answer for a request that is not from an operator, or None."""
        refusal = self._admission.operator(
            request.getClientAddress(), request.getHeader(b"authorization")
        )
        if refusal is None:
            return None
        if refusal.reason == auth.NOT_LOOPBACK:
            return json_error(request, 403, "forbidden", refusal.message)
        if refusal.reason == auth.THROTTLED:
            request.setHeader(b"retry-after", b"%d" % math.ceil(refusal.wait))
            return json_error(request, 429, "too_many_requests", refusal.message)
        request.setHeader(b"www-authenticate", b'Bearer realm="trapsandbox"')
        return json_error(request, 401, "unauthorized", refusal.message)

    @app.route("/health", methods=["GET"])
    def health(self, request: IRequest):
        d = self._probe.check()
        d.addCallback(self._health_body, request)
        return d

    def _health_body(self, result: ProbeResult, request: IRequest) -> bytes:
        body = result.to_payload()
        body["computers"] = len(self._registry)
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
            return json_error(request, 404, "not_found", f"no client file {name!r}")
        return _lua(request, body)

    @app.route("/computers", methods=["GET"])
    @operators_only
    def computers(self, request: IRequest) -> bytes:
        sessions = sorted(self._registry, key=lambda s: (s.account_id, s.trapos_id))
        listed = [
            {
                "traposId": session.trapos_id,
                "accountId": session.account_id,
                "peer": session.peer,
                "connectedSince": _iso(session.connected_at),
                "version": session.version,
                "inFlight": session.in_flight,
            }
            for session in sessions
        ]
        return json_body(request, {"computers": listed})

    # ``path``: a label may hold a "/" (sent as %2F, which Twisted decodes).
    @app.route("/computers/<path:trapos_id>/requests", methods=["POST"])
    @operators_only
    def computer_request(self, request: IRequest, trapos_id: str):
        body = request.content.read(MAX_BODY_BYTES + 1)
        if getattr(request.content, "over_limit", False) or len(body) > MAX_BODY_BYTES:
            return json_error(
                request, 413, wire.TOO_LARGE, f"the body is over {MAX_BODY_BYTES} bytes"
            )
        # The request object lives until the computer answers: keep no copy of
        # a body that may be a megabyte.
        request.content.close()
        request.content = io.BytesIO()
        try:
            kind, payload, timeout = _parse_request_body(body)
        except _BadBody as error:
            return json_error(request, 400, wire.BAD_REQUEST, str(error))
        d = self._registry.request(trapos_id, kind, payload, timeout)
        d.addCallbacks(self._answered, self._failed, (request,), None, (request,))
        return d

    def _answered(self, response: wire.ComputerResponse, request: IRequest) -> bytes:
        body: dict[str, Any] = {"ok": response.ok}
        if response.payload is not None:
            body["payload"] = response.payload
        if response.error is not None:
            body["error"] = {"code": response.error.code, "message": response.error.message}
        try:
            return json_body(request, body)
        except orjson.JSONEncodeError as error:
            # orjson reads deeper nesting (1024) than it writes (254).
            return json_error(
                request, 502, wire.INTERNAL, f"the computer's answer cannot be relayed: {error}"
            )

    def _failed(self, failure: Failure, request: IRequest) -> bytes | Failure:
        if failure.check(CancelledError):
            return failure  # the HTTP client went away; nobody to answer
        if failure.check(GatewayError):
            error = failure.value
            status = STATUS_OF_ERROR.get(error.code, 500)
            return json_error(request, status, error.code, error.message)
        return failure

    @app.route("/metrics", methods=["GET"])
    @operators_only
    def metrics(self, request: IRequest) -> bytes:
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
        log.failure("{method} {uri} failed", failure, method=request.method, uri=request.uri)
        return json_error(request, 500, "internal", "the gateway failed to handle this request")
