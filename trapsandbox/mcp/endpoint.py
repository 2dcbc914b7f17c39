"""
MCP on the gateway (SPEC §10): opencode's agent, or any MCP client, drives
the connected computers as tools.

A small MCP server over JSON-RPC 2.0 and Streamable HTTP (``jsonrpc``), in the
gateway's own process and reactor (the ``mcp`` SDK's server would bring a
second HTTP stack beside twisted.web).  ``GatewayApp`` routes ``POST /mcp``
here behind the operator rules of §4 (a browser's request, a stranger's, or
not application/json: refused before it gets here, by
``OperatorRequests.admit``); ``GET /mcp`` and the rest are 405, Allow: POST
(no server-to-client stream).

Methods: ``initialize`` (the client's protocol version when we speak it, else
our newest), ``ping``, ``tools/list`` (``schemas``), ``tools/call``,
``resources/list``, ``resources/templates/list``, ``resources/read``
(``resources``); anything else is -32601.  No session state is kept: the
``Mcp-Session-Id`` issued at ``initialize`` only tells a client connection's
request ids from another's, for ``notifications/cancelled`` (``jsonrpc``).
A call whose client takes progress may run for its own ``timeoutSeconds``
(``tools``), its progress sent as it goes (``stream``).

``tools/call`` errors follow the 2025-11-25 split (SEP-1303): an unknown tool
or params that are not ``{name, arguments?}`` are -32602; arguments a tool
cannot use, and every failure on the computer's side (forbidden, not
connected, timeout, fs_error, an ambiguous ``computer``), are tool results
with ``isError: true`` whose text tells the model what to do (``results``),
so it can correct itself.  Each call is counted and logged here, whatever
its outcome: which computer (``resolve``), then the tool (``tools``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.iweb import IRequest

from trapsandbox import __version__, errors
from trapsandbox.computers import wire
from trapsandbox.computers.registry import Registry, Session
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.mcp import jsonrpc
from trapsandbox.mcp.jsonrpc import (
    INVALID_PARAMS,
    LATEST,
    METHOD_NOT_FOUND,
    PROTOCOL_VERSIONS,
    Call,
    Invalid,
)
from trapsandbox.mcp.resolve import computers, pinned, resolve
from trapsandbox.mcp.resources import TEMPLATES, Resources
from trapsandbox.mcp.results import OUTCOMES, ToolError, failed
from trapsandbox.mcp.schemas import TOOL_NAMES, TOOLS
from trapsandbox.mcp.text import INSTRUCTIONS
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
        self.running = jsonrpc.Running()

    def post(
        self,
        request: IRequest,
        body: bytes | None,
        too_large: str | None = None,
        scope: str | None = LOCAL_ACCOUNT,
        pin: tuple[str, str] | None = None,
    ):
        """
        The answer to ``POST /mcp`` with ``body`` (None and ``too_large``: it was
        refused); the tools reach the computers of the account ``scope`` (None:
        every account's), or with ``pin``, the (account, traposId) an ask's token
        is for, that computer only, whatever ``computer`` says.
        """
        return jsonrpc.answer(
            request,
            body,
            too_large,
            lambda method, params, call: self._method(method, params, call, scope, pin),
            self.running,
            _caller(request),
        )

    async def _method(
        self,
        method: str,
        params: dict[str, Any],
        call: Call,
        scope: str | None,
        pin: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        if method == "initialize":
            return self._initialize(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "tools/call":
            return await self._tools_call(params, call, scope, pin)
        if method == "resources/list":
            return await self._resources.list(scope, pin)
        if method == "resources/templates/list":
            return {"resourceTemplates": TEMPLATES}
        if method == "resources/read":
            return await self._resources.read(params, scope, pin)
        raise Invalid(METHOD_NOT_FOUND, f'no method "{wire.cut(method)}"')

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        if type(asked) is not str:
            raise Invalid(INVALID_PARAMS, "initialize needs protocolVersion, a string")
        return {
            "protocolVersion": asked if asked in PROTOCOL_VERSIONS else LATEST,
            "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "trapsandbox", "title": "trapsandbox", "version": __version__},
            "instructions": INSTRUCTIONS,
        }

    async def _tools_call(
        self,
        params: dict[str, Any],
        call: Call,
        scope: str | None,
        pin: tuple[str, str] | None = None,
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
                result, outcome = list_computers(await computers(self._registry, scope, pin)), "ok"
            else:
                if pin is None:
                    found = await computers(self._registry, scope)
                    session = resolve(self._registry, computer, scope, found)
                else:
                    session = pinned(self._registry, pin)
                    if name in CHANGING and self._before_change is not None:
                        await self._before_change(session)
                target = session.trapos_id
                result, outcome = await self._tools.call(name, session, arguments, call.progress)
        except ToolError as error:
            outcome = error.outcome
            result = failed(error)
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
