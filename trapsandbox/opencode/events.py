"""
The one opencode event stream of the gateway (SPEC §11): ``GET /global/event``
(``/event`` carries one directory's instance only; the global stream wraps
every instance's events as ``{directory, payload}``), opened with the first
ask and kept, reconnected with backoff (1 s doubling to 30 s) when it drops
or falls silent past opencode's heartbeat; events are dispatched by
``sessionID`` to their session's subscriber.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import treq
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone

from trapsandbox import limits
from trapsandbox.errors import GatewayError
from trapsandbox.opencode.client import OpencodeClient, explain, opencode_error, unauthorized
from trapsandbox.opencode.sse import SSEParser

log = Logger()

# A ``sessionID`` member as opencode writes its events (``JSON.stringify``: the key never
# escaped), its value up to its closing quote or its first escape.
_SESSION_ID = re.compile(rb'"sessionID"\s*:\s*"([^"\\]*)(["\\])')


class _StreamBody(Protocol):
    def __init__(self, stream: EventStream) -> None:
        self._stream = stream
        self.ended: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self._stream.received(data)

    def connectionLost(self, reason: Failure = ResponseDone) -> None:
        self.ended.callback(None)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.stopProducing()


class EventStream:
    """
    The one ``GET /global/event`` of the gateway.  ``subscribe(sessionID, listener)``
    hears that session's events; ``ready()`` fires once connected (or fails
    with an ``opencode_error``); ``on_reconnect`` listeners run after every
    reconnection.
    """

    def __init__(
        self,
        client: OpencodeClient,
        clock: IReactorTime,
        silence: float = limits.EVENT_SILENCE_TIMEOUT,
    ) -> None:
        self._client = client
        self._clock = clock
        self._silence = silence
        self._listeners: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.on_reconnect: list[Callable[[], None]] = []
        # Run when the open stream was lost and stayed lost ``ASK_SERVER_GONE`` seconds: the
        # server is gone, not restarting (told why the last attempt to open it failed).
        self.on_gone: list[Callable[[GatewayError], None]] = []
        self._gone: IDelayedCall | None = None
        self._last_error: GatewayError | None = None
        self.connected = False
        self.connects = 0
        self._connecting: Deferred | None = None
        self._body: _StreamBody | None = None
        self._waiters: list[Deferred] = []
        self._retry = None
        self._watchdog = None
        self._backoff = limits.EVENT_RECONNECT_MIN
        self._stopped = False
        self._parser = SSEParser(self._event, wanted=self._mentions_a_listener)

    def subscribe(self, session_id: str, listener: Callable[[dict[str, Any]], None]):
        self._listeners[session_id] = listener

        def unsubscribe() -> None:
            if self._listeners.get(session_id) is listener:
                del self._listeners[session_id]

        return unsubscribe

    def ready(self) -> Deferred:
        if self._stopped:  # the gateway stops: the stream is not opened again
            return fail(opencode_error("the gateway is shutting down"))
        if self.connected:
            return succeed(None)
        d = Deferred()
        self._waiters.append(d)
        if self._connecting is None:
            if self._retry is not None and self._retry.active():
                self._retry.cancel()
            self._retry = None
            self._connect()
        return d

    def stop(self) -> None:
        self._stopped = True
        self._cancel_gone()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._cancel_watchdog()
        if self._body is not None:
            self._body.abort()
        if self._connecting is not None:
            self._connecting.cancel()
        # Who waits for it hears it will not open (and the bound of that wait ends with it).
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.errback(opencode_error("the gateway is shutting down"))

    def _connect(self) -> None:
        self._parser = SSEParser(self._event, wanted=self._mentions_a_listener)
        d = self._client.http.get(
            self._client.target("/global/event"),
            auth=self._client.auth,
            headers={b"Accept": [b"text/event-stream"]},
        )
        d.addTimeout(limits.OPENCODE_CONNECT_TIMEOUT + limits.PROBE_TIMEOUT, self._clock)
        self._connecting = d
        d.addCallbacks(self._opened, self._failed, (d,), None, (d,))

    def reconnect(self) -> None:
        """
        Open it now: the server is known to answer again (``managed``: it restarted).  An
        attempt still in flight (sent while it was not answering, and which may hang until
        its bound) is abandoned for a new one; who waits for the stream waits for that one.
        """
        if self._stopped or self.connected:
            return
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        attempt, self._connecting = self._connecting, None
        if attempt is not None:
            attempt.cancel()  # (its failure is ignored: it is no longer the attempt)
        self._connect()

    def _opened(self, response, attempt: Deferred) -> None:
        if attempt is not self._connecting:
            return  # abandoned (``reconnect``); cancelled before it could open
        self._connecting = None
        if response.code != 200:
            treq.content(response).addErrback(lambda _: None)
            if response.code == 401:
                error = unauthorized(self._client.where)
            else:
                error = opencode_error(
                    f"opencode at {self._client.where} answered HTTP {response.code} to GET /event"
                )
            self._down(error)
            return
        body = _StreamBody(self)
        self._body = body
        response.deliverBody(body)
        body.ended.addCallback(self._ended, body)
        self.connected = True
        self._cancel_gone()
        self.connects += 1
        self._backoff = limits.EVENT_RECONNECT_MIN
        self._arm_watchdog()
        if self.connects > 1:
            log.info("the opencode event stream is back")
            for listener in list(self.on_reconnect):
                try:
                    listener()
                except Exception:
                    log.failure("an event stream reconnect listener failed")
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)

    def _failed(self, failure: Failure, attempt: Deferred) -> None:
        if attempt is not self._connecting:
            return  # abandoned for a newer attempt (``reconnect``)
        self._connecting = None
        if self._stopped:
            return
        self._down(explain(failure, self._client.where))

    def _down(self, error: GatewayError) -> None:
        self._last_error = error
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.errback(error)
        self._schedule()

    def _cancel_gone(self) -> None:
        if self._gone is not None and self._gone.active():
            self._gone.cancel()
        self._gone = None

    def _fire_gone(self) -> None:
        self._gone = None
        error = self._last_error or opencode_error(
            f"opencode at {self._client.where}: its event stream did not open again"
        )
        for listener in list(self.on_gone):
            try:
                listener(error)
            except Exception:
                log.failure("an event stream gone listener failed")

    def _ended(self, _: None, body: _StreamBody) -> None:
        if self._body is body:
            self._body = None
        self.connected = False
        self._cancel_watchdog()
        if not self._stopped:
            self._cancel_gone()
            self._gone = self._clock.callLater(limits.ASK_SERVER_GONE, self._fire_gone)
            log.info("the opencode event stream ended; reconnecting")
            self._schedule()

    def _schedule(self) -> None:
        if self._stopped or (self._retry is not None and self._retry.active()):
            return
        delay, self._backoff = (
            self._backoff,
            min(self._backoff * 2, limits.EVENT_RECONNECT_MAX),
        )
        self._retry = self._clock.callLater(delay, self._reconnect)

    def _reconnect(self) -> None:
        self._retry = None
        if self._connecting is None and not self.connected:
            self._connect()

    def received(self, data: bytes) -> None:
        self._arm_watchdog()
        self._parser.feed(data)

    def _arm_watchdog(self) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.reset(self._silence)
        else:
            self._watchdog = self._clock.callLater(self._silence, self._silent)

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None and self._watchdog.active():
            self._watchdog.cancel()
        self._watchdog = None

    def _silent(self) -> None:
        self._watchdog = None
        log.info("the opencode event stream fell silent; reconnecting")
        if self._body is not None:
            self._body.abort()

    def _mentions_a_listener(self, data: bytes) -> bool:
        """
        Whether an event's data may be of a session listened to, before it is decoded.  Most
        of opencode's events are of nobody here (``plugin.added`` dozens of times for each new
        instance, heartbeats, the sessions of asks that have ended), and decoding each was
        most of what the stream cost.  ``_event`` finds an event's session in a ``sessionID``
        member of its ``properties``, so an event with no such member naming a listener, or
        with no ``properties``, is nobody's; a value with an escape in it is decoded to be
        sure.
        """
        listeners = self._listeners
        if not listeners or b'"properties"' not in data:
            return False  # (opencode's "sync" events name sessions, but have no properties)
        for match in _SESSION_ID.finditer(data):
            if match.group(2) == b"\\" or match.group(1).decode(errors="replace") in listeners:
                return True
        return False

    def _event(self, event: dict[str, Any]) -> None:
        # /global/event wraps each instance's event: {directory, payload: {id, type, properties}}.
        payload = event.get("payload")
        if type(payload) is dict:
            event = payload
        properties = event.get("properties")
        if type(properties) is not dict:
            return
        session_id = properties.get("sessionID")
        if session_id is None:
            info = properties.get("info")
            part = properties.get("part")
            holder = info if type(info) is dict else part if type(part) is dict else {}
            session_id = holder.get("sessionID")
        listener = self._listeners.get(session_id) if type(session_id) is str else None
        if listener is not None:
            try:
                listener(event)
            except Exception:
                log.failure("handling an opencode event failed")
