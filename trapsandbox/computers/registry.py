"""
The registry of connected computers: which one a request goes to.

A computer is registered once its ``hello`` succeeds, under
``(accountId, traposId)``; the newest connection wins and the one it
replaces is closed with 4000.  ``Registry.request`` finds the computer a
caller is aimed at (here, or in cluster mode another process, ``Peers``) and
sends the request on its ``session.Session`` (where each request's lifetime
is), its ``hooks`` run around it in order: the account's quota of watches,
a screen watch's pacing, the metrics, the file listeners, the activity feed
(``activity``).  Watchers of the listing (``watch``) are told when a computer
connects, disconnects or changes what it allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from trapsandbox import errors, limits
from trapsandbox.admission.tally import Tally
from trapsandbox.computers import wire
from trapsandbox.computers.activity import ActivityFeed
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.hooks import Call, FileListener, RequestHook, by_type, standard_hooks
from trapsandbox.computers.session import PartialListener, Session
from trapsandbox.computers.streams import StreamBudget
from trapsandbox.errors import GatewayError
from trapsandbox.ops.metrics import Metrics

log = Logger()


class Peers(Protocol):
    """
    Other gateway processes (cluster mode, ``trapsandbox.cluster.member``): told of
    the computers registered here, asked for the ones that are not.
    """

    def added(self, session: Session) -> None: ...

    def removed(self, session: Session) -> None: ...

    def request(
        self,
        caller: Caller,
        type: str,
        payload: dict[str, Any],
        timeout: float,
        on_partial: PartialListener | None,
    ) -> Deferred:
        """Fires like ``Session.request``, for a computer held by another process."""

    def holds(self, account_id: str, trapos_id: str) -> Deferred[bool]:
        """Fires with whether another process holds the computer."""

    def claim_answered(self, session: Session) -> Deferred[None] | None:
        """
        While the claim of ``session``'s computer is out, a Deferred that fires (never
        fails) once it is answered, when the other processes find it here; else None.
        """


@attrs.define
class Registry:
    """Connected computers by ``(accountId, traposId)``: newest wins."""

    clock: IReactorTime
    request_timeout: float = limits.DEFAULT_REQUEST_TIMEOUT
    metrics: Metrics = attrs.field(factory=Metrics, repr=False)
    # Cluster mode: the other processes; None (one process) changes nothing.
    peers: Peers | None = attrs.field(default=None, repr=False)
    # Every long-lived stream, counted per account (screen and event watches, activity).
    streams: StreamBudget = attrs.field(factory=StreamBudget, repr=False)
    _sessions: dict[tuple[str, str], Session] = attrs.field(factory=dict, init=False)
    # traposId -> the accounts holding it, and account -> how many computers it has.
    _holders: dict[str, set[str]] = attrs.field(factory=dict, init=False)
    _per_account: Tally = attrs.field(factory=Tally, init=False)
    # Called after a computer connects, disconnects or changes its capabilities.
    _watchers: list[Callable[[], None]] = attrs.field(factory=list, init=False)
    # Whoever must hear of a file changed through any surface (MCP's file subscribers).
    file_listeners: list[FileListener] = attrs.field(factory=list, init=False)
    # Each computer's activity (SPEC §14): its watchers, and what the gateway itself does there.
    activity: ActivityFeed = attrs.field(init=False)
    # What runs around every request, in order (``hooks.standard_hooks``), and those of
    # them each type runs (``hooks.by_type``).
    hooks: list[RequestHook] = attrs.field(init=False)
    _hooks_of: dict[str, tuple[RequestHook, ...]] = attrs.field(init=False)
    _hooks_of_others: tuple[RequestHook, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.metrics.request_types(wire.REQUEST_TYPES)
        self.activity = ActivityFeed(self.clock, self.streams)
        self.hooks = standard_hooks(
            self.clock, self.metrics, self.streams, self.file_listeners, self.activity
        )
        self._hooks_of, self._hooks_of_others = by_type(self.hooks)

    def watch(self, listener: Callable[[], None]) -> Callable[[], None]:
        """
        Call ``listener`` after each change to the listing (a computer
        connects, disconnects or changes what it allows); answers the
        function that stops it.
        """
        self._watchers.append(listener)
        return lambda: self._watchers.remove(listener) if listener in self._watchers else None

    def follow_activity(self, caller: Caller, listener: PartialListener) -> Deferred:
        """
        ``activity.watch`` while the computer is connected here (another
        process's watch, ``cluster.relay``): a Deferred that fails with
        ``not_connected`` when it is not, or once it leaves (or is
        replaced); cancelling it stops the watch.
        """
        account_id, trapos_id = caller.key
        session = self.find(account_id, trapos_id)
        if session is None:
            return fail(wire.not_connected(trapos_id))
        try:
            stop_activity = self.activity.watch(caller, listener)
        except GatewayError as error:
            return fail(error)

        def stop() -> None:
            stop_activity()
            stop_listing()

        def left() -> None:
            if self.find(account_id, trapos_id) is not session and not d.called:
                stop()
                d.errback(GatewayError(errors.NOT_CONNECTED, f"{wire.cut(trapos_id)} disconnected"))

        d = Deferred(lambda _: stop())
        stop_listing = self.watch(left)
        return d

    def _changed(self) -> None:
        for listener in list(self._watchers):
            try:
                listener()
            except Exception:
                log.failure("a watcher of the computers failed")

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def accounts_holding(self, trapos_id: str) -> list[str]:
        """The accounts with a computer ``trapos_id`` connected, sorted."""
        return sorted(self._holders.get(trapos_id, ()))

    def count(self, account_id: str) -> int:
        """How many computers ``account_id`` has connected."""
        return self._per_account[account_id]

    def counts(self) -> dict[str, int]:
        """Connected computers by account (accounts with none left out)."""
        return dict(self._per_account.held)

    def of_account(self, account_id: str | None) -> list[Session]:
        """The computers of ``account_id`` (None: every account's)."""
        if account_id is None:
            return list(self._sessions.values())
        return [s for s in self._sessions.values() if s.account_id == account_id]

    def add(self, session: Session) -> Session | None:
        """Register ``session``; close and return the one it replaces, if any."""
        old = self._sessions.get(session.key)
        self._sessions[session.key] = session
        session.on_change = self._changed
        if old is None:
            self._holders.setdefault(session.trapos_id, set()).add(session.account_id)
            self._per_account.take(session.account_id)
        if self.peers is not None:
            self.peers.added(session)
        if old is not None and old is not session:
            log.info(
                "{traposId} from {peer} replaces its connection from {oldPeer}",
                traposId=session.trapos_id,
                peer=session.peer,
                oldPeer=old.peer,
            )
            old.fail_all(
                GatewayError(errors.NOT_CONNECTED, "the computer connected again elsewhere")
            )
            old.link.close(wire.CLOSE_REPLACED, "replaced")
            old.on_change = None
            self._changed()
            return old
        self._changed()
        return None

    def remove(self, session: Session) -> None:
        """Forget ``session`` (if it is still the registered one) and fail its requests."""
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
            holders = self._holders[session.trapos_id]
            holders.discard(session.account_id)
            if not holders:
                del self._holders[session.trapos_id]
            self._per_account.give_back(session.account_id)
            if self.peers is not None:
                self.peers.removed(session)
            session.on_change = None
            self._changed()
        session.fail_all(GatewayError(errors.NOT_CONNECTED, "the computer disconnected"))

    @property
    def pending(self) -> int:
        """Requests to computers waiting for an answer."""
        return sum(session.in_flight for session in self._sessions.values())

    def connected(self, account_id: str, trapos_id: str) -> Deferred[bool]:
        """Whether the computer is connected, here or (cluster mode) to another process."""
        if self.find(account_id, trapos_id) is not None:
            return succeed(True)
        if self.peers is None:
            return succeed(False)
        return self.peers.holds(account_id, trapos_id)

    def find(self, account_id: str, trapos_id: str) -> Session | None:
        return self._sessions.get((account_id, trapos_id))

    def findable(self, session: Session) -> Deferred[None] | None:
        """
        Cluster mode: until the other processes can find ``session`` (just added), a
        Deferred that fires once they can, or once claiming it failed (it works here,
        and the refresh claims it later); None when they already can or there are none.
        """
        return None if self.peers is None else self.peers.claim_answered(session)

    def features(self, caller: Caller) -> frozenset[str] | None:
        """What the client of the computer ``caller`` is aimed at announced in hello
        (``wire.FEATURES``); None when this process does not hold it (cluster mode)."""
        session = self._sessions.get(caller.key)
        return None if session is None else session.features

    def request(
        self,
        caller: Caller,
        type: str,
        payload: dict[str, Any] | None = None,
        timeout: float | None = None,
        on_partial: PartialListener | None = None,
    ) -> Deferred:
        """
        Send a ``gateway_request`` to the computer ``caller`` is aimed at
        (``Caller.at``), here or held by another process, its ``hooks`` around
        it; fires with the final ``ComputerResponse`` (``Session.request``).
        """
        account_id, trapos_id = caller.key
        session = self.find(account_id, trapos_id)
        call = Call(
            caller, type, payload or {}, on_partial, session is None and self.peers is not None
        )
        ends = []
        try:
            for hook in self._hooks_of.get(type, self._hooks_of_others):
                end = hook.start(call)
                if end is not None:
                    ends.append(end)
        except GatewayError as refusal:
            return fail(refusal)
        d = self._send(session, call, timeout)
        for end in ends:
            end(d)
        return d

    def _send(self, session: Session | None, call: Call, timeout: float | None) -> Deferred:
        if session is None and self.peers is not None and (timeout is None or timeout > 0):
            return self.peers.request(
                call.caller,
                call.type,
                call.payload,
                self.request_timeout if timeout is None else timeout,
                call.on_partial,
            )
        if session is None:
            return fail(wire.not_connected(call.caller.key[1]))
        if timeout is not None and not timeout > 0:
            return fail(GatewayError(errors.BAD_REQUEST, "timeout must be positive"))
        if timeout is None:
            timeout = self.request_timeout
        return session.request(call.type, call.payload, timeout, call.on_partial)
