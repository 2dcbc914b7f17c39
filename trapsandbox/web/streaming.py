"""
Answers that stream: ``POST /computers/{id}/execute``'s run output as NDJSON
lines while it runs (SPEC §9), and ``GET /computers/{id}/screen/stream``'s
screen frames as server-sent events (SPEC §14).
"""

from __future__ import annotations

from typing import Any

import orjson
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from trapsandbox.computers.streams import Held, stalled
from trapsandbox.errors import GatewayError
from trapsandbox.mcp.stream import open_event_stream
from trapsandbox.web.answers import sandbox_failed


class OutputStream:
    """
    NDJSON lines written as the computer's output arrives, then one
    ``result`` (or ``error``) line.  Until the request has gone out
    (``begin``), a failure is an ordinary JSON answer with its status.
    """

    def __init__(self, request: IRequest) -> None:
        self._request = request
        self._begun = False
        # What the deltas carried so far, so that the final answer's full
        # output can fill in what no partial did.
        self._sent = {"stdout_delta": 0, "stderr_delta": 0}

    def begin(self) -> None:
        if not self._begun:
            self._begun = True
            request = self._request
            request.setResponseCode(200)
            request.setHeader(b"content-type", b"application/x-ndjson")
            request.setHeader(b"cache-control", b"no-store")

    def _line(self, obj: dict[str, Any]) -> None:
        self.begin()
        self._request.write(orjson.dumps(obj) + b"\n")

    def output(self, kind: str, data: str) -> None:
        self._sent[kind] += len(data)
        self._line({"type": kind, "data": data})

    def result(self, answer: dict[str, Any]) -> bytes:
        for kind, name in (("stdout_delta", "stdout"), ("stderr_delta", "stderr")):
            full = answer.get(name)
            if isinstance(full, str) and len(full) > self._sent[kind]:
                self.output(kind, full[self._sent[kind] :])
        line: dict[str, Any] = {"type": "result"}
        for name in ("exitCode", "timedOut", "durationMs", "stdoutTruncated", "stderrTruncated"):
            if name in answer:
                line[name] = answer[name]
        self._line(line)
        return b""

    def failed(self, failure: Failure) -> bytes | Failure:
        if not failure.check(GatewayError):
            return failure  # cancelled: the caller is gone
        if not self._begun:
            return sandbox_failed(failure, self._request)
        error = failure.value
        self._line({"type": "error", "error": error.message, "code": error.code})
        return b""


class ScreenStream:
    """
    ``text/event-stream``: one ``data:`` line per screen frame (the
    ``ScreenState`` shape), then, when the computer ends the watch, one
    ``event: error`` with ``{code, error}``.  Until the watch has gone out
    (``begin``), a failure is an ordinary JSON answer with its status.
    Frames go through ``held`` (``computers.streams.Held``): ``room`` says
    whether the reader takes one now, else the frame waits, merged with the next.
    """

    def __init__(self, request: IRequest, held: Held) -> None:
        self._request = request
        self._held = held
        self._begun = False
        # Set when the reader stopped reading and the stream was ended for it.
        self.stalled: GatewayError | None = None

    def begin(self) -> None:
        if not self._begun:
            self._begun = True
            open_event_stream(self._request)
            # The head goes out with the first write: a comment, so the caller sees it now.
            self._request.write(b": watching\n\n")

    def room(self) -> Deferred[None] | None:
        return self._held.room()

    def frame(self, frame: dict[str, Any]) -> None:
        self.begin()
        self._held.write(b"data: " + orjson.dumps(frame) + b"\n\n")

    def ended(self, result: object) -> bytes | Failure:
        self._held.close()
        if self.stalled is not None:
            error = self.stalled  # its watch was cancelled for it
        elif isinstance(result, Failure):
            if not result.check(GatewayError):
                return result  # cancelled: the caller is gone
            if not self._begun:
                return sandbox_failed(result, self._request)
            error = result.value
        else:
            return self._end(result)
        self.begin()
        body = orjson.dumps({"code": error.code, "error": error.message})
        self._request.write(b"event: error\ndata: " + body + b"\n\n")
        return b""

    def _end(self, result: object) -> bytes:
        self.begin()
        body = orjson.dumps({"code": "ended", "error": "the computer ended the watch"})
        self._request.write(b"event: error\ndata: " + body + b"\n\n")
        return b""


class EventStream(ScreenStream):
    """
    ``text/event-stream`` of peripheral events (SPEC §16): one ``data:`` line
    per ``{type: "event", name, args}``; at the computer's timeout one
    ``event: end`` with ``{events, timedOut}``; a failure as ``ScreenStream``'s.
    A reader that lets more than its ``held`` bound wait is told so
    (``overloaded``) and the watch ended: events are not merged, nor kept.
    """

    def __init__(self, request: IRequest, held: Held) -> None:
        super().__init__(request, held)
        self.watch: Deferred | None = None

    def frame(self, frame: dict[str, Any]) -> None:
        self.begin()
        if self.stalled is None and not self._held.write(b"data: " + orjson.dumps(frame) + b"\n\n"):
            self.stalled = stalled(self._held.most)
            if self.watch is not None:
                self.watch.cancel()

    def _end(self, result: object) -> bytes:
        self.begin()
        self._request.write(b"event: end\ndata: " + orjson.dumps(result) + b"\n\n")
        return b""
