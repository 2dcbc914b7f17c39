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

  On one computer (``sandboxroutes``), operators:
    /computers/<traposId>/execute, eval, read-file, write-file, list-files, delete-file,
      screen, input, screen/stream (SPEC §9), snapshots (§15), peripherals, turtle (§16)
  MCP (``mcproutes``): /mcp, its other methods and a legacy client's GET stream.

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
account in one place (``routing.on_computer``); the admin may add
``?account=NAME``.  ``/metrics`` is the admin's alone.  Every answer, errors
included, is JSON (``{ok: false, error: {code, message}}``), never an HTML
traceback page: Klein's own errors too (``http_error``, ``_TextOnly``).

One router (``routing.router``): every path, the WebSockets' included, is a Klein route,
of this class or of a route class it is made of.  Bodies
are checked by ``validation`` and answers written by ``answers``; the app
builds nothing (``trapsandbox.tap`` gives it its parts).
"""

from __future__ import annotations

from typing import Any

from prometheus_client.exposition import choose_encoder
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from werkzeug.exceptions import HTTPException, NotFound

from trapsandbox import __version__, errors
from trapsandbox.admission import auth
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.opencode.asks import Asks
from trapsandbox.opencode.probe import OpencodeProbe, ProbeResult
from trapsandbox.ops.metrics import Metrics
from trapsandbox.web import client, console
from trapsandbox.web.answers import (
    json_body,
    json_error,
    write_answer,
)
from trapsandbox.web.mcproutes import McpRoutes
from trapsandbox.web.operator import (
    NO_SUCH_COMPUTER,
    UNSUPPORTED_MEDIA_TYPE,
    Answer,
    OperatorRequests,
    in_scope,
    json_content,
)
from trapsandbox.web.routing import asked_account, operators_only, router
from trapsandbox.web.sandboxroutes import SandboxRoutes
from trapsandbox.web.site import ASK, PUBLIC, operator_route
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


def _joined(request: IRequest, name: bytes) -> str | None:
    """All of a request's ``name`` header lines as one comma-separated list, or None."""
    values = request.requestHeaders.getRawHeaders(name)
    if not values:
        return None
    return ", ".join(value.decode("latin-1") for value in values)


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


class GatewayApp(SandboxRoutes, McpRoutes):
    """
    The HTTP routes of the port, and the decision on a request from its
    head (``decide``).  Given every part it serves; builds none.  The routes on one
    computer are ``SandboxRoutes``'s, those of ``/mcp`` ``McpRoutes``'s: one router.
    """

    app = router

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
        asked = asked_account(request)
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
            asked_account(request),
            body,
            admitted=operator,
        )
        if isinstance(answer, Answer):
            return write_answer(request, answer)
        return answer.addCallback(lambda done: write_answer(request, done))

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
