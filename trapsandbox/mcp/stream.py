"""
A response written as server-sent events (SPEC §17): how a ``tools/call``
that asked for progress is answered.

    200 text/event-stream
    event: message
    data: {"jsonrpc": "2.0", "method": "notifications/progress", ...}
    ...
    event: message
    data: {"jsonrpc": "2.0", "id": ..., "result": ...}        the last event

The stream opens with its first event: a call that ends before it has
anything to report is answered as plain JSON, as a client that asked for
progress must accept either.  No event ids: there is nothing to resume (a
stream that breaks ends its call, as a closed connection does today).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.web.iweb import IRequest

from trapsandbox import limits
from trapsandbox.computers.streams import Held, stalled
from trapsandbox.errors import GatewayError


def accepts_events(request: IRequest) -> bool:
    """Whether the client's ``Accept`` takes ``text/event-stream`` (an SSE answer)."""
    accept = b",".join(request.requestHeaders.getRawHeaders(b"accept", []))
    return any(
        item.split(b";", 1)[0].strip().lower() == b"text/event-stream"
        for item in accept.split(b",")
    )


def event(body: bytes) -> bytes:
    """One SSE event carrying one JSON-RPC message's ``body``."""
    return b"event: message\ndata: " + body + b"\n\n"


def open_event_stream(request: IRequest) -> None:
    """
    The head of a ``text/event-stream`` answer (also the screen and peripheral streams',
    ``web.streaming``); it goes out with the first write.
    """
    request.setResponseCode(200)
    request.setHeader(b"content-type", b"text/event-stream")
    request.setHeader(b"cache-control", b"no-store")
    # Proxies such as nginx hold a response back otherwise; the events are the point.
    request.setHeader(b"x-accel-buffering", b"no")


class EventStream:
    """
    One request's answer as SSE, opened by the first ``send``.  Its writes go
    through a ``computers.streams.Held``: a reader that lets more than
    ``most_held`` bytes wait ends the stream (``stalled`` fires, nothing more is
    sent but the answer's last event), so a client that never reads costs a
    bounded number of bytes, not a growing one.
    """

    def __init__(self, request: IRequest, most_held: int = limits.MAX_STREAM_HELD_BYTES) -> None:
        self._request = request
        self._most_held = most_held
        self._held: Held | None = None
        self.opened = False
        self.ended = False
        # Fires (with the reason, a ``GatewayError``) if the reader stops reading.
        self.stalled: Deferred[GatewayError] = Deferred()

    def open(self, first: bytes = b"") -> None:
        """The head now (with ``first``, an SSE comment say), if not yet sent."""
        if not self.opened:
            self.opened = True
            open_event_stream(self._request)
            self._held = Held(self._request, self._most_held)
            if first:
                self._request.write(first)

    def _write(self, data: bytes) -> None:
        if self.ended:
            return
        self.open()
        if not self._held.write(data):
            self.end()
            self.stalled.callback(stalled(self._most_held))

    def send(self, message: dict[str, Any]) -> None:
        """``message`` (a notification) now; nothing once the answer has ended."""
        self._write(event(orjson.dumps(message)))

    def end(self) -> None:
        """No more notifications: the answer is being written (or dropped)."""
        self.ended = True
        if self._held is not None:
            self._held.close()

    def comment(self) -> None:
        """An SSE comment: keeps a quiet long-lived stream open through proxies and idle timers."""
        if self.opened:
            self._write(b": keep-alive\n\n")

    def keep_alive(self, clock: IReactorTime, seconds: float) -> Callable[[], None]:
        """A ``comment`` every ``seconds`` on ``clock``; answers the function that stops it."""
        loop = LoopingCall(self.comment)
        loop.clock = clock
        loop.start(seconds, now=False)
        return loop.stop
