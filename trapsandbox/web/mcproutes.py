"""
MCP over HTTP (SPEC §10): the routes of ``/mcp``, the endpoint's own work in
``trapsandbox.mcp``.

    POST /mcp                             operators, or an ask's own token: MCP (Streamable
                                          HTTP, JSON-RPC 2.0), the computers as an agent's
                                          tools (``mcp.endpoint``)
    GET  /mcp                             a legacy client's stream of its subscriptions'
                                          updates (SPEC §17); without any, 405
    PUT, DELETE, PATCH, OPTIONS /mcp      405

Part of ``app.GatewayApp`` (its ``router``), which gives it ``_mcp``, ``_operator`` and
``_ask_scope``.  Here rather than in ``trapsandbox.mcp``: a route answers with the web
side's parts (``answers``, ``operator``), which ``mcp`` sits above in the map.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.web.iweb import IRequest

from trapsandbox.admission import auth
from trapsandbox.computers import callers
from trapsandbox.computers.callers import Caller, Sender
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.endpoint import McpEndpoint
from trapsandbox.web.answers import json_error, write_answer
from trapsandbox.web.operator import UNSUPPORTED_MEDIA_TYPE, json_content
from trapsandbox.web.routing import asked_account, router
from trapsandbox.web.validation import read_body


class McpRoutes:
    """The routes of ``/mcp``, mixed into ``app.GatewayApp``."""

    _mcp: McpEndpoint
    _operator: Callable[[IRequest], Any]
    _ask_scope: Callable[[IRequest], tuple[str, str] | None]

    @router.route("/mcp", methods=["POST"])
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
            scope = operator.scope(asked_account(request))
            caller = Caller(scope, None, Sender(callers.AGENT, operator.account))
        try:
            body = read_body(request)
        except GatewayError as error:
            return self._mcp.post(request, None, error.message, caller)
        return self._mcp.post(request, body, None, caller)

    @router.route("/mcp", methods=["GET"])
    def mcp_stream(self, request: IRequest):
        # A legacy client's stream of its resource subscriptions' updates (SPEC §17), for
        # the caller it subscribed as; without subscriptions, a 405 as ever.
        if self._ask_scope(request) is None:
            operator = self._operator(request)
            if not isinstance(operator, auth.Operator):
                return operator
        return self._mcp.get(request) or self.mcp_other(request)

    @router.route("/mcp", methods=["PUT", "DELETE", "PATCH", "OPTIONS"])
    def mcp_other(self, request: IRequest) -> bytes:
        # No sessions to end (DELETE); GET streams only a client's subscriptions.
        request.setHeader(b"allow", b"POST")
        return json_error(request, 405, "method_not_allowed", "POST one JSON-RPC message to /mcp")
