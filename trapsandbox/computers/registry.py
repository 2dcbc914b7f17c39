"""
The registry of connected computers, and the lifetime of requests sent to them.

A computer is registered once its ``hello`` succeeds, under
``(accountId, traposId)``; the newest connection wins and the one it
replaces is closed with 4000.  A request to a computer is a Deferred that
fires with the computer's final ``ComputerResponse`` (even one with ``ok``
false), or fails with a ``GatewayError``: ``timeout``, ``not_connected`` when
its connection closes, ``overloaded``, ``too_large``, ``bad_request``,
``forbidden`` (refused before sending: the computer has not allowed that
capability, or a file request names its settings file).  Partial responses
before the final one go to a listener the caller gives, in order; one for a
finished request is ignored.  Only a response arriving on the connection the
request went out on resolves it.  A listener may end its request by raising
``GatewayError`` (the request then fails with it, and is cancelled on the
computer): a ``screen_watch``'s frames pass through a ``screen.ScreenGate``,
which does so for a frame too large to relay, and paces them to the watch's
``maxFps``.

The watches an account's token holds open at once (``WATCHES``, and
``watch_activity``; the account is the caller's sender's, ``callers.Sender``) are
counted in the one budget of every long-lived stream (``streams.StreamBudget``,
shared with MCP's subscription streams): past its bound a new one fails with
``too_many_watches``, so what one account's watchers cost does not grow without
bound.  The admin's are not counted, as its ``/operator`` sockets are not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.admission.tally import Tally
from trapsandbox.computers import settingsfile, wire
from trapsandbox.computers.callers import Caller, Sender
from trapsandbox.computers.screen import ScreenGate, max_fps
from trapsandbox.computers.streams import ACTIVITY, SCREEN_AND_EVENT, StreamBudget
from trapsandbox.errors import GatewayError
from trapsandbox.ops.metrics import Metrics

log = Logger()


class Link(Protocol):
    """What a session needs of its connection."""

    def send_frame(self, data: bytes) -> None:
        """Send one message; raise ``GatewayError(not_connected)`` if closed."""

    def close(self, code: int, reason: str) -> None:
        """Start a close handshake."""

    def send_partial(self, message_id: str, type: str, payload: dict[str, Any]) -> None:
        """Send a partial ``gateway_response``; raise ``GatewayError(not_connected)`` if closed."""


PartialListener = Callable[[dict[str, Any]], None]
# The streams a computer runs until cancelled, counted per account (``Registry.request``).
WATCHES = frozenset({"screen_watch", "peripheral_events"})
# Told (account, traposId, path) after a write or delete through the gateway changed a file.
FileListener = Callable[[str, str, str], None]


def _changed_path(kind: str, payload: dict[str, Any]) -> str | None:
    """The path a request changes once it succeeds: a delete, or a write's last part."""
    path = payload.get("path")
    if kind not in ("write_file", "delete_file") or type(path) is not str:
        return None
    part = payload.get("part")
    if kind == "write_file" and isinstance(part, dict) and part.get("final") is not True:
        return None
    return path


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


@attrs.define(eq=False)
class _Pending:
    deferred: Deferred
    type: str
    on_partial: PartialListener | None
    # The timeout's call, cancelled when the request ends otherwise.
    timer: Any = None


@attrs.define(eq=False)
class Session:
    """One authenticated computer connection and its requests in flight."""

    account_id: str
    trapos_id: str
    link: Link
    clock: IReactorTime
    peer: str = ""
    version: str | None = None
    connected_at: float = 0.0
    # What the computer's owner allowed (wire.CAPABILITIES); announced in hello
    # and again with a ``capabilities`` request when it changes.
    capabilities: frozenset[str] = frozenset()
    # What its client announced it does (``wire.FEATURES``) in hello.
    features: frozenset[str] = frozenset()
    # Why its player stopped the agent there (``sandbox stop``, SPEC §16), None while it is
    # not: announced in hello and with a ``stopped`` request; requests needing a capability
    # are refused with it until the computer says it resumed.
    stopped: str | None = None
    # The SHA-256 of the secret it was admitted with: a reload that changes
    # its account's secret closes it (``Admission.admits``).
    credential: str = attrs.field(default="", repr=False)
    max_in_flight: int = limits.MAX_IN_FLIGHT
    # Told when what ``describe_session`` shows changes (``Registry.watch``); set by the registry.
    on_change: Callable[[], None] | None = attrs.field(default=None, repr=False)
    _pending: dict[str, _Pending] = attrs.field(factory=dict, init=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.account_id, self.trapos_id)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def allow(self, capabilities: frozenset[str]) -> bool:
        """What its owner now allows (a ``capabilities`` request); whether it changed
        (then watchers are told)."""
        changed = capabilities != self.capabilities
        self.capabilities = capabilities
        return self._told(changed)

    def halt(self, stopped: str | None) -> bool:
        """Its player stopped the agent (why) or resumed it (None); whether it changed
        (then watchers are told)."""
        changed = stopped != self.stopped
        self.stopped = stopped
        return self._told(changed)

    def _told(self, changed: bool) -> bool:
        if changed and self.on_change is not None:
            self.on_change()
        return changed

    def refusal(self, type: str, payload: dict[str, Any]) -> GatewayError | None:
        """
        Why this computer must not be sent this request, if it must not: its
        player stopped the agent, a capability its owner has not allowed, or
        a file request on its settings file (which holds its credential).
        """
        capability = wire.CAPABILITY_OF.get(type)
        if capability is not None and self.stopped is not None:
            return GatewayError(errors.STOPPED, self.stopped)
        if capability is None or capability in self.capabilities:
            return settingsfile.refusal(type, payload)
        return wire.not_allowed(self.trapos_id, capability)

    def request(
        self,
        type: str,
        payload: dict[str, Any],
        timeout: float,
        on_partial: PartialListener | None = None,
    ) -> Deferred:
        """
        Send a ``gateway_request``.  The Deferred fires with the final
        ``ComputerResponse``; ``on_partial`` is called with the payload of each
        partial response before it (raising ``GatewayError`` ends the
        request with it).  Cancelling the Deferred forgets the request and, for a type that
        runs on the computer, cancels it there.
        """
        refusal = self.refusal(type, payload)
        if refusal is not None:
            return fail(refusal)
        if len(self._pending) >= self.max_in_flight:
            return fail(
                GatewayError(
                    errors.OVERLOADED,
                    f"{self.trapos_id} already has {self.max_in_flight} requests in flight",
                )
            )
        message_id = wire.new_message_id()
        try:
            data = wire.encode_request(self.trapos_id, message_id, type, payload)
        except (ValueError, TypeError) as error:
            return fail(GatewayError(errors.BAD_REQUEST, f"cannot send this request: {error}"))
        if len(data) > limits.MAX_OUTBOUND_BYTES:
            return fail(
                GatewayError(
                    errors.TOO_LARGE,
                    f"request is {len(data)} bytes; a computer accepts at most "
                    f"{limits.MAX_OUTBOUND_BYTES}",
                )
            )
        d = Deferred(lambda _: self._cancelled(message_id))
        timer = self.clock.callLater(timeout, self._timed_out, message_id, timeout)
        self._pending[message_id] = _Pending(d, type, on_partial, timer)
        try:
            self.link.send_frame(data)
        except GatewayError as error:
            self._fail(message_id, error)
        return d

    def _end(self, message_id: str) -> _Pending | None:
        """Forget a request that ends now (its timer too); None if it already had."""
        pending = self._pending.pop(message_id, None)
        if pending is not None and pending.timer.active():
            pending.timer.cancel()
        return pending

    def _stop_on_computer(self, message_id: str, pending: _Pending) -> None:
        if pending.type in wire.STREAMING:
            self.request("cancel", {"messageId": message_id}, limits.CANCEL_TIMEOUT).addErrback(
                _ignore
            )

    def _cancelled(self, message_id: str) -> None:
        # The Deferred then fails with CancelledError.
        pending = self._end(message_id)
        if pending is not None:
            self._stop_on_computer(message_id, pending)

    def _abort(self, message_id: str, error: GatewayError) -> None:
        """End a request the gateway gives up on: here, on the computer, and for its caller."""
        pending = self._end(message_id)
        if pending is not None:
            self._stop_on_computer(message_id, pending)
            pending.deferred.errback(Failure(error))

    def _timed_out(self, message_id: str, timeout: float) -> None:
        self._abort(
            message_id,
            GatewayError(errors.TIMEOUT, f"no answer from the computer within {timeout:g} s"),
        )

    def _fail(self, message_id: str, error: GatewayError) -> None:
        pending = self._end(message_id)
        if pending is not None:
            pending.deferred.errback(Failure(error))

    def resolve(self, frame: wire.ComputerResponse) -> bool:
        """Deliver a response to the request it answers; False if there is none."""
        if frame.partial:
            pending = self._pending.get(frame.message_id)
            if pending is None:
                return False
            if pending.on_partial is not None and frame.ok and frame.payload is not None:
                try:
                    pending.on_partial(frame.payload)
                except GatewayError as error:
                    # The listener ends it (a frame too large to relay).
                    self._abort(frame.message_id, error)
                except Exception:
                    log.failure("a listener of {type} output failed", type=pending.type)
            return True
        pending = self._end(frame.message_id)
        if pending is None:
            return False
        pending.deferred.callback(frame)
        return True

    def reject(self, message_id: str, error: GatewayError) -> bool:
        """Fail one request (e.g. its response was malformed)."""
        if message_id not in self._pending:
            return False
        self._fail(message_id, error)
        return True

    def fail_all(self, error: GatewayError) -> None:
        for message_id in list(self._pending):
            self._fail(message_id, error)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def describe_session(session: Session) -> dict[str, Any]:
    """A computer's entry in ``GET /computers`` (and in a cluster's shared listing)."""
    return {
        "traposId": session.trapos_id,
        "accountId": session.account_id,
        "peer": session.peer,
        "connectedSince": _iso(session.connected_at),
        "version": session.version,
        "inFlight": session.in_flight,
        "capabilities": sorted(session.capabilities),
        "stopped": session.stopped is not None,
        **({"stopMessage": session.stopped} if session.stopped is not None else {}),
    }


def listing_key(entry: dict[str, Any]) -> tuple[str, str]:
    """A listed computer's (``describe_session``) ``(accountId, traposId)``: what a listing
    is sorted by."""
    return (entry.get("accountId", ""), entry.get("traposId", ""))


def _outcome(result: object) -> str:
    """A request's end as the metrics and the activity name it."""
    if isinstance(result, Failure):
        if result.check(GatewayError):
            return result.value.code
        if result.check(CancelledError):
            return "cancelled"
        return errors.INTERNAL
    # A computer's answer says whether it did it; the gateway's own answer (an ask's) is a payload.
    return "error" if getattr(result, "ok", True) is False else "ok"


def activity_entry(number: int, type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """
    One request in a computer's activity (SPEC §14): its number, type and
    what it names (an exec's command line, a file request's path, an eval's
    code, an ask's prompt, a snapshot's reason, the snapshot compared with or
    restored), cut to ``wire.ECHO_LIMIT``.  Never a file's
    content or anything else of the payload: only what names the request.
    """
    if type == "exec":
        args = payload.get("args")
        words = [payload.get("command"), *(args if isinstance(args, list) else ())]
        detail = " ".join(w if isinstance(w, str) else repr(w) for w in words)
    elif isinstance(payload.get("path"), str):
        detail = payload["path"]
    elif type == "eval" and isinstance(payload.get("code"), str):
        detail = payload["code"]
    elif type == "ask" and isinstance(payload.get("prompt"), str):
        detail = payload["prompt"]
    elif type == "snapshot" and isinstance(payload.get("reason"), str):
        detail = payload["reason"]
    elif type.startswith("snapshot_") and isinstance(payload.get("snapshot"), str):
        detail = payload["snapshot"]
    else:
        detail = ""
    return {"n": number, "type": type, "detail": wire.cut(detail)}


def _ignore(failure: Failure) -> None:
    return None


def _passed(result: object, call: Callable[..., None], *args: Any) -> object:
    call(*args)
    return result


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
    # (accountId, traposId) -> listeners of its requests (``watch_activity``).
    _activity: dict[tuple[str, str], list[PartialListener]] = attrs.field(factory=dict, init=False)
    _next_activity: int = attrs.field(default=0, init=False)
    # Whoever must hear of a file changed through any surface (MCP's file subscribers).
    file_listeners: list[FileListener] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        self.metrics.request_types(wire.REQUEST_TYPES)

    def watch(self, listener: Callable[[], None]) -> Callable[[], None]:
        """
        Call ``listener`` after each change to the listing (a computer
        connects, disconnects or changes what it allows); answers the
        function that stops it.
        """
        self._watchers.append(listener)
        return lambda: self._watchers.remove(listener) if listener in self._watchers else None

    def watch_activity(self, caller: Caller, listener: PartialListener) -> Callable[[], None]:
        """
        Call ``listener`` with each request sent to the computer, when it
        starts and when it ends (``activity_entry``); answers the function
        that stops it.  Raises ``GatewayError(too_many_watches)`` when the
        account whose token ``caller`` used already has its most of them (``streams``).
        """
        key = caller.key
        give_back = self.streams.take(caller, ACTIVITY)
        listeners = self._activity.setdefault(key, [])
        listeners.append(listener)

        def stop() -> None:
            if listener in listeners:
                listeners.remove(listener)
                give_back()
            if not listeners:
                self._activity.pop(key, None)

        return stop

    def follow_activity(self, caller: Caller, listener: PartialListener) -> Deferred:
        """
        ``watch_activity`` while the computer is connected here (another
        process's watch, ``cluster.relay``): a Deferred that fails with
        ``not_connected`` when it is not, or once it leaves (or is
        replaced); cancelling it stops the watch.
        """
        account_id, trapos_id = caller.key
        session = self.find(account_id, trapos_id)
        if session is None:
            return fail(wire.not_connected(trapos_id))
        try:
            stop_activity = self.watch_activity(caller, listener)
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

    def _tell_activity(self, key: tuple[str, str], entry: dict[str, Any]) -> None:
        for listener in list(self._activity.get(key, ())):
            try:
                listener(entry)
            except Exception:
                log.failure("a watcher of a computer's activity failed")

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
        (``Caller.at``); fires with the final ``ComputerResponse``.
        A ``screen_watch``'s frames reach ``on_partial`` through a
        ``ScreenGate`` (paced to its ``maxFps``; ``on_partial`` answering
        False means "no room now": the frame is kept and merged with the
        next), wherever the computer is held.
        """
        account_id, trapos_id = caller.key
        give_back = None
        if type in WATCHES:
            try:
                give_back = self.streams.take(caller, SCREEN_AND_EVENT)
            except GatewayError as refusal:
                return fail(refusal)
        gate = None
        if type == "screen_watch" and on_partial is not None:
            gate = ScreenGate(self.clock, max_fps(payload or {}), on_partial)
            on_partial = gate.take
        session = self.find(account_id, trapos_id)
        if session is None and self.peers is not None and (timeout is None or timeout > 0):
            d = self.peers.request(
                caller,
                type,
                payload or {},
                self.request_timeout if timeout is None else timeout,
                on_partial,
            )
        elif session is None:
            d = fail(wire.not_connected(trapos_id))
        elif timeout is not None and not timeout > 0:
            d = fail(GatewayError(errors.BAD_REQUEST, "timeout must be positive"))
        else:
            if timeout is None:
                timeout = self.request_timeout
            d = session.request(type, payload or {}, timeout, on_partial)
        # A request refused before it went out has no latency worth recording.
        started = None if d.called else self.clock.seconds()
        d.addBoth(self._count, type, started)
        if give_back is not None:
            d.addBoth(_passed, give_back)
        if gate is not None:
            d.addBoth(_passed, gate.stop)
        changed = _changed_path(type, payload or {}) if self.file_listeners else None
        if changed is not None:
            d.addCallback(self._file_changed, account_id, trapos_id, changed)
        key = caller.key
        # A request relayed to the process holding the computer is in its activity there.
        relayed = session is None and self.peers is not None
        if key in self._activity and not caller.quiet and not relayed:
            self.track(key, type, payload or {}, d, caller.sender)
        return d

    def _file_changed(self, response: Any, account_id: str, trapos_id: str, path: str) -> Any:
        if getattr(response, "ok", False):
            for listener in list(self.file_listeners):
                try:
                    listener(account_id, trapos_id, path)
                except Exception:
                    log.failure("a file listener failed")
        return response

    def track(
        self,
        key: tuple[str, str],
        type: str,
        payload: dict[str, Any],
        d: Deferred,
        sender: Sender,
    ) -> Callable[[dict[str, Any]], None]:
        """
        Tell the watchers of ``key``'s activity of the request ``d`` (sent by
        ``sender``): now, with ``state``
        "started", and when it ends (its outcome, ``durationMs``).  Answers
        the function that tells them how it goes meanwhile (``state``
        "running" and what it is given: an ask's text as it arrives).
        """
        entry = {
            **activity_entry(self.activity_number(), type, payload),
            **sender.entry(),
        }
        self._tell_activity(key, {**entry, "state": "started"})
        d.addBoth(self._activity_ended, key, entry, self.clock.seconds())
        return lambda progress: self._tell_activity(key, {**entry, "state": "running", **progress})

    def activity_number(self) -> int:
        """The next number of an activity entry here (each process counts its own)."""
        self._next_activity += 1
        return self._next_activity

    def _activity_ended(
        self, result: object, key: tuple[str, str], entry: dict[str, Any], started: float
    ) -> object:
        outcome = _outcome(result)
        ms = round((self.clock.seconds() - started) * 1000)
        self._tell_activity(key, {**entry, "state": outcome, "durationMs": ms})
        return result

    def _count(self, result: object, type: str, started: float | None) -> object:
        outcome = _outcome(result)
        seconds = None if started is None else self.clock.seconds() - started
        self.metrics.gateway_request(type, outcome, seconds)
        return result
