"""
The registry of connected computers, and the lifetime of requests sent to them.

A computer is registered once its ``hello`` succeeds, under
``(accountId, traposId)``; the newest connection wins and the one it
replaces is closed with 4000.  A request to a computer is a Deferred that
fires with the computer's ``ComputerResponse`` (even one with ``ok`` false),
or fails with a ``GatewayError``: ``timeout``, ``not_connected`` when its
connection closes, ``overloaded``, ``too_large``, ``bad_request``.  Only a
response arriving on the connection the request went out on resolves it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import limits, wire
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.metrics import Metrics
from trapsandbox.wire import GatewayError

log = Logger()


class Link(Protocol):
    """What a session needs of its connection."""

    def send_frame(self, data: bytes) -> None:
        """Send one message; raise ``GatewayError(not_connected)`` if closed."""

    def close(self, code: int, reason: str) -> None:
        """Start a close handshake."""


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
    max_in_flight: int = limits.MAX_IN_FLIGHT
    _pending: dict[str, Deferred] = attrs.field(factory=dict, init=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.account_id, self.trapos_id)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def request(self, type: str, payload: dict[str, Any], timeout: float) -> Deferred:
        if len(self._pending) >= self.max_in_flight:
            return fail(
                GatewayError(
                    wire.OVERLOADED,
                    f"{self.trapos_id} already has {self.max_in_flight} requests in flight",
                )
            )
        message_id = str(uuid.uuid4())
        try:
            data = wire.encode(wire.GatewayRequest(self.trapos_id, message_id, type, payload))
        except (ValueError, TypeError) as error:
            return fail(GatewayError(wire.BAD_REQUEST, f"cannot send this request: {error}"))
        if len(data) > limits.MAX_OUTBOUND_BYTES:
            return fail(
                GatewayError(
                    wire.TOO_LARGE,
                    f"request is {len(data)} bytes; a computer accepts at most "
                    f"{limits.MAX_OUTBOUND_BYTES}",
                )
            )
        d = Deferred()
        self._pending[message_id] = d
        d.addTimeout(timeout, self.clock, onTimeoutCancel=_timed_out)
        d.addBoth(self._forget, message_id)
        try:
            self.link.send_frame(data)
        except GatewayError as error:
            self._fail(message_id, error)
        return d

    def _forget(self, result: object, message_id: str) -> object:
        self._pending.pop(message_id, None)
        return result

    def _fail(self, message_id: str, error: GatewayError) -> None:
        d = self._pending.pop(message_id, None)
        if d is not None:
            d.errback(Failure(error))

    def resolve(self, frame: wire.ComputerResponse) -> bool:
        """Fire the request this response answers; False if there is none."""
        d = self._pending.pop(frame.message_id, None)
        if d is None:
            return False
        d.callback(frame)
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


def _timed_out(result: object, timeout: float) -> object:
    if isinstance(result, Failure) and result.check(CancelledError):
        raise GatewayError(wire.TIMEOUT, f"no answer from the computer within {timeout:g} s")
    return result


@attrs.define
class Registry:
    """Connected computers by ``(accountId, traposId)``: newest wins."""

    clock: IReactorTime
    request_timeout: float = limits.DEFAULT_REQUEST_TIMEOUT
    metrics: Metrics = attrs.field(factory=Metrics, repr=False)
    _sessions: dict[tuple[str, str], Session] = attrs.field(factory=dict, init=False)

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def add(self, session: Session) -> Session | None:
        """Register ``session``; close and return the one it replaces, if any."""
        old = self._sessions.get(session.key)
        self._sessions[session.key] = session
        if old is not None and old is not session:
            log.info(
                "{traposId} from {peer} replaces its connection from {oldPeer}",
                traposId=session.trapos_id,
                peer=session.peer,
                oldPeer=old.peer,
            )
            old.fail_all(GatewayError(wire.NOT_CONNECTED, "the computer connected again elsewhere"))
            old.link.close(wire.CLOSE_REPLACED, "replaced")
            return old
        return None

    def remove(self, session: Session) -> None:
        """Forget ``session`` (if it is still the registered one) and fail its requests."""
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        session.fail_all(GatewayError(wire.NOT_CONNECTED, "the computer disconnected"))

    @property
    def pending(self) -> int:
        """Requests to computers waiting for an answer."""
        return sum(session.in_flight for session in self._sessions.values())

    def find(self, trapos_id: str, account_id: str = LOCAL_ACCOUNT) -> Session | None:
        return self._sessions.get((account_id, trapos_id))

    def request(
        self,
        trapos_id: str,
        type: str,
        payload: dict[str, Any] | None = None,
        timeout: float | None = None,
        account_id: str = LOCAL_ACCOUNT,
    ) -> Deferred:
        """Send a ``gateway_request``; fires with the ``ComputerResponse``."""
        session = self.find(trapos_id, account_id)
        if session is None:
            d = fail(GatewayError(wire.NOT_CONNECTED, f"{trapos_id} is not connected"))
        elif timeout is not None and not timeout > 0:
            d = fail(GatewayError(wire.BAD_REQUEST, "timeout must be positive"))
        else:
            if timeout is None:
                timeout = self.request_timeout
            d = session.request(type, payload or {}, timeout)
        # A request refused before it went out has no latency worth recording.
        started = None if d.called else self.clock.seconds()
        d.addBoth(self._count, started)
        return d

    def _count(self, result: object, started: float | None) -> object:
        if isinstance(result, Failure):
            if result.check(GatewayError):
                outcome = result.value.code
            elif result.check(CancelledError):
                outcome = "cancelled"
            else:
                outcome = wire.INTERNAL
        else:
            outcome = "ok" if result.ok else "error"
        seconds = None if started is None else self.clock.seconds() - started
        self.metrics.gateway_request(outcome, seconds)
        return result
