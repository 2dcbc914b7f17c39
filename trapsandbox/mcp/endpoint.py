"""
MCP on the gateway (SPEC §10, §17): opencode's agent, or any MCP client, drives
the connected computers as tools.

A small MCP server over JSON-RPC 2.0 and Streamable HTTP (``jsonrpc``), in the
gateway's own process and reactor (the ``mcp`` SDK's server would bring a
second HTTP stack beside twisted.web).  ``GatewayApp`` routes ``POST /mcp``
here behind the operator rules of §4 (a browser's request, a stranger's, or
not application/json: refused before it gets here, by
``OperatorRequests.admit``); ``GET /mcp`` too, which streams a legacy client
connection's resource updates once it has subscriptions (else 405, Allow:
POST, as for PUT and the rest).

Which revision a request speaks, and which methods it may call, is
``revision``'s (the legacy ``initialize``, ``ping`` and ``logging/setLevel``;
2026-07-28's ``server/discover`` and ``subscriptions/listen``); the rest serve
both: ``tools/list`` (``schemas``), ``tools/call``, ``resources/list``,
``resources/templates/list``, ``resources/read`` (``resources``),
``resources/subscribe`` and ``/unsubscribe`` (``subscriptions``),
``prompts/list`` and ``/get`` (``prompts``), ``completion/complete``
(``completion``); anything else is -32601.  No session state is needed: the
``Mcp-Session-Id`` a legacy ``initialize`` gets only tells a client
connection's request ids from another's (``notifications/cancelled``), its log
level and its subscriptions.  A call whose client takes progress may run for
its own ``timeoutSeconds`` (``tools``), its progress and log lines sent as it
goes (``stream``, ``logs``).

``tools/call`` errors follow the 2025-11-25 split (SEP-1303): an unknown tool
or params that are not ``{name, arguments?}`` are -32602; arguments a tool
cannot use, and every failure on the computer's side (forbidden, not
connected, timeout, fs_error, an ambiguous ``computer``), are tool results
with ``isError: true`` whose text tells the model what to do (``results``),
so it can correct itself (and a client that set a log level hears it as an
``error`` line too).  Each call is counted and logged here, whatever its
outcome: which computer (``resolve``), then the tool (``tools``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.iweb import IRequest

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.session import Session
from trapsandbox.errors import GatewayError
from trapsandbox.mcp import jsonrpc, prompts, revision
from trapsandbox.mcp.completion import Completions
from trapsandbox.mcp.errors import INVALID_PARAMS, METHOD_NOT_FOUND, Invalid
from trapsandbox.mcp.jsonrpc import Call
from trapsandbox.mcp.logs import LEVELS, Levels
from trapsandbox.mcp.resolve import computers, pinned, resolve
from trapsandbox.mcp.resources import TEMPLATES, Resources
from trapsandbox.mcp.results import OUTCOMES, failed
from trapsandbox.mcp.schemas import TOOL_NAMES, TOOLS
from trapsandbox.mcp.stream import EventStream
from trapsandbox.mcp.subscriptions import KEEPALIVE_SECONDS, Subscriptions
from trapsandbox.mcp.tools import Tools, list_computers
from trapsandbox.ops.metrics import Metrics
from trapsandbox.snapshots.askhook import CHANGING

log = Logger()


class McpEndpoint:
    """The ``/mcp`` endpoint's MCP methods; ``post`` answers one HTTP request."""

    def __init__(
        self,
        registry: Registry,
        sandbox: Sandbox,
        metrics: Metrics,
        clock: IReactorTime | None = None,
        before_change: Callable[[Session], Deferred[None]] | None = None,
    ) -> None:
        """
        ``before_change``: what a tool that changes files waits on when called with an
        ask's token (``Asks.before_change``: the snapshot before the ask's first change).
        """
        self._registry = registry
        self._before_change = before_change
        self._metrics = metrics
        metrics.mcp_labels(TOOL_NAMES, OUTCOMES)
        self._clock = registry.clock if clock is None else clock
        self._tools = Tools(sandbox, self._clock)
        self._resources = Resources(registry, sandbox)
        self._completions = Completions(registry, sandbox)
        self.subscriptions = Subscriptions(registry, sandbox, self._clock)
        self.running = jsonrpc.Running()
        self.levels = Levels()

    def post(
        self,
        request: IRequest,
        body: bytes | None,
        too_large: str | None,
        caller: Caller,
    ):
        """
        The answer to ``POST /mcp`` with ``body`` (None and ``too_large``: it was
        refused); the tools reach the computers of ``caller``'s account (None:
        every account's), or, for one aimed at a computer (an ask's token), that
        computer only, whatever ``computer`` says.
        """
        return jsonrpc.answer(
            request,
            body,
            too_large,
            lambda method, params, call: self._method(method, params, call, caller),
            self.running,
            _caller(request),
            self.levels,
        )

    def get(self, request: IRequest) -> Deferred | None:
        """
        ``GET /mcp``: a legacy client connection's stream of its resource updates
        (``resources/subscribe``), open until it closes it; None (a 405) for a
        connection without subscriptions, as for every client before them.
        """
        connection = (_caller(request), request.getHeader(b"mcp-session-id"))
        if not self.subscriptions.subscribed(connection):
            return None
        stream = EventStream(request)
        d: Deferred[bytes] = Deferred(lambda _: closed())

        def closed() -> None:
            stop_keepalive()
            detach()
            stream.end()

        def end(*_: object) -> None:
            # A newer GET of the connection, or a reader that stopped reading: ended here.
            if not d.called:
                closed()
                d.callback(b"")

        detach = self.subscriptions.attach(connection, stream.send, end)
        stream.open(b": subscribed\n\n")  # the head goes out now, not with the first update
        stop_keepalive = stream.keep_alive(self._clock, KEEPALIVE_SECONDS)
        stream.stalled.addCallback(end)
        return d

    async def _method(
        self,
        method: str,
        params: dict[str, Any],
        call: Call,
        caller: Caller,
    ) -> dict[str, Any]:
        if not call.revision.allows(method):
            era = "2026-07-28" if call.revision.modern else call.revision.version
            raise Invalid(METHOD_NOT_FOUND, f'no method "{wire.cut(method)}" in MCP {era}')
        if method == "initialize":
            return revision.initialize(params)
        if method == "server/discover":
            return revision.discover()
        if method == "ping":
            return {}
        if method == "logging/setLevel":
            return self._set_level(params, call)
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "tools/call":
            return await self._tools_call(params, call, caller)
        if method == "resources/list":
            return await self._resources.list(caller)
        if method == "resources/templates/list":
            return {"resourceTemplates": TEMPLATES}
        if method == "resources/read":
            return await self._resources.read(params, caller, call.revision)
        if method in ("resources/subscribe", "resources/unsubscribe"):
            return await self.subscriptions.legacy(method, params, call, caller)
        if method == "subscriptions/listen":
            return await self.subscriptions.listen(params, call, caller)
        if method == "prompts/list":
            return {"prompts": prompts.PROMPTS}
        if method == "prompts/get":
            return prompts.get(params)
        if method == "completion/complete":
            return await self._completions.complete(params, caller)
        raise Invalid(METHOD_NOT_FOUND, f'no method "{wire.cut(method)}"')

    def _set_level(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        """``logging/setLevel`` (legacy): this client connection's log level from now on."""
        level = params.get("level")
        if level not in LEVELS:
            raise Invalid(INVALID_PARAMS, "level must be one of " + ", ".join(LEVELS))
        self.levels.set(call.connection, level)
        return {}

    async def _tools_call(
        self,
        params: dict[str, Any],
        call: Call,
        caller: Caller,
    ) -> dict[str, Any]:
        name = params.get("name")
        if type(name) is not str:
            raise Invalid(INVALID_PARAMS, "tools/call needs name, a string")
        if name not in TOOL_NAMES:
            raise Invalid(
                INVALID_PARAMS,
                f'no tool "{wire.cut(name)}"; the tools are ' + ", ".join(sorted(TOOL_NAMES)),
            )
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        elif type(arguments) is not dict:
            raise Invalid(INVALID_PARAMS, "arguments must be an object")
        started = self._clock.seconds()
        computer = arguments.get("computer")
        target = wire.cut(computer) if type(computer) is str and computer else "-"
        try:
            if name == "list_computers":
                result, outcome = list_computers(await computers(self._registry, caller)), "ok"
            else:
                if caller.trapos_id is None:
                    found = await computers(self._registry, caller)
                    session = resolve(self._registry, computer, caller.account, found)
                else:
                    session = pinned(self._registry, caller.key)
                    if name in CHANGING and self._before_change is not None:
                        await self._before_change(session)
                target = session.trapos_id
                call.log("info", f"{name} on {target}", "trapsandbox")
                result, outcome = await self._tools.call(
                    name,
                    session,
                    caller.at(session.account_id, session.trapos_id),
                    arguments,
                    call.progress,
                    call.log,
                )
        except GatewayError as error:
            outcome = error.code
            result = failed(error)
            # The refusal and its hint, as the model reads it in the result too.
            call.log("error", {"tool": name, "computer": target, "message": error.message})
        except CancelledError:
            # The client cancelled it (or went away): the run was cancelled on the computer.
            self._counted(name, target, errors.CANCELLED, started)
            raise
        self._counted(name, target, outcome, started)
        return result

    def _counted(self, name: str, target: str, outcome: str, started: float) -> None:
        seconds = self._clock.seconds() - started
        self._metrics.mcp_tool_call(name, outcome, seconds)
        log.info(
            "MCP {tool} on {computer}: {outcome} in {seconds:.3f} s",
            tool=name,
            computer=target,
            outcome=outcome,
            seconds=seconds,
        )


def _caller(request: IRequest) -> bytes:
    """Who sent ``request``, as far as its cancels go: its credential's digest (kept, not it)."""
    return hashlib.sha256(request.getHeader(b"authorization") or b"").digest()
