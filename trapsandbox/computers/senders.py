"""
Who sent a request to a computer, for that computer's activity (SPEC §14).

    {"by": "operator"}                     the admin (its token, or loopback without one)
    {"by": "operator", "account": NAME}    an account's token
    {"by": "agent", "account"?: NAME}      ``/mcp`` with an operator's token (opencode, ...)
    {"by": "ask"}                          ``/mcp`` with an ask's token (``sandbox ask``)
    {"by": "player"}                       the computer's own player (its ``ask``)
    {"by": "gateway"}                      nobody above: the gateway's own work

Every surface that sends requests (the HTTP routes, ``/operator``, ``/mcp``)
knows its caller where the call starts, but the request itself is made
several calls deeper (``Sandbox``, ``OperatorRequests.send``, an MCP tool, a
file written in parts).  So the caller is put in a context variable around
the call (``sent_by``) and read where the request goes out
(``Registry.request``), instead of a parameter threaded through all of
them.  Coroutines (``Deferred.fromCoroutine``) keep the context they started
in; a callback run later by the reactor does not, and counts as ``gateway``.
Account names are not secrets; nothing else about the caller is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from trapsandbox.admission import auth

Sender = dict[str, str]
T = TypeVar("T")

OPERATOR, AGENT, ASK, PLAYER, GATEWAY = "operator", "agent", "ask", "player", "gateway"

_SENDER: ContextVar[Sender | None] = ContextVar("trapsandbox_sender", default=None)
# Set while the gateway does one thing through many requests that its activity shows as that
# one thing (a snapshot reads every changed file): those requests are not shown one by one.
_QUIET: ContextVar[bool] = ContextVar("trapsandbox_quiet", default=False)


def current() -> Sender:
    """Who is sending the requests made now (a new dict: the caller may keep it)."""
    sender = _SENDER.get()
    return {"by": GATEWAY} if sender is None else dict(sender)


def of_operator(operator: auth.Operator, by: str = OPERATOR) -> Sender:
    """``by`` (an operator or the agent) with the account whose token it used, if not the admin."""
    if operator.account is None:
        return {"by": by}
    return {"by": by, "account": operator.account}


def sent_by(sender: Sender, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, the requests it makes (now, or in its coroutines) ``sender``'s."""
    token = _SENDER.set(sender)
    try:
        return call(*args, **kwargs)
    finally:
        _SENDER.reset(token)


def quietly(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, the requests it makes (now, or in its coroutines) not in
    the computer's activity one by one: the caller shows them as one entry (``Registry.track``)."""
    token = _QUIET.set(True)
    try:
        return call(*args, **kwargs)
    finally:
        _QUIET.reset(token)


def is_quiet() -> bool:
    return _QUIET.get()
