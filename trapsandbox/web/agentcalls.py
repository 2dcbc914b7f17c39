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

It is the computer's own conversation, not another: the ask goes through the same
``Asks.ask`` as the computer's ``sandbox ask`` (``trapsandbox.handlers``), keyed by the
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

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.errors import GatewayError
from trapsandbox.handlers import ask_progress

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
        self._asks = asks
        self._snapshots = snapshots

    def _need_asks(self) -> Asks:
        if self._asks is None:
            raise GatewayError(errors.OPENCODE_ERROR, "this gateway does not talk to opencode")
        return self._asks

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
        request's id on it.
        """
        asks = self._need_asks()
        if kind == ASK:
            return self.ask(asks, caller, payload, connection, ask_id, on_partial)
        self._session(caller)
        account_id, trapos_id = caller.key
        if kind == CANCEL:
            if "ask" not in payload:
                raise errors.bad_request("ask_cancel needs ask: the id of the ask to stop")
            if connection is None:
                raise errors.bad_request("ask_cancel stops an ask of the same /operator socket")
            d = asks.cancel(account_id, trapos_id, run_id(connection, payload["ask"]))
            if d is None:
                return succeed({"cancelled": False})
            return d.addCallback(lambda _: {"cancelled": True})
        if kind == PERMISSION:
            d = asks.reply(
                account_id, trapos_id, payload.get("permissionId"), payload.get("response")
            )
        else:
            d = asks.answer(
                account_id,
                trapos_id,
                payload.get("questionId"),
                payload.get("answers"),
                payload.get("reject"),
            )
        return d.addCallback(lambda _: {})

    def ask(
        self,
        asks: Asks,
        caller: Caller,
        payload: dict[str, Any],
        connection: str | None,
        ask_id: object,
        on_partial: Partial | None,
    ) -> Deferred[dict[str, Any]]:
        """
        The computer's ask, by this operator: its partials to ``on_partial`` and to the
        activity.  Cancelling the Deferred (the socket closed) stops the run in opencode.
        """
        session = self._session(caller)
        account_id, trapos_id = caller.key
        if session.stopped is not None:
            raise GatewayError(errors.STOPPED, session.stopped)
        name = run_id("http" if connection is None else connection, ask_id)
        ended: Deferred = Deferred()
        progress = self._registry.track(session.key, ASK, payload, ended, caller.sender)
        ended.addErrback(lambda _: None)  # the ask's own Deferred carries its failure on

        def emit(partial: dict[str, Any]) -> None:
            if on_partial is not None:
                on_partial(partial)
            told = ask_progress(partial)
            if told is not None:
                progress(told)

        running = Deferred.fromCoroutine(
            asks.ask(
                account_id, trapos_id, session.capabilities, name, payload, emit, session=session
            )
        )
        if self._snapshots is not None:
            running.addCallback(self._named_snapshot, caller)
        running.addBoth(_tell, ended)

        def stop(_: Deferred) -> None:
            # The run ends in opencode; this Deferred is answered cancelled at once.
            asks.cancel(account_id, trapos_id, name)

        answer: Deferred = Deferred(stop)
        running.addBoth(_passed_to, answer)
        return answer

    def _named_snapshot(
        self, result: dict[str, Any], caller: Caller
    ) -> Deferred[dict[str, Any]] | dict[str, Any]:
        """``result`` with ``snapshot``: the one taken before the run's first change, if it
        changed files (the newest taken before an ask: one ask runs per computer)."""
        if not result.get("changed") or self._snapshots is None:
            return result

        def named(listed: list[dict[str, Any]]) -> dict[str, Any]:
            for each in listed:
                if each.get("reason") == "ask":
                    return {**result, "snapshot": each["id"]}
            return result

        d = self._snapshots.list(caller)
        return d.addCallbacks(named, lambda _: result)


def _passed_to(result: Any, answer: Deferred) -> None:
    """``answer`` fires with ``result`` unless it was cancelled already (then it is dropped:
    a Deferred with a canceller may not fire twice)."""
    if answer.called:
        return
    if isinstance(result, Failure):
        answer.errback(result)
    else:
        answer.callback(result)


def _tell(result: Any, ended: Deferred) -> Any:
    """Pass ``result`` on, and end the activity entry with it."""
    if isinstance(result, Failure):
        ended.errback(result)
    else:
        ended.callback(result)
    return result
