"""
The player's replies to an ask's agent (SPEC §11, §17), passed to opencode:

    ask_permission {permissionId, response: once|always|reject}  ->  POST /permission/P/reply
    ask_answer {questionId, answers | reject: true}              ->  POST /question/Q/reply
                                                                     (or /reject)

The ids open are kept by their ask (``permission.asked``, ``question.asked``:
``partials``), and are only the asking computer's to answer.  One is forgotten
once opencode has the reply, not before: a reply opencode did not take (an
error, no answer in time) fails saying so, and the player may answer again.
The ask ending forgets its ids (``Run.end``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.agent import PERMISSION_REPLIES
from trapsandbox.opencode.client import explain, opencode_error

if TYPE_CHECKING:
    from trapsandbox.opencode.run import Run


class Replies:
    """The permission requests and questions open, of every ask."""

    def __init__(self) -> None:
        self._permissions: dict[str, Run] = {}
        self._questions: dict[str, tuple[Run, int]] = {}  # id -> (its ask, how many questions)

    def permission_asked(self, run: Run, permission_id: str) -> None:
        self._permissions[permission_id] = run

    def question_asked(self, run: Run, question_id: str, count: int) -> None:
        self._questions[question_id] = (run, count)

    def is_open(self, run: Run, reply_id: str) -> bool:
        question = self._questions.get(reply_id)
        return self._permissions.get(reply_id) is run or (
            question is not None and question[0] is run
        )

    def open_for(self, run: Run) -> bool:
        """Whether ``run`` waits for a reply of its player."""
        return any(r is run for r in self._permissions.values()) or any(
            r is run for r, _ in self._questions.values()
        )

    def forget(self, run: Run) -> None:
        """``run`` ended: its ids are answered by nobody any more."""
        for permission_id in [p for p, r in self._permissions.items() if r is run]:
            del self._permissions[permission_id]
        for question_id in [q for q, (r, _) in self._questions.items() if r is run]:
            del self._questions[question_id]

    def reply(self, key: tuple[str, str], permission_id: Any, response: Any) -> Deferred:
        if response not in PERMISSION_REPLIES:
            raise GatewayError(errors.BAD_REQUEST, "response must be once, always or reject")
        run = self._permissions.get(permission_id) if type(permission_id) is str else None
        if run is None or run.key != key:
            raise GatewayError(
                errors.BAD_REQUEST, "no permission request of this computer's ask has that id"
            )
        client = _client_of(run)
        d = client.reply_permission(run.conversation.directory, permission_id, response)
        return self._taken(d, self._permissions, permission_id, run)

    def answer(self, key: tuple[str, str], question_id: Any, answers: Any, reject: Any) -> Deferred:
        """
        The player's answer to the agent's question ``question_id``: the
        labels picked (or text typed), one list per question, or ``reject``.
        """
        asked = self._questions.get(question_id) if type(question_id) is str else None
        if asked is None or asked[0].key != key:
            raise GatewayError(errors.BAD_REQUEST, "no question of this computer's ask has that id")
        run, count = asked
        if reject is not True:
            if (
                type(answers) is not list
                or len(answers) != count
                or not all(_answer(answer) for answer in answers)
            ):
                raise GatewayError(
                    errors.BAD_REQUEST,
                    "answers must be a list with one list of strings for each question "
                    "(or reject: true)",
                )
        client, directory = _client_of(run), run.conversation.directory
        if reject is True:
            d = client.reject_question(directory, question_id)
        else:
            d = client.reply_question(directory, question_id, answers)
        return self._taken(d, self._questions, question_id, run)

    def _taken(self, d: Deferred, open_ids: dict[str, Any], reply_id: str, run: Run) -> Deferred:
        """Forget ``reply_id`` once opencode answered ``d``; else the player may answer again."""

        def taken(_: object) -> None:
            open_ids.pop(reply_id, None)
            run.player_answered()

        def unheard(failure: Failure) -> None:
            why = explain(failure, "opencode").message
            raise opencode_error(f"{why}; opencode did not get it: answer again")

        return d.addCallbacks(taken, unheard)


def _client_of(run: Run) -> Any:
    server = run.conversation.server
    assert server is not None, "an ask reaches opencode only once its server is chosen"
    return server.client


def _answer(answer: Any) -> bool:
    """One question's answer: picked labels or typed text, each a bounded string."""
    return type(answer) is list and all(
        type(text) is str and 0 < len(text) <= limits.MAX_ASK_ANSWER_CHARS for text in answer
    )
