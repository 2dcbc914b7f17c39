"""
JSON-RPC 2.0 over MCP's Streamable HTTP transport (SPEC §10): one message per
``POST /mcp``, and the HTTP answer it gets.

    a request        -> 200 application/json: its response (result or error);
                        a request with progress or log lines to send, from a
                        client that accepts text/event-stream: 200 SSE, those
                        notifications then its response (``stream``)
    a notification   -> 202, no body; notifications/cancelled ends the call it
                        names, if it is still running (opencode sends one
                        after every call: those name nothing and are ignored)
    a response       -> 202, no body (this server sends no requests)
    not JSON         -> 400 {jsonrpc, id: null, error: -32700}
    a batch (array)  -> 400 -32600: batching was removed from MCP in
                        2025-06-18, and no client we serve sends one
    not a message    -> 400 -32600 (not an object, bad jsonrpc/id/method)
    too large        -> 413 -32600
    an unsupported MCP-Protocol-Version header -> 400 -32600
    a modern (2026-07-28) request the envelope refuses -> 400 (``revision``)

An error answer carries the request's id whenever it could be read (a
message that is an object with a string or integer id), else null.

Which revision a request speaks is ``revision``'s to say; what a method
means is not decided here either: ``answer`` hands a request's method and
params to the caller's ``Methods`` (with the ``Call`` it answers: its id,
its revision and, when the client takes them, where progress and log lines
go) and writes what it returns, dressed by its revision, or the ``Invalid``
it raises, as the response.  This module is the one place a response is
written.

Cancellation (SPEC §17).  Request ids are unique per client connection only
(opencode's two MCP connections both use id 2 at once), so the calls running
are kept by caller (its credential, hashed by the endpoint), ``Mcp-Session-Id``
(issued at ``initialize``: one per client connection) and id.  A cancelled
call's Deferred is cancelled, which cancels its request to the computer (the
registry sends ``cancel``; in cluster mode the relay does); its answer is no
response (202, or the end of its event stream), as MCP says.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine, Hashable
from typing import Any

import attrs
import orjson
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from trapsandbox.computers.wire import cut
from trapsandbox.mcp import revision as revisions
from trapsandbox.mcp.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Invalid,
)
from trapsandbox.mcp.logs import Levels, at_least
from trapsandbox.mcp.revision import LEGACY_REVISION, Revision
from trapsandbox.mcp.stream import EventStream, accepts_events, event

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "Invalid",
]

log = Logger()

# The legacy revisions, newest last (``revision.LEGACY``).
PROTOCOL_VERSIONS = revisions.LEGACY
LATEST = revisions.LATEST_LEGACY

_MAX_INT_ID = 2**63


# A progress report: how far (it must grow from one to the next), of how much, and a line.
Progress = Callable[[float, "float | None", "str | None"], None]


@attrs.define(eq=False)
class Call:
    """
    One request being answered: its id, its revision, where its progress goes
    (None: nowhere), and from which level its log lines go (None: none do).
    """

    id: Any
    progress: Progress | None = None
    cancelled: bool = False
    revision: Revision = LEGACY_REVISION
    log_level: str | None = None
    stream: EventStream | None = None
    # Who sent it, as far as its cancels and its connection's log level go.
    connection: Hashable = None

    def log(self, level: str, data: Any, logger: str = "trapsandbox") -> None:
        """A ``notifications/message`` on this request's event stream, if it passes the level."""
        if self.log_level is None or self.stream is None or not at_least(level, self.log_level):
            return
        self.stream.send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": level, "logger": logger, "data": data},
            }
        )


# A request's method, params and Call in, its result out (or ``Invalid``).
Methods = Callable[[str, dict[str, Any], Call], Coroutine[Any, Any, dict[str, Any]]]


class Running:
    """The calls being answered, by (caller, Mcp-Session-Id, id): what a cancel can reach."""

    def __init__(self) -> None:
        self._calls: dict[tuple[Hashable, Any, Any], tuple[Call, Deferred]] = {}

    def add(self, key: tuple[Hashable, Any, Any], call: Call, d: Deferred) -> None:
        self._calls[key] = (call, d)

        def ended(result: Any) -> Any:
            if self._calls.get(key, (None,))[0] is call:
                del self._calls[key]
            return result

        d.addBoth(ended)

    def cancel(self, key: tuple[Hashable, Any, Any]) -> bool:
        """Cancel the call ``key`` if it runs; False (quietly) if it does not (any more)."""
        found = self._calls.pop(key, None)
        if found is None:
            return False
        call, d = found
        call.cancelled = True
        log.info("MCP request {id} cancelled by its client", id=cut(str(call.id)))
        d.cancel()
        return True

    def __len__(self) -> int:
        return len(self._calls)


def answer(
    request: IRequest,
    body: bytes | None,
    too_large: str | None,
    methods: Methods,
    running: Running | None = None,
    caller: Hashable = None,
    levels: Levels | None = None,
) -> bytes | Deferred:
    """
    The HTTP answer to one POSTed ``body`` (None and ``too_large``: it was
    refused for its size), a request's result coming from ``methods``; the
    calls of ``caller`` (who sent it) are kept in ``running`` while they run,
    and ``levels`` has the log level each legacy connection set.
    """
    if running is None:
        running = Running()
    if levels is None:
        levels = Levels()
    if body is None:
        return reply(request, error(None, INVALID_REQUEST, too_large or "too large"), 413)
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as failure:
        return reply(request, error(None, PARSE_ERROR, f"the body is not JSON: {failure}"), 400)
    try:
        return _message(request, message, methods, running, caller, levels)
    except Invalid as invalid:
        answer = error(_readable_id(message), invalid.code, invalid.message, invalid.data)
        return reply(request, answer, invalid.status)


def _readable_id(message: Any) -> Any:
    """A message's id when it is one a response may carry, else None (JSON null)."""
    if type(message) is not dict:
        return None
    id = message.get("id")
    if type(id) is str or (type(id) is int and -_MAX_INT_ID <= id < _MAX_INT_ID):
        return id
    return None


def _message(
    request: IRequest,
    message: Any,
    methods: Methods,
    running: Running,
    caller: Hashable,
    levels: Levels,
) -> bytes | Deferred:
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
    session = request.getHeader(b"mcp-session-id")
    if "id" not in message:
        if method == "notifications/cancelled":
            params = message.get("params")
            if type(params) is dict and "requestId" in params:
                running.cancel((caller, session, _key_of(params["requestId"])))
        return _accepted(request)  # notifications/initialized, …: nothing to say
    id = _readable_id(message)
    if id is None:
        raise Invalid(INVALID_REQUEST, "id must be a string or an integer", 400)
    params = message.get("params")
    if params is None:
        params = {}
    elif type(params) is not dict:
        return reply(request, error(id, INVALID_PARAMS, "params must be an object"))
    revision = revisions.choose(request, method, params)
    if revision is None:
        raise Invalid(
            INVALID_REQUEST,
            "unsupported MCP-Protocol-Version; this server speaks "
            + ", ".join(revisions.SUPPORTED),
            400,
        )
    if revision.modern:
        session = None  # 2026-07-28 has no sessions: an Mcp-Session-Id is ignored
    connection = (caller, session)
    stream = EventStream(request)
    events = accepts_events(request)
    call = Call(
        id,
        _progress(params, stream) if events else None,
        revision=revision,
        log_level=revision.log_level if revision.modern else levels.get(connection),
        stream=stream if events else None,
        connection=connection,
    )
    if method == "initialize" and not revision.modern:
        # One per client connection: what tells two connections' same ids apart (a cancel's).
        request.setHeader(b"mcp-session-id", uuid.uuid4().hex.encode())
    d = Deferred.fromCoroutine(methods(method, params, call))
    running.add((caller, session, _key_of(id)), call, d)
    d.addCallback(
        lambda result: _last(
            request,
            stream,
            {"jsonrpc": "2.0", "id": id, "result": revisions.decorate(revision, method, result)},
        )
    )
    d.addErrback(_failed, request, stream, call)
    return d


def _key_of(id: Any) -> Any:
    # 2 and 2.0 are one id in JSON; True is not 1.
    return ("bool", id) if type(id) is bool else id


def _progress(params: dict[str, Any], stream: EventStream) -> Progress | None:
    """Where a request's progress goes (it takes events): SSE notifications, if it asked."""
    meta = params.get("_meta")
    token = meta.get("progressToken") if type(meta) is dict else None
    if not (type(token) is str or type(token) is int):
        return None

    def progress(value: float, total: float | None, message: str | None) -> None:
        note: dict[str, Any] = {"progressToken": token, "progress": value}
        if total is not None:
            note["total"] = total
        if message:
            note["message"] = message
        stream.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": note})

    return progress


def _last(
    request: IRequest, stream: EventStream, message: dict[str, Any], status: int = 200
) -> bytes:
    """The response: the stream's last event once it has opened, else the JSON answer."""
    stream.end()
    if not stream.opened:
        return reply(request, message, status)
    return event(_encoded(message))


def _failed(failure: Failure, request: IRequest, stream: EventStream, call: Call) -> Any:
    id = call.id
    if failure.check(Invalid):
        invalid = failure.value
        status = invalid.status if invalid.status != 200 else call.revision.status(invalid.code)
        answer = error(id, invalid.code, invalid.message, invalid.data)
        return _last(request, stream, answer, status)
    if failure.check(CancelledError):
        stream.end()
        if call.cancelled:
            # The client cancelled it: MCP wants no response; the HTTP answer still ends.
            return b"" if stream.opened else _accepted(request)
        return failure  # the client went away: nobody to answer
    log.failure("MCP request failed", failure)
    return _last(request, stream, error(id, INTERNAL_ERROR, "the gateway failed on this request"))


def error(id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": id, "error": body}


def _accepted(request: IRequest) -> bytes:
    request.setResponseCode(202)
    return b""


def _encoded(message: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(message)
    except orjson.JSONEncodeError:
        # A computer's answer too deep for orjson to write (it reads deeper than it writes):
        # the text is all a model needs.
        result = message.get("result")
        if isinstance(result, dict) and "structuredContent" in result:
            result = {k: v for k, v in result.items() if k != "structuredContent"}
            return _encoded({**message, "result": result})
        return orjson.dumps(error(message.get("id"), INTERNAL_ERROR, "the answer cannot be sent"))


def reply(request: IRequest, message: dict[str, Any], status: int = 200) -> bytes:
    """``message`` as the JSON body of the answer, with ``status``."""
    body = _encoded(message)
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return body
