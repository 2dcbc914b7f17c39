"""
``sandbox ask`` (SPEC §11): a computer's prompt runs as an opencode session,
its answer streamed back as partials, its permission requests put to the
player.

    computer                      gateway                          opencode
    ask {prompt, new?, yes?}  ->  (past the bound: waits its turn, ``queue``)
          <- partial {type: waiting, ahead}                        (on a change, each minute)
                                  (first ask of a computer)
                                  POST /mcp?directory=D            the computer's own MCP block
                                  POST /session?directory=D        rules: ask before changes
                                  POST /session/S/prompt_async ->  204
                                                               <-  GET /global/event (SSE)
          <- partial {type: text_delta, text}                      message.part.delta
          <- partial {type: tool, name, status, detail?}           message.part.updated (tool)
          <- partial {type: permission, id, tool, detail}          permission.asked
    ask_permission {permissionId, response} -> POST /permission/P/reply
          <- partial {type: question, id, questions}                question.asked
    ask_answer {questionId, answers | reject} -> POST /question/Q/reply (or /reject)
    cancel {messageId}        ->  POST /session/S/abort
          <- final {sessionId, text, changed?}                     session.idle
                                  (changed: files changed since the snapshot taken
                                  before the run's first change, ``snapshots.askhook``)

Confinement.  Every computer's sessions live in a directory of its own
(``directories``) whose opencode instance has a ``trapsandbox`` MCP server
with the computer's ask token (``tokens``): ``/mcp`` serves such a token with
every tool pinned to that computer, whatever ``computer`` the model names
(``trapsandbox.mcp.resolve``).  The session's permission rules deny every
other tool (``agent``: opencode's own bash, edit, … act on the host, not on
the computer).

What is remembered per computer (its conversation, its token, whether its
directory's instance has the block) is bounded per account: past
``max_conversations`` the least recently used computer's is forgotten (its
token stops working; its next ask starts a new session).

Scale (issue 33).  An ask waits its turn in the ``queue`` (a bound per opencode
server and per account; the player sees "waiting for the agent: N asks ahead";
no timeout runs meanwhile).  Each computer's instance is given back when it is
idle, past a bound, or forgotten (``instances``).  With several opencode servers
(``servers``) each computer's asks go to one, the next of its ranking when that
one does not answer (the conversation then starts afresh, and the player is
told).

Events come from one stream per opencode server (``events``).  After a
reconnect, every running ask there asks opencode whether its session is still
busy (events in the gap are lost) and ends if not; when the stream cannot be
opened again for ``ASK_SERVER_GONE`` seconds, its running asks end saying so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet.defer import Deferred, DeferredList, TimeoutError, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.computers.wire import cut
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.agent import (
    PERMISSION_REPLIES,
    detail_of,
    questions_of,
    session_rules,
    system_note,
)
from trapsandbox.opencode.client import OpencodeClient, explain, opencode_error
from trapsandbox.opencode.instances import REASONS
from trapsandbox.opencode.probe import redact
from trapsandbox.opencode.queue import AskQueue, Ticket
from trapsandbox.opencode.servers import Server, ranked
from trapsandbox.opencode.tokens import AskTokens
from trapsandbox.ops.metrics import Metrics, ServerFigures

if TYPE_CHECKING:
    from trapsandbox.snapshots.askhook import AskSnapshots

log = Logger()

# Outcomes of an ask (metrics labels).
ASK_OUTCOMES = ("ok", "cancelled", "timeout", "opencode_error", "run_failed", "disconnected")


Emit = Callable[[dict[str, Any]], None]


@attrs.define(eq=False)
class Conversation:
    """The opencode session of one computer."""

    session_id: str
    directory: str
    yes: bool
    # The opencode server that keeps it (None: not set up yet).
    server: Server | None = None


@attrs.define(eq=False)
class Run:
    """One ask in flight."""

    key: tuple[str, str]
    message_id: str
    conversation: Conversation
    emit: Emit
    done: Deferred
    started: bool = False
    error: dict[str, Any] | None = None
    aborted: bool = False
    roles: dict[str, str] = attrs.field(factory=dict)
    texts: dict[str, str] = attrs.field(factory=dict)  # partID -> text so far, in order
    sent: dict[str, int] = attrs.field(factory=dict)  # partID -> characters forwarded
    tools: dict[str, dict[str, Any]] = attrs.field(factory=dict)  # callID -> {name, input}
    tool_status: dict[str, str] = attrs.field(factory=dict)
    tokens: dict[str, tuple[int, int]] = attrs.field(factory=dict)  # messageID -> (in, out)
    permissions: set[str] = attrs.field(factory=set)
    questions: dict[str, int] = attrs.field(factory=dict)  # questionID -> how many questions
    # permission.asked whose tool input is not known yet: permissionID -> (event, timer)
    pending: dict[str, tuple[dict[str, Any], Any]] = attrs.field(factory=dict)
    flush_timer: Any = None
    bound: Any = None
    unsubscribe: Callable[[], None] | None = None
    finished: bool = False
    # The snapshot before its first change (``snapshots.askhook``): None until then.
    snapshot: Deferred | None = None
    # Its place in the queue (``queue``): None until it enters.
    ticket: Ticket | None = None
    # The connection of the computer it runs on (None: not followed): the ask ends when
    # the registry no longer holds it.
    session: Any = None


class Asks:
    """Every computer's opencode session and its ask: what ``ask``, ``cancel`` and
    ``ask_permission`` do."""

    def __init__(
        self,
        servers: Sequence[Server],
        clock: IReactorTime,
        metrics: Metrics,
        tokens: AskTokens,
        queue: AskQueue,
        *,
        timeout: float = limits.ASK_TIMEOUT,
        max_conversations: int = limits.MAX_ASK_CONVERSATIONS,
        snapshots: AskSnapshots | None = None,
    ) -> None:
        """
        ``servers``: one per opencode server (``Server.build``), in OPENCODE_URL's order,
        their directories' MCP blocks holding ``tokens``; ``queue``: the bound on asks
        running at once.
        """
        self._client = servers[0].client
        self._snapshots = snapshots
        self._clock = clock
        self._metrics = metrics
        self._metrics.ask_labels(ASK_OUTCOMES)
        # ``/mcp`` looks an ask's token up here (``tokens.scope_of``).
        self.tokens = tokens
        self.servers = list(servers)
        for server in self.servers:
            server.stream.on_reconnect.append(lambda server=server: self._reconnected(server))
            server.stream.on_gone.append(lambda error, server=server: self._gone(server, error))
        # The first server's: what a gateway with one opencode server has.
        self.stream = self.servers[0].stream
        self.directories = self.servers[0].directories
        self.instances = self.servers[0].instances
        self.queue = queue
        self._timeout = timeout
        self._max_conversations = max_conversations
        # account -> its computers' traposIds, the least recently asked first.
        self._recent: dict[str, dict[str, None]] = {}
        self.conversations: dict[tuple[str, str], Conversation] = {}
        self.runs: dict[tuple[str, str], Run] = {}
        self._by_permission: dict[str, Run] = {}
        self._by_question: dict[str, Run] = {}
        self._stopping = False
        self._registry: Any = None
        self._metrics.watch_asks(self.figures)

    def watch(self, registry: Any) -> None:
        """Follow ``registry``'s computers: an ask ends when its computer's connection does."""
        self._registry = registry
        registry.watch(self._computers_changed)

    def _computers_changed(self) -> None:
        for run in list(self.runs.values()):
            if run.session is None or run.finished:
                continue
            if self._registry.find(*run.key) is run.session:
                continue
            log.info("{traposId} left during an ask: aborting it", traposId=cut(run.key[1]))
            if run.conversation.session_id:
                self._abort(run)
            self._finish(
                run, GatewayError(errors.NOT_CONNECTED, "the computer left"), "disconnected"
            )

    def figures(self) -> list[ServerFigures]:
        """Asks waiting and running and instances kept, per opencode server (``/metrics``)."""
        waiting = Counter(ticket.server for ticket in self.queue.waiting)
        return [
            ServerFigures(
                server=redact(server.url),
                waiting=waiting[server.url],
                running=self.queue.running_on[server.url],
                instances=len(server.instances.live),
                given_back={reason: server.instances.given_back[reason] for reason in REASONS},
                dispose_failures=server.instances.dispose_failures,
            )
            for server in self.servers
            if server.url  # none without OPENCODE_URL
        ]

    # -- Remembered per computer, bounded per account ------------------------------------

    def _remember(self, key: tuple[str, str]) -> None:
        """``key`` was just asked for; forget its account's least recently used past the bound."""
        recent = self._recent.setdefault(key[0], {})
        recent.pop(key[1], None)
        recent[key[1]] = None
        if len(recent) <= self._max_conversations:
            return
        for trapos_id in list(recent):
            if len(recent) <= self._max_conversations:
                break
            if (key[0], trapos_id) not in self.runs:  # one asking now is kept
                del recent[trapos_id]
                self._forget((key[0], trapos_id))

    def _forget(self, key: tuple[str, str]) -> None:
        """Drop what is kept for ``key``: its session id, its token (revoked), its block's mark."""
        self.conversations.pop(key, None)
        self.tokens.revoke(key)
        for server in self.servers:
            server.directories.forget(key)
            server.instances.give_back(key)
        log.info(
            "forgot the ask conversation of {traposId} (account {account}): the account's "
            "{bound} most recently asked computers are kept",
            traposId=cut(key[1]),
            account=cut(key[0]),
            bound=self._max_conversations,
        )

    # -- ask ---------------------------------------------------------------------------

    async def ask(
        self,
        account_id: str,
        trapos_id: str,
        capabilities: frozenset[str],
        message_id: str,
        payload: dict[str, Any],
        emit: Emit,
        session: Any = None,
    ) -> dict[str, Any]:
        prompt = payload.get("prompt")
        if type(prompt) is not str or not prompt.strip():
            raise GatewayError(errors.BAD_REQUEST, "prompt must be a non-empty string")
        if len(prompt) > limits.MAX_PROMPT_CHARS:
            raise GatewayError(
                errors.TOO_LARGE, f"the prompt is over {limits.MAX_PROMPT_CHARS} characters"
            )
        new, yes = payload.get("new", False), payload.get("yes", False)
        if type(new) is not bool or type(yes) is not bool:
            raise GatewayError(errors.BAD_REQUEST, "new and yes must be true or false")
        if not self._client.url:
            raise opencode_error("OPENCODE_URL is not set on the gateway")
        if self._stopping:
            raise GatewayError(errors.NOT_CONNECTED, "the gateway is shutting down")
        key = (account_id, trapos_id)
        if key in self.runs:
            raise GatewayError(
                errors.OVERLOADED, "an ask is already running on this computer: wait or cancel it"
            )
        done: Deferred = Deferred()
        placeholder = Run(key, message_id, Conversation("", "", yes), emit, done, session=session)
        self.runs[key] = placeholder  # claims the computer while the session is set up
        server: Server | None = None
        try:
            server = await self._server(placeholder, new)
            if placeholder.finished:  # halted meanwhile
                return await done
            placeholder.ticket = Ticket(
                server.url, account_id, lambda ahead: self._waiting(placeholder, ahead)
            )
            await self.queue.enter(placeholder.ticket).granted
            await server.stream.ready().addTimeout(limits.ASK_STREAM_READY_TIMEOUT, self._clock)
            if placeholder.finished:  # halted meanwhile: its instance is not to be kept
                return await done
            placeholder.conversation.server = server
            await server.instances.use(key)
            conversation = await self._conversation(server, key, new, yes)
            if placeholder.finished:  # halted meanwhile: the prompt must not go out
                return await done
            run = placeholder
            run.conversation = conversation
            run.unsubscribe = server.stream.subscribe(
                conversation.session_id, lambda event: self._event(run, event)
            )
            run.bound = self._clock.callLater(self._timeout, self._timed_out, run)
            await server.client.prompt_async(
                conversation.directory,
                conversation.session_id,
                prompt,
                system_note(trapos_id, capabilities),
            )
        except BaseException as error:
            if placeholder.finished:  # halted meanwhile: that is the answer
                return await done
            failure = Failure()
            self._finish(placeholder, None, "opencode_error")
            if failure.check(GatewayError):
                raise
            if failure.check(TimeoutError):
                raise opencode_error(
                    f"opencode at {server.client.where}: its event stream did not open"
                ) from None
            raise error
        result = await done
        if self._snapshots is not None:
            result = await self._snapshots.closing(placeholder, result)
        return result

    def before_change(self, session: Any) -> Deferred[None]:
        """
        What an MCP tool that changes files waits on when called with the ask token of
        ``session``'s computer (SPEC §15): the snapshot before its running ask's first change.
        """
        run = self.runs.get((session.account_id, session.trapos_id))
        if self._snapshots is None or run is None or run.finished:
            return succeed(None)
        return self._snapshots.before_change(run, session.capabilities)

    async def _server(self, run: Run, new: bool) -> Server:
        """
        The opencode server for this ask (``servers``): the one keeping the
        computer's conversation, else the first of its ranking; one whose event
        stream does not open is passed over for the next, and the player is told
        when the conversation starts afresh there.
        """
        if len(self.servers) == 1:
            return self.servers[0]
        kept = self.conversations.get(run.key)
        order = ranked(self.servers, *run.key)
        if kept is not None and kept.server in order:
            order.remove(kept.server)
            order.insert(0, kept.server)
        failed: GatewayError | None = None
        for server in order:
            try:
                await server.stream.ready().addTimeout(limits.ASK_STREAM_READY_TIMEOUT, self._clock)
            except Exception as error:
                failed = explain(Failure(error), server.client.where)
                log.info("passing over {why}", why=failed.message)
                continue
            if kept is not None and kept.server is not server and not new:
                self.conversations.pop(run.key, None)
                self._emit(
                    run,
                    {
                        "type": "text_delta",
                        "text": f"(opencode at {kept.server.client.where} is not answering: "
                        "this conversation starts afresh on another opencode server)\n",
                    },
                )
            return server
        assert failed is not None
        raise failed

    async def _conversation(
        self, server: Server, key: tuple[str, str], new: bool, yes: bool
    ) -> Conversation:
        self._remember(key)
        conversation = self.conversations.get(key)
        if (
            conversation is not None
            and not new
            and conversation.yes == yes
            and conversation.server is server
        ):
            return conversation
        directory = await server.directories.prepare(key)
        rules = session_rules(yes)
        session = await server.client.create_session(directory, key[1], rules)
        if not isinstance(session, dict) or type(session.get("id")) is not str:
            raise opencode_error("opencode answered POST /session without a session id")
        conversation = Conversation(session["id"], directory, yes, server)
        self.conversations[key] = conversation
        log.info(
            "{traposId} talks to opencode session {session}",
            traposId=cut(key[1]),
            session=cut(conversation.session_id),
        )
        return conversation

    # -- Events ------------------------------------------------------------------------

    def _event(self, run: Run, event: dict[str, Any]) -> None:
        if run.finished:
            return
        kind = event.get("type")
        props = event.get("properties") or {}
        if kind == "message.updated":
            info = props.get("info") if type(props.get("info")) is dict else {}
            if type(info.get("id")) is str and type(info.get("role")) is str:
                run.roles[info["id"]] = info["role"]
                tokens = info.get("tokens")
                if info["role"] == "assistant" and type(tokens) is dict:
                    run.tokens[info["id"]] = (
                        _count(tokens.get("input")),
                        _count(tokens.get("output")),
                    )
        elif kind == "message.part.delta":
            if props.get("field", "text") == "text" and type(props.get("delta")) is str:
                part = props.get("partID")
                if run.roles.get(props.get("messageID")) == "user":
                    return
                if type(part) is str:
                    run.started = True
                    run.texts[part] = run.texts.get(part, "") + props["delta"]
                    self._text(run)
        elif kind == "message.part.updated":
            part = props.get("part") if type(props.get("part")) is dict else {}
            if part.get("type") == "text":
                self._text_part(run, part)
            elif part.get("type") == "tool":
                self._tool_part(run, part)
        elif kind == "permission.asked":
            self._permission(run, props)
        elif kind == "question.asked":
            self._question(run, props)
        elif kind == "session.error":
            error = props.get("error")
            run.error = error if type(error) is dict else {"name": "UnknownError"}
        elif kind == "session.status":
            status = props.get("status") if type(props.get("status")) is dict else {}
            if status.get("type") == "busy":
                run.started = True
            elif status.get("type") == "idle" and (run.started or run.error):
                self._idle(run)
        elif kind == "session.idle":
            if run.started or run.error:
                self._idle(run)

    def _text_part(self, run: Run, part: dict[str, Any]) -> None:
        part_id, text = part.get("id"), part.get("text")
        if type(part_id) is not str or type(text) is not str:
            return
        if run.roles.get(part.get("messageID")) != "assistant" or part.get("synthetic"):
            return
        run.started = True
        if len(text) >= len(run.texts.get(part_id, "")):
            run.texts[part_id] = text
            self._text(run)

    def _tool_part(self, run: Run, part: dict[str, Any]) -> None:
        call = part.get("callID")
        name = part.get("tool")
        state = part.get("state") if type(part.get("state")) is dict else {}
        status = state.get("status")
        if type(call) is not str or type(name) is not str or type(status) is not str:
            return
        run.started = True
        known = run.tools.setdefault(call, {"name": name, "input": None})
        if type(state.get("input")) is dict and state["input"]:
            known["input"] = state["input"]
            if run.pending:
                self._release_call(run, call)
        if status == "pending" or run.tool_status.get(call) == status:
            return
        run.tool_status[call] = status
        message: dict[str, Any] = {"type": "tool", "callID": call, "name": name, "status": status}
        if known["input"] is not None:
            # Its arguments as a permission prompt shows them (the console lists each call).
            message["detail"] = detail_of(name, known["input"])
        if status == "error" and type(state.get("error")) is str:
            message["error"] = state["error"][: limits.PERMISSION_DETAIL_CHARS]
        self._send(run, message)

    def _permission(self, run: Run, props: dict[str, Any]) -> None:
        """
        A permission request reaches the player with what the tool would do.

        opencode often asks before the gateway has heard the tool part's input
        (``message.part.updated`` running), so the request may wait for it: it
        goes out as soon as the input arrives, is fetched from opencode
        (``GET /session/S/message/M``), or after ``ASK_PERMISSION_DETAIL_WAIT``
        with the permission's patterns.
        """
        permission_id = props.get("id")
        if type(permission_id) is not str or permission_id in run.pending:
            return
        run.permissions.add(permission_id)
        self._by_permission[permission_id] = run
        tool = props.get("tool") if type(props.get("tool")) is dict else {}
        call, message_id = tool.get("callID"), tool.get("messageID")
        known = run.tools.get(call) if type(call) is str else None
        if known is not None and known.get("input") is not None:
            self._ask_player(run, props)
            return
        if type(call) is not str:
            self._ask_player(run, props)
            return
        timer = self._clock.callLater(
            limits.ASK_PERMISSION_DETAIL_WAIT, self._release_permission, run, permission_id
        )
        run.pending[permission_id] = (props, timer)
        if type(message_id) is str:
            conversation = run.conversation
            d = _client_of(run).message(conversation.directory, conversation.session_id, message_id)
            d.addCallback(self._fetched_message, run, call)
            d.addErrback(_logged("fetching a tool's input"))

    def _fetched_message(self, message: Any, run: Run, call: str) -> None:
        parts = message.get("parts") if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and part.get("callID") == call and part.get("type") == "tool":
                state = part.get("state") if type(part.get("state")) is dict else {}
                if type(state.get("input")) is dict and state["input"]:
                    known = run.tools.setdefault(call, {"name": part.get("tool"), "input": None})
                    known["input"] = state["input"]
                    self._release_call(run, call)

    def _release_call(self, run: Run, call: str) -> None:
        for permission_id, (props, _) in list(run.pending.items()):
            tool = props.get("tool") if type(props.get("tool")) is dict else {}
            if tool.get("callID") == call:
                self._release_permission(run, permission_id)

    def _release_permission(self, run: Run, permission_id: str) -> None:
        waiting = run.pending.pop(permission_id, None)
        if waiting is None:
            return
        props, timer = waiting
        if timer.active():
            timer.cancel()
        if permission_id in run.permissions:  # not answered (or ended) meanwhile
            self._ask_player(run, props)

    def _ask_player(self, run: Run, props: dict[str, Any]) -> None:
        tool = props.get("permission") if type(props.get("permission")) is str else "?"
        call = props.get("tool", {}).get("callID") if type(props.get("tool")) is dict else None
        known = run.tools.get(call) if type(call) is str else None
        if known is not None and known.get("input") is not None:
            detail = detail_of(tool, known["input"])
        else:
            patterns = props.get("patterns")
            detail = ", ".join(map(str, patterns)) if isinstance(patterns, list) else ""
        self._send(run, {"type": "permission", "id": props["id"], "tool": tool, "detail": detail})

    def _question(self, run: Run, props: dict[str, Any]) -> None:
        """The agent asks the player (opencode's question tool): shown on the computer."""
        question_id = props.get("id")
        questions = questions_of(props.get("questions"))
        if type(question_id) is not str or questions is None or question_id in run.questions:
            return
        run.started = True
        run.questions[question_id] = len(questions)
        self._by_question[question_id] = run
        self._send(run, {"type": "question", "id": question_id, "questions": questions})

    # -- Sending -------------------------------------------------------------------------

    def _text(self, run: Run) -> None:
        pending = sum(len(t) - run.sent.get(p, 0) for p, t in run.texts.items())
        if pending >= limits.ASK_PARTIAL_MAX_CHARS:
            self._flush(run)
        elif pending and run.flush_timer is None:
            run.flush_timer = self._clock.callLater(
                limits.ASK_PARTIAL_INTERVAL, self._flush_timer, run
            )

    def _flush_timer(self, run: Run) -> None:
        run.flush_timer = None
        self._flush(run)

    def _flush(self, run: Run) -> None:
        if run.flush_timer is not None and run.flush_timer.active():
            run.flush_timer.cancel()
        run.flush_timer = None
        pieces = []
        for part, text in run.texts.items():
            sent = run.sent.get(part, 0)
            if len(text) > sent:
                if sent == 0 and pieces == [] and any(run.sent.values()):
                    pieces.append("\n\n")  # a new text part starts a new paragraph
                pieces.append(text[sent:])
                run.sent[part] = len(text)
        text = "".join(pieces)
        while text:
            chunk, text = (
                text[: limits.ASK_PARTIAL_MAX_CHARS],
                text[limits.ASK_PARTIAL_MAX_CHARS :],
            )
            self._emit(run, {"type": "text_delta", "text": chunk})

    def _waiting(self, run: Run, ahead: int) -> None:
        """The ask waits its turn (``queue``): the player sees how many are ahead."""
        self._emit(run, {"type": "waiting", "ahead": ahead})

    def _send(self, run: Run, message: dict[str, Any]) -> None:
        self._flush(run)
        self._emit(run, message)

    def _emit(self, run: Run, message: dict[str, Any]) -> None:
        if run.finished:
            return
        try:
            run.emit(message)
        except GatewayError:
            # The computer is gone: nobody is reading this answer any more.
            log.info("{traposId} left during an ask: aborting it", traposId=cut(run.key[1]))
            if run.conversation.session_id:  # else it never reached opencode
                self._abort(run)
            self._finish(
                run, GatewayError(errors.NOT_CONNECTED, "the computer left"), "disconnected"
            )

    # -- Ending ----------------------------------------------------------------------------

    def _idle(self, run: Run) -> None:
        self._flush(run)
        error = run.error
        if error is not None and (run.aborted or error.get("name") == "MessageAbortedError"):
            self._finish(
                run, GatewayError(errors.CANCELLED, "cancelled: the agent was stopped"), "cancelled"
            )
            return
        if error is not None:
            self._finish(run, opencode_error(_run_error(error)), "run_failed")
            return
        text = "".join(run.texts.values())
        self._finish(run, {"sessionId": run.conversation.session_id, "text": text}, "ok")

    def _finish(self, run: Run, result: Any, outcome: str | None = None) -> None:
        if run.finished:
            return
        run.finished = True
        if self.runs.get(run.key) is run:
            del self.runs[run.key]
            if run.conversation.server is not None:
                run.conversation.server.instances.done(run.key)
        if run.ticket is not None:
            self.queue.leave(run.ticket)
        for permission in run.permissions:
            self._by_permission.pop(permission, None)
        for question in run.questions:
            self._by_question.pop(question, None)
        for _, waiting in run.pending.values():
            if waiting.active():
                waiting.cancel()
        run.pending.clear()
        for timer in (run.flush_timer, run.bound):
            if timer is not None and timer.active():
                timer.cancel()
        if run.unsubscribe is not None:
            run.unsubscribe()
        if outcome is not None:
            self._metrics.ask(outcome)
            used_in = sum(t[0] for t in run.tokens.values())
            used_out = sum(t[1] for t in run.tokens.values())
            self._metrics.ask_tokens(used_in, used_out)
        if result is None:
            return
        if isinstance(result, Exception):
            run.done.errback(result)
        else:
            run.done.callback(result)

    def _timed_out(self, run: Run) -> None:
        run.bound = None
        log.info(
            "an ask on {traposId} ran past {timeout:g} s: aborting",
            traposId=cut(run.key[1]),
            timeout=self._timeout,
        )
        self._abort(run)
        self._finish(
            run,
            GatewayError(
                errors.TIMEOUT, f"the agent did not finish within {self._timeout / 60:g} minutes"
            ),
            "timeout",
        )

    def _abort(self, run: Run) -> Deferred:
        run.aborted = True
        conversation = run.conversation
        d = _client_of(run).abort(conversation.directory, conversation.session_id)
        d.addErrback(_logged("abort"))
        return d

    def _reconnected(self, server: Server) -> None:
        """Events were lost while the stream was down: end the asks whose session is idle."""
        for run in list(self.runs.values()):
            if run.finished or not run.conversation.session_id:
                continue
            if run.conversation.server is not server:
                continue
            d = server.client.statuses(run.conversation.directory)
            d.addCallback(self._check_status, run)
            d.addErrback(_logged("status check"))

    def _gone(self, server: Server, error: GatewayError) -> None:
        """
        The server's event stream dropped and could not be opened again for
        ``ASK_SERVER_GONE`` seconds: its running asks would hear nothing more,
        so they end now, saying why and what the next ask does.  (A shorter gap,
        an opencode restarting, is bridged: ``_reconnected``.)
        """
        then = (
            "ask again: the next ask goes to another opencode server and starts afresh"
            if len(self.servers) > 1
            else "ask again once it is back"
        )
        for run in list(self.runs.values()):
            if run.finished or run.conversation.server is not server:
                continue
            if not run.conversation.session_id:
                continue  # still setting up: its own calls fail and say so
            log.info(
                "an ask on {traposId} lost its opencode server: {why}",
                traposId=cut(run.key[1]),
                why=error.message,
            )
            self._flush(run)
            self._finish(
                run,
                opencode_error(f"the agent's run was cut off: {error.message}; {then}"),
                "opencode_error",
            )

    def _check_status(self, statuses: Any, run: Run) -> None:
        status = statuses.get(run.conversation.session_id) if isinstance(statuses, dict) else None
        busy = isinstance(status, dict) and status.get("type") in ("busy", "retry")
        if not busy and not run.finished:
            run.started = True
            self._idle(run)

    # -- cancel and ask_permission ---------------------------------------------------------

    def cancel(self, account_id: str, trapos_id: str, message_id: Any) -> Deferred | None:
        """Abort the computer's ask ``message_id``; None if it has none such running."""
        run = self.runs.get((account_id, trapos_id))
        if run is None or run.message_id != message_id or run.finished:
            return None
        if not run.conversation.session_id:
            # Waiting its turn or still setting up: nothing reached opencode. It ends now, and
            # the set-up, which looks after each step whether its ask has ended, goes no further.
            waiting = run.ticket is not None and not run.ticket.admitted
            why = "while waiting for the agent" if waiting else "before the agent started"
            self._finish(run, GatewayError(errors.CANCELLED, f"cancelled {why}"), "cancelled")
            return succeed(None)
        grace = self._clock.callLater(limits.ASK_ABORT_GRACE, self._abort_unheard, run)
        run.done.addBoth(lambda result: (grace.active() and grace.cancel(), result)[1])
        return self._abort(run)

    def halt(self, account_id: str, trapos_id: str, error: GatewayError) -> bool:
        """
        The player stopped the agent on that computer (SPEC §16): its running
        ask ends now with ``error`` and opencode aborts the run; False when
        none was running.
        """
        run = self.runs.get((account_id, trapos_id))
        if run is None or run.finished:
            return False
        log.info("{traposId} was stopped by its player: ending its ask", traposId=cut(trapos_id))
        if run.conversation.session_id:
            self._abort(run)
        self._flush(run)
        self._finish(run, error, "cancelled")
        return True

    def _abort_unheard(self, run: Run) -> None:
        self._finish(
            run, GatewayError(errors.CANCELLED, "cancelled: the agent was stopped"), "cancelled"
        )

    def reply(self, account_id: str, trapos_id: str, permission_id: Any, response: Any) -> Deferred:
        if response not in PERMISSION_REPLIES:
            raise GatewayError(errors.BAD_REQUEST, "response must be once, always or reject")
        run = self._by_permission.get(permission_id) if type(permission_id) is str else None
        if run is None or run.key != (account_id, trapos_id):
            raise GatewayError(
                errors.BAD_REQUEST, "no permission request of this computer's ask has that id"
            )
        d = _client_of(run).reply_permission(run.conversation.directory, permission_id, response)

        def had(_: Any) -> None:  # forgotten only once opencode has it
            run.permissions.discard(permission_id)
            self._by_permission.pop(permission_id, None)

        return d.addCallbacks(had, _unheard)

    def answer(
        self, account_id: str, trapos_id: str, question_id: Any, answers: Any, reject: Any
    ) -> Deferred:
        """
        The player's answer to the agent's question ``question_id``: the
        labels picked (or text typed), one list per question, or ``reject``.
        """
        run = self._by_question.get(question_id) if type(question_id) is str else None
        if run is None or run.key != (account_id, trapos_id):
            raise GatewayError(errors.BAD_REQUEST, "no question of this computer's ask has that id")
        if reject is not True:
            if (
                type(answers) is not list
                or len(answers) != run.questions[question_id]
                or not all(_answer(answer) for answer in answers)
            ):
                raise GatewayError(
                    errors.BAD_REQUEST,
                    "answers must be a list with one list of strings for each question "
                    "(or reject: true)",
                )
        directory = run.conversation.directory
        if reject is True:
            d = _client_of(run).reject_question(directory, question_id)
        else:
            d = _client_of(run).reply_question(directory, question_id, answers)

        def had(_: Any) -> None:  # forgotten only once opencode has it
            run.questions.pop(question_id, None)
            self._by_question.pop(question_id, None)

        return d.addCallbacks(had, _unheard)

    def stop(self) -> Deferred:
        """
        The gateway stops: nothing new reaches opencode, running asks are aborted there and
        end telling their players; fires once opencode had the aborts (each call bounded).
        """
        self._stopping = True
        self.queue.stop()
        aborts = []
        for run in list(self.runs.values()):
            if run.conversation.session_id:
                aborts.append(self._abort(run))
            self._finish(run, GatewayError(errors.NOT_CONNECTED, "the gateway is shutting down"))
        for server in self.servers:
            server.stream.stop()
            server.instances.stop()
        return DeferredList(aborts, consumeErrors=True)


def _client_of(run: Run) -> OpencodeClient:
    """The client of the opencode server that keeps ``run``'s conversation."""
    server = run.conversation.server
    assert server is not None, "an ask reaches opencode only once its server is chosen"
    return server.client


def _logged(what: str) -> Callable[[Failure], None]:
    """An errback for a call whose failure only needs a log line."""
    return lambda failure: log.info(
        "{what} failed: {why}", what=what, why=cut(failure.getErrorMessage())
    )


def _unheard(failure: Failure) -> None:
    """A reply opencode did not take: the player is told, and may answer again."""
    why = explain(failure, "opencode").message
    raise GatewayError(errors.OPENCODE_ERROR, f"{why}; opencode did not get it: answer again")


def _answer(answer: Any) -> bool:
    """One question's answer: picked labels or typed text, each a bounded string."""
    return type(answer) is list and all(
        type(text) is str and 0 < len(text) <= limits.MAX_ASK_ANSWER_CHARS for text in answer
    )


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
