"""
One ask's life (issue 44) as one explicit state machine: every state, every
event, and what an ask holds and gives back, in this file.

    state     event                                   next      what it does
    QUEUED    admitted (``queue``)                    OPENING   holds a queue and an account slot
    OPENING   the prompt goes out                     RUNNING   listens to its session's events,
                                                                arms the ``ASK_TIMEOUT`` bound
    RUNNING   a permission request or a question      WAITING   the player is asked (``replies``)
    WAITING   opencode took the player's last reply   RUNNING
    RUNNING,  opencode's session goes idle            ENDED     ok, run_failed, or cancelled
    WAITING                                                     (after a cancel's abort)
    any live  cancel                                  ENDED     before the prompt: at once;
                                                                after it: ``/abort``, and ENDED at
                                                                opencode's idle or the grace
    any live  halt (``sandbox stop``)                 ENDED     cancelled; ``/abort``
    any live  the gateway stops                       ENDED     ``/abort``; the player told
    any live  its computer disconnects                ENDED     disconnected; ``/abort``
    any live  the ``ASK_TIMEOUT`` bound               ENDED     timeout; ``/abort``
    RUNNING,  its opencode server is lost             ENDED     opencode_error (none to abort)
    WAITING
    QUEUED,   a set-up step fails                     ENDED     opencode_error
    OPENING

``/abort`` goes out only once the prompt may have reached opencode.  Ending, from
any state, releases in one place (``Run.end``): the asks' entry of its computer,
its queue and account slot, its instance lease (``instances.done``), its open
permission requests and questions, its timers (the bound, the text batch, the
permission details, a cancel's grace), its event listener, the set-up step it
awaits (its wait fails: the set-up goes no further; the call itself runs
on to its own bound, unheard), its metrics (outcome, tokens),
and its answer.  An event that reaches an ended ask does nothing.

A plain state enum rather than Automat: every ending event releases the same
things from every live state, so Automat's table (inputs × states, each row
naming the same output) would say less than the table above; the few
forward transitions are guarded one-line methods; and the set-up is a
coroutine whose steps Automat's synchronous outputs could not await.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors
from trapsandbox.computers.wire import cut
from trapsandbox.errors import GatewayError

if TYPE_CHECKING:
    from trapsandbox.opencode.partials import Partials
    from trapsandbox.opencode.queue import AskQueue, Ticket
    from trapsandbox.opencode.replies import Replies
    from trapsandbox.opencode.servers import Server
    from trapsandbox.ops.metrics import Metrics

log = Logger()

Emit = Callable[[dict[str, Any]], None]


class State(enum.Enum):
    QUEUED = "queued"
    OPENING = "opening"
    RUNNING = "running"
    WAITING = "waiting for the player"
    ENDED = "ended"


LIVE = frozenset({State.QUEUED, State.OPENING, State.RUNNING, State.WAITING})


class Owner(Protocol):
    """What a run gives back to when it ends (``asks.Asks``)."""

    runs: dict[tuple[str, str], Run]
    queue: AskQueue
    replies: Replies
    metrics: Metrics


@attrs.define(eq=False)
class Conversation:
    """The opencode session of one computer."""

    session_id: str
    directory: str
    yes: bool
    # The opencode server that keeps it (None: not set up yet).
    server: Server | None = None


class Ended(CancelledError):
    """The ask ended while its set-up awaited a step (``Run.guard``)."""


@attrs.define(eq=False)
class Run:
    """One ask, from the moment it claims its computer to its answer."""

    owner: Owner
    key: tuple[str, str]
    message_id: str
    conversation: Conversation
    emit: Emit
    # The connection of the computer it runs on (None: not followed): the ask ends
    # when the registry no longer holds it (``Asks.watch``).
    session: Any = None
    state: State = State.QUEUED
    done: Deferred = attrs.field(factory=Deferred)
    # opencode's events to partials (``partials``): set as it is made.
    partials: Partials | None = None
    # The prompt may have reached opencode: ending it needs an ``/abort``.
    prompted: bool = False
    aborted: bool = False
    # Its place in the queue (``queue``): None until it enters.
    ticket: Ticket | None = None
    # The opencode server it sets up and runs on, once past waiting for it to answer
    # (``Asks._agent_ready``): a recycle of that server waits for the asks using it.
    using: Server | None = None
    # The snapshot before its first change (``snapshots.askhook``): None until then.
    snapshot: Deferred | None = None
    # What it holds until it ends.
    bound: Any = None
    grace: Any = None
    unsubscribe: Callable[[], None] | None = None
    step: Deferred | None = None  # the set-up step it awaits

    @property
    def finished(self) -> bool:
        return self.state is State.ENDED

    # -- Forward ---------------------------------------------------------------------------

    def guard(self, d: Deferred) -> Deferred:
        """
        ``d`` as the set-up awaits it: ending the ask fails the wait with ``Ended`` (``d``
        itself runs on, unheard), and an ask that has ended awaits nothing more.
        """
        if self.finished:
            d.addErrback(lambda _: None)  # unheard: its failure is nobody's
            raise Ended("the ask ended")
        step: Deferred = Deferred()

        def passed(result: Any) -> None:
            if step.called:  # ended meanwhile: the result is nobody's
                return
            if isinstance(result, Failure):
                step.errback(result)
            else:
                step.callback(result)

        d.addBoth(passed)
        self.step = step
        return step

    def admitted(self) -> None:
        self._move(State.QUEUED, State.OPENING)

    def prompting(self, unsubscribe: Callable[[], None], bound: Any) -> None:
        """The prompt goes out now: its events are heard, its time bounded."""
        self._move(State.OPENING, State.RUNNING)
        self.unsubscribe, self.bound = unsubscribe, bound
        self.prompted = True

    def asked_player(self) -> None:
        if self.state is State.RUNNING:
            self.state = State.WAITING

    def player_answered(self) -> None:
        if self.state is State.WAITING and not self.owner.replies.open_for(self):
            self.state = State.RUNNING

    def _move(self, was: State, to: State) -> None:
        if self.finished:
            raise Ended("the ask ended")
        if self.state is not was:  # a step out of order: a bug, not an ending
            raise RuntimeError(f"an ask {self.state.value} cannot become {to.value}")
        self.state = to

    # -- Sending ---------------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        """A partial to the player; a computer gone meanwhile ends the ask."""
        if self.finished:
            return
        try:
            self.emit(message)
        except GatewayError:
            self.disconnected()

    # -- Ending: every way an ask ends ------------------------------------------------------

    def idle(self, error: dict[str, Any] | None, result: dict[str, Any], failed: Any) -> None:
        """opencode's session went idle: ``result``, or how ``error`` ended it."""
        if error is not None and (self.aborted or error.get("name") == "MessageAbortedError"):
            self.end(cancelled("cancelled: the agent was stopped"), "cancelled")
        elif error is not None:
            self.end(failed, "run_failed")
        else:
            self.end(result, "ok")

    def cancel(self, grace: float, clock: Any) -> Deferred:
        """The player's cancel: before the prompt it ends now; after, once opencode says so."""
        if not self.prompted:
            waiting = self.state is State.QUEUED
            why = "while waiting for the agent" if waiting else "before the agent started"
            self.end(cancelled(f"cancelled {why}"), "cancelled")
            return succeed(None)
        if self.grace is None:
            self.grace = clock.callLater(grace, self.end, cancelled(), "cancelled")
        return self.abort()

    def halted(self, error: GatewayError) -> None:
        log.info("{traposId} was stopped by its player: ending its ask", traposId=cut(self.key[1]))
        self.end(error, "cancelled", abort=True)

    def stopping(self) -> None:
        """The gateway stops (which waits for the ``/abort`` sent, as for every call)."""
        self.end(GatewayError(errors.NOT_CONNECTED, "the gateway is shutting down"), abort=True)

    def disconnected(self) -> None:
        log.info("{traposId} left during an ask: aborting it", traposId=cut(self.key[1]))
        self.end(
            GatewayError(errors.NOT_CONNECTED, "the computer left"), "disconnected", abort=True
        )

    def timed_out(self, timeout: float) -> None:
        self.bound = None
        log.info(
            "an ask on {traposId} ran past {timeout:g} s: aborting",
            traposId=cut(self.key[1]),
            timeout=timeout,
        )
        minutes = f"{timeout / 60:g} minutes"
        self.end(
            GatewayError(errors.TIMEOUT, f"the agent did not finish within {minutes}"),
            "timeout",
            abort=True,
        )

    def server_lost(self, error: GatewayError) -> None:
        log.info(
            "an ask on {traposId} lost its opencode server: {why}",
            traposId=cut(self.key[1]),
            why=error.message,
        )
        self.end(error, "opencode_error")

    def failed(self, error: GatewayError) -> None:
        """A set-up step failed (the ask reached opencode no further)."""
        self.end(error, "opencode_error")

    def end(self, result: Any, outcome: str | None = None, *, abort: bool = False) -> None:
        """
        The one way out: release everything it holds, then answer ``result``;
        ``abort``: stop the run in opencode too.
        """
        if self.finished:
            return
        if self.partials is not None:
            self.partials.flush()  # what the agent said so far reaches the player first
            if self.finished:  # ... unless the computer left meanwhile: that ended it
                return
        self.state = State.ENDED
        owner = self.owner
        if owner.runs.get(self.key) is self:
            del owner.runs[self.key]
            if self.conversation.server is not None:
                self.conversation.server.instances.done(self.key)
        if self.ticket is not None:
            owner.queue.leave(self.ticket)
        owner.replies.forget(self)
        if self.partials is not None:
            self.partials.close()
        for timer in (self.bound, self.grace):
            if timer is not None and timer.active():
                timer.cancel()
        if self.unsubscribe is not None:
            self.unsubscribe()
        if abort and self.prompted:
            self.abort()
        if self.step is not None and not self.step.called:
            self.step.errback(Ended("the ask ended"))
        if outcome is not None:
            owner.metrics.ask(outcome)
            used = self.partials.used() if self.partials is not None else (0, 0)
            owner.metrics.ask_tokens(*used)
        if isinstance(result, Exception):
            self.done.errback(result)
        else:
            self.done.callback(result)

    def abort(self) -> Deferred:
        """``POST /session/S/abort`` (its failure is only logged)."""
        self.aborted = True
        server = self.conversation.server
        assert server is not None, "an ask reaches opencode only once its server is chosen"
        d = server.client.abort(self.conversation.directory, self.conversation.session_id)
        d.addErrback(logged("abort"))
        return d


def cancelled(why: str = "cancelled: the agent was stopped") -> GatewayError:
    return GatewayError(errors.CANCELLED, why)


def logged(what: str) -> Callable[[Failure], None]:
    """An errback for a call whose failure only needs a log line."""
    return lambda failure: log.info(
        "{what} failed: {why}", what=what, why=cut(failure.getErrorMessage())
    )
