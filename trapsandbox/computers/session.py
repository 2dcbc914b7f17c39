"""
One computer's connection once admitted (``Session``), and the lifetime of each request
sent on it: a Deferred correlated by messageId, its timeout, its partial responses, its
cancellation here and on the computer.

A request is a Deferred that fires with the computer's final ``ComputerResponse`` (even
one with ``ok`` false), or fails with a ``GatewayError``: ``timeout``, ``not_connected``
when its connection closes, ``overloaded``, ``too_large``, ``bad_request``, ``forbidden``
(refused before sending: the computer has not allowed that capability, or a file request
names its settings file), ``stopped`` (its player stopped the agent).  Partial responses
before the final one go to a listener the caller gives, in order; one for a finished
request is ignored.  Only a response arriving on the connection the request went out on
resolves it.  A listener may end its request by raising ``GatewayError`` (the request then
fails with it, and is cancelled on the computer).  What runs around each request whatever
computer it goes to (quotas, metrics, activity) is ``hooks``; which computer, ``registry``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import attrs
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.computers import parts, wire
from trapsandbox.errors import GatewayError

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


@attrs.define(eq=False)
class _Pending:
    deferred: Deferred
    type: str
    on_partial: PartialListener | None
    # The timeout's call, cancelled when the request ends otherwise.
    timer: Any = None
    # A read that asked for its answer as a binary message (``computers.parts``).
    binary: bool = False


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
        player stopped the agent, or a capability its owner has not allowed.  (The
        paths a request names, the settings file among them, are the registry's:
        ``paths.request_paths``, applied to every request by ``hooks.FilePaths``.)
        """
        capability = wire.CAPABILITY_OF.get(type)
        if capability is not None and self.stopped is not None:
            return GatewayError(errors.STOPPED, self.stopped)
        if capability is None or capability in self.capabilities:
            return None
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
            data = parts.encode_request(self.trapos_id, message_id, type, payload, self.features)
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
        binary = parts.answered_in_binary(type, payload, self.features)
        self._pending[message_id] = _Pending(d, type, on_partial, timer, binary)
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

    def asked_binary(self, message_id: str) -> bool:
        """Whether the request ``message_id`` may be answered with a binary message."""
        pending = self._pending.get(message_id)
        return pending is not None and pending.binary

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


def _ignore(failure: Failure) -> None:
    return None
