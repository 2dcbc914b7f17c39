"""
A whole HTTP/1.1 response written as bytes, for the places that answer without
twisted.web's ``Request``: the fast paths' hot route, and in both modes the
listener's refusals and the site's connections it must end itself.
"""

from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.web.http import RESPONSES, datetimeToString


class Answer(Protocol):
    """What ``response`` writes: ``operator.Answer`` and the like."""

    def encoded(self) -> tuple[int, bytes, tuple[tuple[bytes, bytes], ...]]: ...


class Dates:
    """The ``Date`` header's value, formatted once a second."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(self._clock.seconds())
        if second != self._second:
            self._second = second
            self._value = datetimeToString(second)
        return self._value


def _head(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, RESPONSES.get(status, b"Unknown"))


_STATUS_LINES = {status: _head(status) for status in RESPONSES}


_RESPONSE = (
    b"%sContent-Type: application/json\r\nCache-Control: no-store\r\n%s"
    b"Date: %s\r\nContent-Length: %d\r\n\r\n%s"
)
_CLOSE = (b"connection", b"close")


def response(answer: Answer, date: bytes, close: bool = False) -> bytes:
    """
    The whole HTTP/1.1 response to send for ``answer`` (with ``close``, the
    last on its connection); twisted.web's side sends a refusal with it too.
    """
    status, body, headers = answer.encoded()
    if close:
        headers = (*headers, _CLOSE)
    extra = b"".join(b"%s: %s\r\n" % header for header in headers) if headers else b""
    status_line = _STATUS_LINES.get(status) or _head(status)
    return _RESPONSE % (status_line, extra, date, len(body), body)
