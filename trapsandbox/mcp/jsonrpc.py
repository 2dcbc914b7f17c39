"""
JSON-RPC 2.0 over MCP's Streamable HTTP transport (SPEC §10): one message per
``POST /mcp``, and the HTTP answer it gets.

    a request        -> 200 application/json: its response (result or error)
    a notification   -> 202, no body (opencode sends notifications/cancelled
                        after every call: accepted quietly)
    a response       -> 202, no body (this server sends no requests)
    not JSON         -> 400 {jsonrpc, id: null, error: -32700}
    a batch (array)  -> 400 -32600: batching was removed from MCP in
                        2025-06-18, and no client we serve sends one
    not a message    -> 400 -32600 (not an object, bad jsonrpc/id/method)
    too large        -> 413 -32600
    an unsupported MCP-Protocol-Version header -> 400 -32600

What a method means is not decided here: ``answer`` hands a request's method
and params to the caller's ``Methods`` and writes what it returns, or the
``Invalid`` it raises, as the response.  This module is the one place a
response is written, so a response that becomes an event stream (SSE, for
progress) changes here alone.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

log = Logger()

# Newest last: what ``initialize`` answers a client asking for another.
PROTOCOL_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST = PROTOCOL_VERSIONS[-1]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

_MAX_INT_ID = 2**63

# A request's method and params in, its result out (or ``Invalid``).
Methods = Callable[[str, dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]


class Invalid(Exception):
    """A JSON-RPC error for one message: code, message, HTTP status."""

    def __init__(self, code: int, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def answer(
    request: IRequest, body: bytes | None, too_large: str | None, methods: Methods
) -> bytes | Deferred:
    """
    The HTTP answer to one POSTed ``body`` (None and ``too_large``: it was
    refused for its size), a request's result coming from ``methods``.
    """
    if body is None:
        return reply(request, error(None, INVALID_REQUEST, too_large or "too large"), 413)
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as failure:
        return reply(request, error(None, PARSE_ERROR, f"the body is not JSON: {failure}"), 400)
    try:
        return _message(request, message, methods)
    except Invalid as invalid:
        return reply(request, error(None, invalid.code, invalid.message), invalid.status)


def _message(request: IRequest, message: Any, methods: Methods) -> bytes | Deferred:
    if type(message) is list:
        raise Invalid(
            INVALID_REQUEST,
            "JSON-RPC batches are not supported (MCP removed them in 2025-06-18): "
            "send one message per POST",
            400,
        )
    if type(message) is not dict:
        raise Invalid(INVALID_REQUEST, "a JSON-RPC message must be a JSON object", 400)
    if message.get("jsonrpc") != "2.0":
        raise Invalid(INVALID_REQUEST, 'jsonrpc must be "2.0"', 400)
    method = message.get("method")
    if "method" not in message:
        if "id" in message and ("result" in message or "error" in message):
            return _accepted(request)  # a response: we never ask, so nothing waits for it
        raise Invalid(INVALID_REQUEST, "a JSON-RPC request needs a method", 400)
    if type(method) is not str:
        raise Invalid(INVALID_REQUEST, "method must be a string", 400)
    if "id" not in message:
        return _accepted(request)  # notifications/initialized, cancelled, …: nothing to say
    id = message["id"]
    if not (type(id) is str or (type(id) is int and -_MAX_INT_ID <= id < _MAX_INT_ID)):
        raise Invalid(INVALID_REQUEST, "id must be a string or an integer", 400)
    version = request.getHeader(b"mcp-protocol-version")
    if (
        method != "initialize"
        and version is not None
        and version.decode("latin-1") not in PROTOCOL_VERSIONS
    ):
        raise Invalid(
            INVALID_REQUEST,
            "unsupported MCP-Protocol-Version; this server speaks " + ", ".join(PROTOCOL_VERSIONS),
            400,
        )
    params = message.get("params")
    if params is None:
        params = {}
    elif type(params) is not dict:
        return reply(request, error(id, INVALID_PARAMS, "params must be an object"))
    d = Deferred.fromCoroutine(methods(method, params))
    d.addCallback(lambda result: reply(request, {"jsonrpc": "2.0", "id": id, "result": result}))
    d.addErrback(_failed, request, id)
    return d


def _failed(failure: Failure, request: IRequest, id: Any) -> bytes | Failure:
    if failure.check(Invalid):
        return reply(request, error(id, failure.value.code, failure.value.message))
    if failure.check(CancelledError):
        return failure  # the client went away: nobody to answer
    log.failure("MCP request failed", failure)
    return reply(request, error(id, INTERNAL_ERROR, "the gateway failed on this request"))


def error(id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}


def _accepted(request: IRequest) -> bytes:
    request.setResponseCode(202)
    return b""


def reply(request: IRequest, message: dict[str, Any], status: int = 200) -> bytes:
    """``message`` as the JSON body of the answer, with ``status``."""
    try:
        body = orjson.dumps(message)
    except orjson.JSONEncodeError:
        # A computer's answer too deep for orjson to write (it reads deeper than it writes):
        # the text is all a model needs.
        result = message.get("result")
        if isinstance(result, dict) and "structuredContent" in result:
            result = {k: v for k, v in result.items() if k != "structuredContent"}
            return reply(request, {**message, "result": result}, status)
        body = orjson.dumps(error(message.get("id"), INTERNAL_ERROR, "the answer cannot be sent"))
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return body
