"""
opencode's events of one ask's session turned into the player's partials
(SPEC §11), and the moment the session goes idle:

    message.updated               the roles of messages; an assistant's tokens
    message.part.delta            {type: text_delta, text}: the first at once, then
                                  batched, at most ``ASK_PARTIAL_MAX_CHARS`` a
                                  partial, within ``ASK_PARTIAL_INTERVAL``
    message.part.updated (text)   the same (the whole part so far)
    message.part.updated (tool)   {type: tool, callID, name, status, detail?, error?}
                                  once per status of each call: two calls of one
                                  tool at once are two calls
    permission.asked              {type: permission, id, callID?, tool, detail}
                                  (``replies`` keeps the id)
    question.asked                {type: question, id, questions}
    session.error                 kept: the idle that follows ends the ask with it
    session.status / session.idle its end (``Run.idle``)

What it holds (a batch's timer, permission requests waiting for their tool's
input) is let go by ``close`` when the ask ends (``run``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from trapsandbox import limits
from trapsandbox.computers.wire import cut
from trapsandbox.opencode.agent import detail_of, questions_of
from trapsandbox.opencode.client import opencode_error
from trapsandbox.opencode.run import logged

if TYPE_CHECKING:
    from trapsandbox.opencode.replies import Replies
    from trapsandbox.opencode.run import Run


class Partials:
    """The partials of ``run``'s session, from its events."""

    def __init__(self, run: Run, clock: IReactorTime, replies: Replies) -> None:
        self._run = run
        self._clock = clock
        self._replies = replies
        self.started = False
        self.error: dict[str, Any] | None = None
        self._roles: dict[str, str] = {}
        self.texts: dict[str, str] = {}  # partID -> text so far, in order
        self._sent: dict[str, int] = {}  # partID -> characters forwarded
        self._tools: dict[str, dict[str, Any]] = {}  # callID -> {name, input}
        self._tool_status: dict[str, str] = {}
        self._tokens: dict[str, tuple[int, int]] = {}  # messageID -> (in, out)
        # permission.asked whose tool input is not known yet: permissionID -> (event, timer)
        self._pending: dict[str, tuple[dict[str, Any], IDelayedCall]] = {}
        self._flush_timer: IDelayedCall | None = None

    def used(self) -> tuple[int, int]:
        """The tokens its run used: (input, output)."""
        return (
            sum(t[0] for t in self._tokens.values()),
            sum(t[1] for t in self._tokens.values()),
        )

    def close(self) -> None:
        """The ask ended: no timer of it is left."""
        for _, timer in self._pending.values():
            if timer.active():
                timer.cancel()
        self._pending.clear()
        if self._flush_timer is not None and self._flush_timer.active():
            self._flush_timer.cancel()
        self._flush_timer = None

    # -- Events ------------------------------------------------------------------------

    def event(self, event: dict[str, Any]) -> None:
        if self._run.finished:
            return
        kind = event.get("type")
        props = event.get("properties") or {}
        if kind == "message.updated":
            info = props.get("info") if type(props.get("info")) is dict else {}
            if type(info.get("id")) is str and type(info.get("role")) is str:
                self._roles[info["id"]] = info["role"]
                tokens = info.get("tokens")
                if info["role"] == "assistant" and type(tokens) is dict:
                    self._tokens[info["id"]] = (
                        _count(tokens.get("input")),
                        _count(tokens.get("output")),
                    )
        elif kind == "message.part.delta":
            if props.get("field", "text") == "text" and type(props.get("delta")) is str:
                part = props.get("partID")
                if self._roles.get(props.get("messageID")) == "user":
                    return
                if type(part) is str:
                    self.started = True
                    self.texts[part] = self.texts.get(part, "") + props["delta"]
                    self._text()
        elif kind == "message.part.updated":
            part = props.get("part") if type(props.get("part")) is dict else {}
            if part.get("type") == "text":
                self._text_part(part)
            elif part.get("type") == "tool":
                self._tool_part(part)
        elif kind == "permission.asked":
            self._permission(props)
        elif kind == "question.asked":
            self._question(props)
        elif kind == "session.error":
            error = props.get("error")
            self.error = error if type(error) is dict else {"name": "UnknownError"}
        elif kind == "session.status":
            status = props.get("status") if type(props.get("status")) is dict else {}
            if status.get("type") == "busy":
                self.started = True
            elif status.get("type") == "idle" and (self.started or self.error):
                self.idle()
        elif kind == "session.idle":
            if self.started or self.error:
                self.idle()

    def idle(self) -> None:
        """Its session went idle: the ask ends with what was said, or how it failed."""
        self.flush()
        run = self._run
        error = self.error
        failed = opencode_error(_run_error(error)) if error is not None else None
        text = "".join(self.texts.values())
        run.idle(error, {"sessionId": run.conversation.session_id, "text": text}, failed)

    def _text_part(self, part: dict[str, Any]) -> None:
        part_id, text = part.get("id"), part.get("text")
        if type(part_id) is not str or type(text) is not str:
            return
        if self._roles.get(part.get("messageID")) != "assistant" or part.get("synthetic"):
            return
        self.started = True
        if len(text) >= len(self.texts.get(part_id, "")):
            self.texts[part_id] = text
            self._text()

    def _tool_part(self, part: dict[str, Any]) -> None:
        call = part.get("callID")
        name = part.get("tool")
        state = part.get("state") if type(part.get("state")) is dict else {}
        status = state.get("status")
        if type(call) is not str or type(name) is not str or type(status) is not str:
            return
        self.started = True
        known = self._tools.setdefault(call, {"name": name, "input": None})
        if type(state.get("input")) is dict and state["input"]:
            known["input"] = state["input"]
            if self._pending:
                self._release_call(call)
        if status == "pending" or self._tool_status.get(call) == status:
            return
        self._tool_status[call] = status
        message: dict[str, Any] = {"type": "tool", "callID": call, "name": name, "status": status}
        if known["input"] is not None:
            # Its arguments as a permission prompt shows them (the console lists each call).
            message["detail"] = detail_of(name, known["input"])
        if status == "error" and type(state.get("error")) is str:
            message["error"] = state["error"][: limits.PERMISSION_DETAIL_CHARS]
        self._send(message)

    # -- Asking the player -------------------------------------------------------------

    def _permission(self, props: dict[str, Any]) -> None:
        """
        A permission request reaches the player with what the tool would do.

        opencode often asks before the gateway has heard the tool part's input
        (``message.part.updated`` running), so the request may wait for it: it
        goes out as soon as the input arrives, is fetched from opencode
        (``GET /session/S/message/M``), or after ``ASK_PERMISSION_DETAIL_WAIT``
        with the permission's patterns.
        """
        permission_id = props.get("id")
        if type(permission_id) is not str or permission_id in self._pending:
            return
        run = self._run
        self._replies.permission_asked(run, permission_id)
        tool = props.get("tool") if type(props.get("tool")) is dict else {}
        call, message_id = tool.get("callID"), tool.get("messageID")
        known = self._tools.get(call) if type(call) is str else None
        if (known is not None and known.get("input") is not None) or type(call) is not str:
            self._ask_player(props)
            return
        timer = self._clock.callLater(
            limits.ASK_PERMISSION_DETAIL_WAIT, self._release_permission, permission_id
        )
        self._pending[permission_id] = (props, timer)
        server = run.conversation.server
        if type(message_id) is str and server is not None:
            conversation = run.conversation
            d = server.client.message(conversation.directory, conversation.session_id, message_id)
            d.addCallback(self._fetched_message, call)
            d.addErrback(logged("fetching a tool's input"))

    def _fetched_message(self, message: Any, call: str) -> None:
        if self._run.finished:
            return
        parts = message.get("parts") if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and part.get("callID") == call and part.get("type") == "tool":
                state = part.get("state") if type(part.get("state")) is dict else {}
                if type(state.get("input")) is dict and state["input"]:
                    known = self._tools.setdefault(call, {"name": part.get("tool"), "input": None})
                    known["input"] = state["input"]
                    self._release_call(call)

    def _release_call(self, call: str) -> None:
        for permission_id, (props, _) in list(self._pending.items()):
            tool = props.get("tool") if type(props.get("tool")) is dict else {}
            if tool.get("callID") == call:
                self._release_permission(permission_id)

    def _release_permission(self, permission_id: str) -> None:
        waiting = self._pending.pop(permission_id, None)
        if waiting is None:
            return
        props, timer = waiting
        if timer.active():
            timer.cancel()
        if self._replies.is_open(self._run, permission_id):  # not answered (or ended) meanwhile
            self._ask_player(props)

    def _ask_player(self, props: dict[str, Any]) -> None:
        tool = props.get("permission") if type(props.get("permission")) is str else "?"
        call = props.get("tool", {}).get("callID") if type(props.get("tool")) is dict else None
        known = self._tools.get(call) if type(call) is str else None
        if known is not None and known.get("input") is not None:
            detail = detail_of(tool, known["input"])
        else:
            patterns = props.get("patterns")
            detail = ", ".join(map(str, patterns)) if isinstance(patterns, list) else ""
        message = {"type": "permission", "id": props["id"], "tool": tool, "detail": detail}
        if type(call) is str:
            message["callID"] = call
        self._run.asked_player()
        self._send(message)

    def _question(self, props: dict[str, Any]) -> None:
        """The agent asks the player (opencode's question tool): shown on the computer."""
        question_id = props.get("id")
        questions = questions_of(props.get("questions"))
        if type(question_id) is not str or questions is None:
            return
        if self._replies.is_open(self._run, question_id):
            return
        self.started = True
        self._replies.question_asked(self._run, question_id, len(questions))
        self._run.asked_player()
        self._send({"type": "question", "id": question_id, "questions": questions})

    # -- Sending -------------------------------------------------------------------------

    def waiting(self, ahead: int) -> None:
        """The ask waits its turn (``queue``): the player sees how many are ahead."""
        self._run.send({"type": "waiting", "ahead": ahead})

    def _text(self) -> None:
        pending = sum(len(t) - self._sent.get(p, 0) for p, t in self.texts.items())
        if pending >= limits.ASK_PARTIAL_MAX_CHARS or (pending and not self._sent):
            # (The ask's first text goes at once: the player waits for that one; the rest is
            # batched.)
            self.flush()
        elif pending and self._flush_timer is None:
            self._flush_timer = self._clock.callLater(
                limits.ASK_PARTIAL_INTERVAL, self._flush_later
            )

    def _flush_later(self) -> None:
        self._flush_timer = None
        self.flush()

    def flush(self) -> None:
        """The text not sent yet goes out now."""
        if self._flush_timer is not None and self._flush_timer.active():
            self._flush_timer.cancel()
        self._flush_timer = None
        pieces = []
        for part, text in self.texts.items():
            sent = self._sent.get(part, 0)
            if len(text) > sent:
                if sent == 0 and pieces == [] and any(self._sent.values()):
                    pieces.append("\n\n")  # a new text part starts a new paragraph
                pieces.append(text[sent:])
                self._sent[part] = len(text)
        text = "".join(pieces)
        while text and not self._run.finished:
            chunk, text = (
                text[: limits.ASK_PARTIAL_MAX_CHARS],
                text[limits.ASK_PARTIAL_MAX_CHARS :],
            )
            self._run.send({"type": "text_delta", "text": chunk})

    def _send(self, message: dict[str, Any]) -> None:
        self.flush()
        self._run.send(message)


def _count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def _run_error(error: dict[str, Any]) -> str:
    name = error.get("name") if type(error.get("name")) is str else "UnknownError"
    data = error.get("data") if type(error.get("data")) is dict else {}
    message = data.get("message") if type(data.get("message")) is str else ""
    if name in ("ProviderModelNotFoundError", "ModelNotFoundError") or "model" in message.lower():
        hint = " (is a model configured in opencode?)"
    elif name == "ProviderAuthError":
        hint = " (the model provider refused opencode's key)"
    else:
        hint = ""
    return f"the agent's run failed: {cut(name)}{': ' + cut(message) if message else ''}{hint}"
