"""
HTTP by hand over a real socket, for what a client library would hide: raw bytes sent as
they are (a stranger, a dripping head), answers read as they arrive (an event stream), and
whether the server closed the connection.
"""

from __future__ import annotations

import orjson
from twisted.internet import protocol
from twisted.internet.defer import Deferred

from tests.harness.support import bounded, reactor


class RawHTTP(protocol.Protocol):
    """HTTP by hand: what the server sent, and whether it closed the connection."""

    def __init__(self) -> None:
        self.buffer = b""
        self.closed: Deferred = Deferred()
        self._waiting: Deferred | None = None

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def connectionLost(self, reason) -> None:
        self.closed.callback(None)
        self._wake()

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.callback(None)

    async def response(self) -> tuple[int, dict[bytes, bytes], bytes]:
        """The next response (by Content-Length, or chunked): status, headers, body."""
        while True:
            found = _parse(self.buffer)
            if found is not None:
                status, headers, body, self.buffer = found
                return status, headers, body
            if self.closed.called:
                raise ConnectionError(f"closed after {self.buffer[:200]!r}")
            self._waiting = Deferred()
            await bounded(self._waiting)

    async def until(self, marker: bytes) -> bytes:
        """What arrived up to and including ``marker`` (a stream read as it comes), taken."""
        while marker not in self.buffer:
            if self.closed.called:
                raise ConnectionError(f"closed before {marker!r}, after {self.buffer[:200]!r}")
            self._waiting = Deferred()
            await bounded(self._waiting)
        head, _, self.buffer = self.buffer.partition(marker)
        return head + marker

    async def refused(self) -> tuple[int, dict]:
        """A refusal: one answer, then the connection closed by the server."""
        status, headers, body = await self.response()
        await bounded(self.closed)
        self.closed = Deferred()  # (for a cleanup that aborts a closed connection)
        return status, orjson.loads(body)


def _parse(data: bytes) -> tuple[int, dict[bytes, bytes], bytes, bytes] | None:
    """``(status, headers, body, what follows)`` of a whole response in ``data``, or None."""
    head, found, rest = data.partition(b"\r\n\r\n")
    if not found:
        return None
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    status = int(lines[0].split(b" ")[1])
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while True:
            size_end = rest.find(b"\r\n")
            if size_end < 0:
                return None
            size = int(rest[:size_end], 16)
            if len(rest) < size_end + 2 + size + 2:
                return None
            body += rest[size_end + 2 : size_end + 2 + size]
            rest = rest[size_end + 2 + size + 2 :]
            if size == 0:
                return status, headers, body, rest
    length = int(headers.get(b"content-length", b"0"))
    if len(rest) < length:
        return None
    return status, headers, rest[:length], rest[length:]


async def raw(testcase, port: int, data: bytes = b"") -> RawHTTP:
    client = RawHTTP()
    await bounded(protocol.ClientCreator(reactor(), lambda: client).connectTCP("127.0.0.1", port))
    testcase.addCleanup(client.transport.abortConnection)
    if data:
        client.transport.write(data)
    return client


def events(data: bytes) -> list[dict]:
    """The ``data:`` lines of an event stream's chunks."""
    return [
        orjson.loads(line[len(b"data: ") :])
        for line in data.split(b"\n")
        if line.startswith(b"data: {")
    ]
