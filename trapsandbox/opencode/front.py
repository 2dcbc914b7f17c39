"""
The one front end of an ask (issue 44): the game's ``ask`` request
(``trapsandbox.handlers``) and the console's ``/operator`` ask
(``trapsandbox.web.agentcalls``) both start, cancel and answer an ask here,
and differ only in how a partial is delivered (to the computer's connection,
to the operator's socket).

    start   the computer's ask, by ``sender``: refused at once when the player
            stopped the agent; one entry of the computer's activity from before
            it starts (``ask_progress`` of each partial), ended with its answer;
            the answer names the snapshot taken before the run's first change
            (``snapshot``, when it changed files: restoring it is the undo).
            Cancelling the Deferred returned stops the run as ``cancel`` does.
    cancel  the computer's ask by the id it was started with
    reply, answer   the player's reply to a permission request or a question
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from trapsandbox import errors
from trapsandbox.computers.callers import Caller, Sender
from trapsandbox.computers.wire import cut
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import opencode_error

if TYPE_CHECKING:
    from trapsandbox.computers.registry import Registry
    from trapsandbox.opencode.asks import Asks
    from trapsandbox.snapshots.service import Snapshots

Deliver = Callable[[dict[str, Any]], None]


class AskFront:
    """``asks``: the gateway's (None: it talks to no opencode, every call ``opencode_error``);
    ``registry``: the activity's (None: a test's, told to nobody)."""

    def __init__(
        self, asks: Asks | None, registry: Registry | None, snapshots: Snapshots | None = None
    ) -> None:
        self._asks = asks
        self._registry = registry
        self._snapshots = snapshots

    def need_asks(self) -> Asks:
        if self._asks is None:
            raise opencode_error("this gateway does not talk to opencode")
        return self._asks

    def start(
        self,
        session: Any,
        ask_id: str,
        payload: dict[str, Any],
        sender: Sender,
        deliver: Deliver,
    ) -> Deferred[dict[str, Any]]:
        """The computer's ask ``ask_id`` (its id for ``cancel``), its partials to ``deliver``."""
        asks = self.need_asks()
        if session.stopped is not None:
            # Its tools would all be refused: say so before opencode spends anything.
            raise GatewayError(errors.STOPPED, session.stopped)
        account_id, trapos_id = session.key
        # In the computer's activity from before it starts: none of its partials is missed.
        ended: Deferred = Deferred()
        progress = (
            self._registry.activity.track(session.key, "ask", payload, ended, sender)
            if self._registry is not None
            else _untold
        )
        ended.addErrback(lambda _: None)  # the ask's own Deferred carries its failure on

        def emit(partial: dict[str, Any]) -> None:
            deliver(partial)
            told = ask_progress(partial)
            if told is not None:
                progress(told)

        running = Deferred.fromCoroutine(
            asks.ask(
                account_id, trapos_id, session.capabilities, ask_id, payload, emit, session=session
            )
        )
        running.addCallback(self._named_snapshot, Caller(account_id, trapos_id, sender))
        running.addBoth(_passed_to, ended, keep=True)
        answer: Deferred = Deferred(lambda _: asks.cancel(account_id, trapos_id, ask_id))
        running.addBoth(_passed_to, answer)
        return answer

    def cancel(self, account_id: str, trapos_id: str, ask_id: Any) -> Deferred[dict[str, Any]]:
        """``{cancelled: bool}``: whether the computer had that ask running (now aborted)."""
        d = self.need_asks().cancel(account_id, trapos_id, ask_id)
        if d is None:
            return succeed({"cancelled": False})
        return d.addCallback(lambda _: {"cancelled": True})

    def reply(self, account_id: str, trapos_id: str, payload: dict[str, Any]) -> Deferred:
        d = self.need_asks().reply(
            account_id, trapos_id, payload.get("permissionId"), payload.get("response")
        )
        return d.addCallback(lambda _: {})

    def answer(self, account_id: str, trapos_id: str, payload: dict[str, Any]) -> Deferred:
        d = self.need_asks().answer(
            account_id,
            trapos_id,
            payload.get("questionId"),
            payload.get("answers"),
            payload.get("reject"),
        )
        return d.addCallback(lambda _: {})

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


def ask_progress(partial: dict[str, Any]) -> dict[str, Any] | None:
    """
    What the activity shows of an ask's partial: the agent's text as it
    arrives, each tool call (by its callID), what it asks permission for, and
    its questions (their text only); cut like every value shown.
    """
    kind = partial.get("type")
    if kind == "text_delta":
        return {"text": partial.get("text", "")}
    if kind == "tool":
        told = {"tool": cut(partial.get("name")), "status": cut(partial.get("status"))}
        if "callID" in partial:  # two calls of one tool are two lines
            told["callID"] = cut(partial["callID"])
        return told
    if kind == "permission":
        return {"permission": cut(partial.get("tool")), "detail": cut(partial.get("detail"))}
    if kind == "question":
        questions = partial.get("questions")
        texts = (
            [q.get("question") for q in questions if isinstance(q, dict)]
            if isinstance(questions, list)
            else []
        )
        return {"question": cut(" / ".join(t for t in texts if isinstance(t, str)))}
    return None


def _untold(progress: dict[str, Any]) -> None:
    """No registry (a test's handler): an ask's progress is told to nobody."""


def _passed_to(result: Any, to: Deferred, keep: bool = False) -> Any:
    """``to`` fires with ``result`` unless it has fired already (a cancelled answer: a
    Deferred with a canceller may not fire twice); ``keep``: ``result`` goes on."""
    if not to.called:
        to.errback(result) if isinstance(result, Failure) else to.callback(result)
    return result if keep else None
