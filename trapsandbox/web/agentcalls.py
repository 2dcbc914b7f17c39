"""
The agent from the web console (issue 34): an operator's ask on one computer, as
request types of ``/operator`` (``operator.OperatorRequests.send``)::

    type            payload                                   answer
    ask             {prompt, new?, yes?}                      partials {type: text_delta | tool |
                                                              permission | question | waiting},
                                                              then {sessionId, text, changed?,
                                                              snapshot?}
    ask_cancel      {ask}                                     {cancelled: bool}
    ask_permission  {permissionId, response}                  {}
    ask_answer      {questionId, answers | reject: true}      {}

It is the computer's own conversation, not another: the ask goes through the same front
end as the computer's ``sandbox ask`` (``trapsandbox.opencode.front``), keyed by the
computer's account and traposId, with the capabilities the computer allows now; so one ask
runs per computer whoever started it (a second is answered 503 ``overloaded``), and the
next ``sandbox ask`` on the computer continues what was asked here.  The ask is one entry
of the computer's activity, by whoever sent it (its ``Caller``'s sender: the operator,
with its account), updated as it runs.

``ask_cancel`` names an ask by the id it has on the same ``/operator`` connection
(``connection``); ``ask_permission`` and ``ask_answer`` answer a permission request or a
question of the computer's running ask, whoever started it (its owner's operator may).
When the run changed files, ``snapshot`` is the id of the snapshot taken before its first
change (SPEC §15): restoring it (``snapshot_restore``) is the undo.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.front import AskFront

if TYPE_CHECKING:
    from trapsandbox.opencode.asks import Asks
    from trapsandbox.snapshots.service import Snapshots

ASK, CANCEL, PERMISSION, ANSWER = "ask", "ask_cancel", "ask_permission", "ask_answer"
TYPES = frozenset({ASK, CANCEL, PERMISSION, ANSWER})

Partial = Callable[[dict[str, Any]], None]


def run_id(connection: str, ask: object) -> str:
    """The id ``Asks`` knows an ask by: its id on the ``connection`` it was sent on."""
    return f"{connection}/{ask!r}"


class AgentCalls:
    """``asks``: the gateway's (None: it talks to no opencode, every call ``opencode_error``).
    ``snapshots``: the service, to name the snapshot before a run's first change."""

    def __init__(
        self, registry: Registry, asks: Asks | None, snapshots: Snapshots | None = None
    ) -> None:
        self._registry = registry
        self._front = AskFront(asks, registry, snapshots)

    def _session(self, caller: Caller) -> Any:
        account_id, trapos_id = caller.key
        session = self._registry.find(account_id, trapos_id)
        if session is not None:
            return session
        if self._registry.peers is not None:
            # Its asks run where it is connected; another process's is not reached from here.
            raise GatewayError(
                errors.UNAVAILABLE,
                f"{wire.cut(trapos_id)} is not connected to this gateway process: "
                "the agent panel reaches the computers held by the process it is connected to",
            )
        raise wire.not_connected(trapos_id)

    def request(
        self,
        kind: str,
        caller: Caller,
        payload: dict[str, Any],
        connection: str | None,
        ask_id: object,
        on_partial: Partial | None,
    ) -> Deferred[dict[str, Any]]:
        """
        One of ``TYPES``, by ``caller`` (aimed at the computer); raises ``GatewayError`` for
        what is refused at once (bad input: 400, the computer missing or another account's:
        404, opencode not set up).  ``connection`` names the connection (None: a single
        HTTP request, whose ask cannot be named by ``ask_cancel``), ``ask_id`` the
        request's id on it.  An ask's Deferred, cancelled (the socket closed), stops the run.
        """
        self._front.need_asks()
        session = self._session(caller)
        account_id, trapos_id = caller.key
        if kind == ASK:
            name = run_id("http" if connection is None else connection, ask_id)
            deliver = on_partial if on_partial is not None else _dropped
            return self._front.start(session, name, payload, caller.sender, deliver)
        if kind == CANCEL:
            if "ask" not in payload:
                raise errors.bad_request("ask_cancel needs ask: the id of the ask to stop")
            if connection is None:
                raise errors.bad_request("ask_cancel stops an ask of the same /operator socket")
            return self._front.cancel(account_id, trapos_id, run_id(connection, payload["ask"]))
        if kind == PERMISSION:
            return self._front.reply(account_id, trapos_id, payload)
        return self._front.answer(account_id, trapos_id, payload)


def _dropped(partial: dict[str, Any]) -> None:
    """A single HTTP request's ask: its partials reach only the activity."""
