"""
``sandbox ask`` (SPEC §11): a computer's prompt runs as an opencode session,
its answer streamed back as partials, its permission requests put to the
player.

    computer                      gateway                          opencode
    ask {prompt, new?, yes?}  ->  (past the bound: waits its turn, ``queue``)
          <- partial {type: waiting, ahead}                        (once halved, each minute)
                                  (first ask of a computer)
                                  POST /mcp?directory=D            the computer's own MCP block
                                  POST /session?directory=D        rules: ask before changes
                                  POST /session/S/prompt_async ->  204
                                                               <-  GET /global/event (SSE)
          <- partial {type: text_delta, text}                      message.part.delta
          <- partial {type: tool, callID, name, status, detail?}   message.part.updated (tool)
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

An ask's life is the machine of ``run`` (where every way it ends is, and what
ending releases); opencode's events become its partials in ``partials``; the
player's replies reach opencode through ``replies``.  A computer that
disconnects ends its asks (``watch``); a stopping gateway (``stop``) lets no new
ask reach opencode and aborts the running ones there.

Events come from one stream per opencode server (``events``).  After a
reconnect, every running ask there asks opencode whether its session is still
busy (events in the gap are lost) and ends if not; when the stream cannot be
opened again for ``ASK_SERVER_GONE`` seconds, its running asks end saying so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList, TimeoutError, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.computers.wire import cut
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.agent import session_rules, system_note
from trapsandbox.opencode.client import explain, opencode_error
from trapsandbox.opencode.instances import REASONS
from trapsandbox.opencode.managed import State as ManagedState
from trapsandbox.opencode.partials import Partials
from trapsandbox.opencode.probe import redact
from trapsandbox.opencode.queue import AskQueue, Ticket
from trapsandbox.opencode.replies import Replies
from trapsandbox.opencode.run import Conversation, Emit, Ended, Run, logged
from trapsandbox.opencode.servers import Server, ranked
from trapsandbox.opencode.tokens import AskTokens
from trapsandbox.ops.metrics import Metrics, ServerFigures

if TYPE_CHECKING:
    from trapsandbox.computers.registry import Registry
    from trapsandbox.snapshots.askhook import AskSnapshots

log = Logger()

# Outcomes of an ask (metrics labels).
ASK_OUTCOMES = ("ok", "cancelled", "timeout", "opencode_error", "run_failed", "disconnected")

__all__ = ["ASK_OUTCOMES", "Asks", "Conversation", "Emit", "Run"]


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
        max_rss: int | None = None,
    ) -> None:
        """
        ``servers``: one per opencode server (``Server.build``), in OPENCODE_URL's order,
        their directories' MCP blocks holding ``tokens``; ``queue``: the bound on asks
        running at once; ``max_rss``: the memory past which a server the gateway runs is
        recycled (``managed``).
        """
        self._client = servers[0].client
        self._snapshots = snapshots
        self._clock = clock
        self.metrics = metrics
        self.metrics.ask_labels(ASK_OUTCOMES)
        # ``/mcp`` looks an ask's token up here (``tokens.scope_of``).
        self.tokens = tokens
        self.servers = list(servers)
        self._max_rss = max_rss
        self._draining: dict[Server, Any] = {}  # a recycle's drain, and its bound
        self._watching: dict[Server, LoopingCall] = {}  # memory looked at while asks run
        self._quiet: IDelayedCall | None = None  # no ask on the gateway since: ``_quiet_later``
        for server in self.servers:
            server.stream.on_reconnect.append(lambda server=server: self._reconnected(server))
            server.stream.on_gone.append(lambda error, server=server: self._gone(server, error))
            if server.managed is not None:
                # Back: its event stream opened now, not at the next step of its backoff.
                server.managed.on_ready.append(lambda server=server: self._back(server))
        # The first server's: what a gateway with one opencode server has.
        self.stream = self.servers[0].stream
        self.directories = self.servers[0].directories
        self.instances = self.servers[0].instances
        self.queue = queue
        self.replies = Replies()
        self._timeout = timeout
        self._max_conversations = max_conversations
        # account -> its computers' traposIds, the least recently asked first.
        self._recent: dict[str, dict[str, None]] = {}
        self.conversations: dict[tuple[str, str], Conversation] = {}
        self.runs: dict[tuple[str, str], Run] = {}
        self.stopping = False
        self._registry: Registry | None = None
        self.metrics.watch_asks(self.figures)

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
        """
        The computer's ask: its partials to ``emit``; ``session``, the computer's
        connection, ends it when the registry (``watch``) no longer holds it.
        """
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
        if self.stopping:
            raise GatewayError(errors.NOT_CONNECTED, "the gateway is shutting down")
        key = (account_id, trapos_id)
        if key in self.runs:
            raise GatewayError(
                errors.OVERLOADED, "an ask is already running on this computer: wait or cancel it"
            )
        run = Run(self, key, message_id, Conversation("", "", yes), emit, session)
        run.partials = partials = Partials(run, self._clock, self.replies)
        self.runs[key] = run  # claims the computer while the session is set up
        self._cancel_quiet()
        server: Server | None = None
        bug: Failure | None = None
        try:
            server = await run.guard(Deferred.fromCoroutine(self._server(run, new)))
            run.ticket = Ticket(server.url, account_id, partials.waiting)
            await run.guard(self.queue.enter(run.ticket).granted)
            run.admitted()
            if server.managed is not None:
                # Past its bound no new ask starts there: the asks it would let in meanwhile,
                # each a new instance, would carry it far past before one of them ends.
                self._recycle_if_due(server)
                await run.guard(self._agent_ready(run, server.managed))
            run.using = server  # from here on a recycle of it waits for this ask
            self._watch(server)
            ready = server.stream.ready().addTimeout(limits.ASK_STREAM_READY_TIMEOUT, self._clock)
            await run.guard(ready)
            await run.guard(server.has_model())
            run.conversation.server = server  # its instance is leased: given back at the end
            await run.guard(server.instances.use(key))
            run.conversation = await run.guard(
                Deferred.fromCoroutine(self._conversation(server, key, new, yes))
            )
            session_id = run.conversation.session_id
            run.prompting(
                server.stream.subscribe(session_id, partials.event),
                self._clock.callLater(self._timeout, run.timed_out, self._timeout),
            )
            await run.guard(
                server.client.prompt_async(
                    run.conversation.directory,
                    session_id,
                    prompt,
                    system_note(trapos_id, capabilities),
                )
            )
        except Ended:
            pass  # its answer is the one it ended with
        except Exception:
            failure = Failure()
            if not run.finished:
                if failure.check(TimeoutError) and server is not None:
                    where = server.client.where
                    error = opencode_error(f"opencode at {where}: its event stream did not open")
                else:
                    error = explain(failure, self._client.where)
                run.failed(error)
                if not failure.check(GatewayError, TimeoutError):
                    run.done.addErrback(lambda _: None)  # a bug, not opencode: raised as it is
                    bug = failure
        try:
            if bug is not None:
                bug.raiseException()  # (once the ask's end is seen to, below)
            result = await run.done
        finally:
            if server is not None and server.managed is not None:
                self._recycle_if_due(server)
            self._quiet_later()
        if self._snapshots is not None:
            result = await self._snapshots.closing(run, result)
        return result

    # -- opencode the gateway runs (``managed``) ---------------------------------------------

    def _agent_ready(self, run: Run, managed: Any) -> Deferred[None]:
        """Waits while the gateway's own opencode (re)starts or recycles, the player told."""
        if managed.taking_asks:
            return succeed(None)
        why = managed.unready()
        run.send({"type": "text_delta", "text": f"({why}: your ask waits for it)\n"})

        def late(failure: Failure) -> None:
            failure.trap(TimeoutError)
            raise opencode_error(
                f"{managed.unready() or why}: it did not answer within "
                f"{limits.OPENCODE_READY_WAIT:g} s"
            )

        d = managed.when_ready().addTimeout(limits.OPENCODE_READY_WAIT, self._clock)
        return d.addErrback(late)

    def _back(self, server: Server) -> None:
        """The opencode the gateway runs is ready, (re)started: a new process."""
        server.instances.forget_all()
        if not self.stopping:
            server.stream.reconnect()

    def _using(self, server: Server) -> list[Run]:
        """The asks using ``server`` (past waiting for it: set up there, or running)."""
        return [run for run in self.runs.values() if run.using is server]

    def _recycle_if_due(self, server: Server) -> None:
        """
        An ask on ``server`` ends, or is about to start: the natural moments to give its
        memory back.  Past ``max_rss`` it drains (no new ask starts there, ``managed``), and
        once no ask runs there, or ``OPENCODE_DRAIN_BOUND`` has passed, it is recycled; one
        at a time.
        """
        managed = server.managed
        if self.stopping:
            return
        for each in [s for s in self._draining if s.managed.state is not ManagedState.DRAINING]:
            self._undrain(each)  # it ended (and restarts) while it drained: nothing to recycle
        using = self._using(server)
        if not using:
            self._unwatch(server)
        if server not in self._draining:
            if self._draining or not managed.too_large(self._max_rss):
                return
            managed.drain()
            self._draining[server] = self._clock.callLater(
                limits.OPENCODE_DRAIN_BOUND, self._drain_bound, server
            )
        if not using:
            self._recycle(server)

    def _watch(self, server: Server) -> None:
        """
        While asks run on a server the gateway runs, its memory is also looked at every
        ``OPENCODE_RSS_CHECK_EVERY``: the asks running there, each maybe a new instance, can
        carry it far past its bound before one of them ends (bench.askmanaged: 8-33 s above
        the bound and one instance, checked only as asks started and ended).
        """
        if server.managed is None or self._max_rss is None or server in self._watching:
            return
        loop = self._watching[server] = LoopingCall(self._recycle_if_due, server)
        loop.clock = self._clock
        loop.start(limits.OPENCODE_RSS_CHECK_EVERY, now=False)

    def _unwatch(self, server: Server) -> None:
        loop = self._watching.pop(server, None)
        if loop is not None and loop.running:
            loop.stop()

    def _quiet_later(self) -> None:
        """
        No ask left on the gateway: once none has run for ``OPENCODE_QUIET_RECYCLE_AFTER``,
        a server it runs past ``OPENCODE_QUIET_RECYCLE_SHARE`` of its bound is started afresh
        (one at a time), a moment that costs nobody anything.
        """
        self._cancel_quiet()
        if self.runs or self.stopping or self._max_rss is None:
            return
        if any(server.managed is not None for server in self.servers):
            self._quiet = self._clock.callLater(
                limits.OPENCODE_QUIET_RECYCLE_AFTER, self._recycle_quiet
            )

    def _cancel_quiet(self) -> None:
        if self._quiet is not None and self._quiet.active():
            self._quiet.cancel()
        self._quiet = None

    def _recycle_quiet(self) -> None:
        self._quiet = None
        if self.runs or self.stopping or self._draining or self._max_rss is None:
            return
        most = int(self._max_rss * limits.OPENCODE_QUIET_RECYCLE_SHARE)
        for server in self.servers:
            managed = server.managed
            if managed is not None and managed.too_large(most):
                log.info(
                    "{name}: no ask for {after:g} s, and past {share:.0%} of its memory bound: "
                    "starting it afresh",
                    name=managed.name,
                    after=limits.OPENCODE_QUIET_RECYCLE_AFTER,
                    share=limits.OPENCODE_QUIET_RECYCLE_SHARE,
                )
                managed.recycle()
                self._quiet_later()  # the next one, if still quiet then
                return

    def _drain_bound(self, server: Server) -> None:
        if server.managed.state is not ManagedState.DRAINING:
            self._undrain(server)
            return
        error = opencode_error(
            "the agent is restarting to give back its memory: ask again (the conversation is kept)"
        )
        for run in self._using(server):
            run.end(error, "opencode_error", abort=True)
        self._recycle(server)

    def _undrain(self, server: Server) -> None:
        timer = self._draining.pop(server, None)
        if timer is not None and timer.active():
            timer.cancel()

    def _recycle(self, server: Server) -> None:
        self._undrain(server)
        server.managed.recycle()

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
                run.send(
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

    # -- The events of a run's machine that come from outside it ---------------------------

    def watch(self, registry: Registry) -> None:
        """Follow ``registry``'s computers: an ask ends when its computer's connection does."""
        self._registry = registry
        registry.watch(self._computers_changed)

    def _computers_changed(self) -> None:
        assert self._registry is not None
        for run in list(self.runs.values()):
            if run.session is not None and self._registry.find(*run.key) is not run.session:
                run.disconnected()

    def _reconnected(self, server: Server) -> None:
        """Events were lost while the stream was down: end the asks whose session is idle."""
        for run in list(self.runs.values()):
            if not run.prompted or run.conversation.server is not server:
                continue
            d = server.client.statuses(run.conversation.directory)
            d.addCallback(_check_status, run)
            d.addErrback(logged("status check"))

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
            # (One still setting up: its own calls fail and say so.)
            if run.prompted and run.conversation.server is server:
                run.server_lost(
                    opencode_error(f"the agent's run was cut off: {error.message}; {then}")
                )

    def cancel(self, account_id: str, trapos_id: str, message_id: Any) -> Deferred | None:
        """Abort the computer's ask ``message_id``; None if it has none such running."""
        run = self.runs.get((account_id, trapos_id))
        if run is None or run.message_id != message_id or run.finished:
            return None
        return run.cancel(limits.ASK_ABORT_GRACE, self._clock)

    def halt(self, account_id: str, trapos_id: str, error: GatewayError) -> bool:
        """
        The player stopped the agent on that computer (SPEC §16): its running
        ask ends now with ``error`` and opencode aborts the run; False when
        none was running.
        """
        run = self.runs.get((account_id, trapos_id))
        if run is None or run.finished:
            return False
        run.halted(error)
        return True

    def reply(self, account_id: str, trapos_id: str, permission_id: Any, response: Any) -> Deferred:
        return self.replies.reply((account_id, trapos_id), permission_id, response)

    def answer(
        self, account_id: str, trapos_id: str, question_id: Any, answers: Any, reject: Any
    ) -> Deferred:
        return self.replies.answer((account_id, trapos_id), question_id, answers, reject)

    def stop(self) -> Deferred:
        """
        The gateway stops: nothing new reaches opencode, running asks are aborted
        there and end telling their players, no timer is left; fires once opencode
        had the aborts and answered every call in flight (each call bounded).
        """
        self.stopping = True
        self._cancel_quiet()
        for timer in self._draining.values():
            if timer.active():
                timer.cancel()
        self._draining.clear()
        self.queue.stop()
        for server in list(self._watching):
            self._unwatch(server)
        for run in list(self.runs.values()):
            run.stopping()
        for server in self.servers:
            server.stream.stop()
            server.instances.forget_all()
        return DeferredList([server.client.settled() for server in self.servers])


def _check_status(statuses: Any, run: Run) -> None:
    status = statuses.get(run.conversation.session_id) if isinstance(statuses, dict) else None
    busy = isinstance(status, dict) and status.get("type") in ("busy", "retry")
    if not busy and not run.finished and run.partials is not None:
        run.partials.started = True
        run.partials.idle()
