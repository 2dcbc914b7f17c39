"""
The HTTP side, on the same port as the WebSocket: a Klein app.

    GET /health                 {sandboxOk, opencodeOk, opencodeDetail?, computers, version}
    /gateway                    the WebSocket endpoint for computers
    GET /client/install.lua     the one-line installer for a computer
    GET /client/<dir>/<file>    the Lua client files it downloads

Every answer, errors included, is JSON: never an HTML traceback page.
"""

from __future__ import annotations

from typing import Any

import orjson
from klein import Klein
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from werkzeug.exceptions import HTTPException

from trapsandbox import __version__, client
from trapsandbox.probe import OpencodeProbe, ProbeResult
from trapsandbox.registry import Registry

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


class GatewayApp:
    app = Klein()

    def __init__(self, registry: Registry, probe: OpencodeProbe, websocket: IResource) -> None:
        self._registry = registry
        self._probe = probe
        self._websocket = websocket

    def resource(self) -> IResource:
        return self.app.resource()

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

    @app.route("/gateway")
    def gateway(self, request: IRequest) -> IResource:
        return self._websocket

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

    @app.handle_errors(HTTPException)
    def http_error(self, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        name = (error.name or "error").lower().replace(" ", "_")
        return json_error(request, error.code or 500, name, error.description or error.name)

    @app.handle_errors
    def internal_error(self, request: IRequest, failure: Failure) -> bytes:
        log.failure("{method} {uri} failed", failure, method=request.method, uri=request.uri)
        return json_error(request, 500, "internal", "the gateway failed to handle this request")
