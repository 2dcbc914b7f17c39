"""
The one router of the port (``router``: the Klein app every route class registers on,
``app.GatewayApp`` and the classes it is made of, ``sandboxroutes.SandboxRoutes`` and
``mcproutes.McpRoutes``), and what their routes share: who may call them
(``operators_only``, ``on_computer``) and the ``segment`` path part.

A route class's methods are called with the ``GatewayApp``: ``self._operator(request)`` is
the operator a request was admitted as (or the answer refusing it), ``self._registry``
the computers.
"""

from __future__ import annotations

import functools
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest
from werkzeug.routing import PathConverter

from trapsandbox.admission import auth
from trapsandbox.computers.callers import Caller
from trapsandbox.errors import GatewayError
from trapsandbox.web.answers import gateway_error


class Segment(PathConverter):
    """
    A traposId as its path segment decodes, whatever it holds: empty, or
    starting with "/" (``%2F``).  The operator route reads it so, as
    ``fasthttp`` does, rather than redirect to another path or answer a
    bare 404: such a computer is a missing one.
    """

    regex = ".*?"
    part_isolating = False  # it may span "/"


router = Klein()
router.url_map.converters["segment"] = Segment


def operators_only(route):
    """
    Serve ``route`` only to an operator (a bearer token, or loopback when no
    admin token is set); it is called with ``operator=`` the ``auth.Operator``.
    """

    @functools.wraps(route)
    def guarded(self: Any, request: IRequest, *args: Any, **kwargs: Any):
        operator = self._operator(request)
        if not isinstance(operator, auth.Operator):
            return operator
        return route(self, request, *args, operator=operator, **kwargs)

    return guarded


def asked_account(request: IRequest) -> str | None:
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
        self: Any,
        request: IRequest,
        trapos_id: str,
        operator: auth.Operator,
        **path: str,
    ):
        try:
            account_id = operator.account_of(self._registry, trapos_id, asked_account(request))
        except GatewayError as failure:
            return gateway_error(request, failure)
        # What the route sends the computer is this operator's, in its activity.
        return route(self, request, Caller.of_operator(operator, account_id, trapos_id), **path)

    return operators_only(resolved)
