"""
Server-sent events (``text/event-stream``) as opencode sends them: bytes in,
one decoded JSON object per event out.  Bounded: a line, or an event's
``data:`` lines together, over ``MAX_EVENT_BYTES`` is dropped, so a stream
cannot grow either buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from trapsandbox import limits


class SSEParser:
    """
    Bytes of a ``text/event-stream`` in, one decoded JSON object per event out.

    opencode sends ``data:`` lines only; ``event:``, ``id:`` and comments are
    skipped, data that is not a JSON object is dropped, and so is a line over
    ``max_line`` bytes, and an event whose data lines add up to more (its
    lines are dropped until the blank line that ends it).
    """

    def __init__(
        self,
        on_event: Callable[[dict[str, Any]], None],
        max_line: int = limits.MAX_EVENT_BYTES,
        wanted: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``wanted``: told an event's data before it is decoded; False drops it undecoded."""
        self._on_event = on_event
        self._wanted = wanted
        self._max_line = max_line
        self._buffer = b""
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._skipping = False
        # The event being read has outgrown ``max_line``: dropped up to its end.
        self._dropping = False

    def feed(self, data: bytes) -> None:
        buffer = self._buffer + data
        if not (self._data or self._dropping or self._skipping):
            buffer = self._whole_events(buffer)
        lines = buffer.split(b"\n")
        rest = lines.pop()
        for line in lines:
            if self._skipping:
                self._skipping = False  # the end of the overlong line
                continue
            self._line(line.removesuffix(b"\r"))
        # (Once the whole lines are read: the first of them ends a line overlong before.)
        if len(rest) > self._max_line:
            rest = b""
            self._skipping = True
        self._buffer = rest

    def _whole_events(self, buffer: bytes) -> bytes:
        """
        The whole events at the start of ``buffer`` (no event begun before it) dispatched,
        what follows them returned.  As opencode writes them (one ``data: `` line, ended by
        a blank line, ``\\n`` line ends) an event is one slice of the buffer; any other is
        read line by line.
        """
        end = buffer.rfind(b"\n\n")
        if end < 0:
            return buffer
        for block in buffer[:end].split(b"\n\n"):
            if block.startswith(b"data: ") and b"\n" not in block and b"\r" not in block:
                if len(block) - 5 <= self._max_line:  # (its data and the line end)
                    self._dispatch(block[6:])
                continue
            for line in block.split(b"\n"):
                self._line(line.removesuffix(b"\r"))
            self._line(b"")  # the blank line that ended it
        return buffer[end + 2 :]

    def _line(self, line: bytes) -> None:
        if not line:
            data, self._data, self._data_bytes = self._data, [], 0
            if data and not self._dropping:
                self._dispatch(b"\n".join(data))
            self._dropping = False
            return
        if line.startswith(b"data:") and not self._dropping:
            value = line[5:]
            value = value[1:] if value.startswith(b" ") else value
            self._data_bytes += len(value) + 1
            if self._data_bytes > self._max_line:
                self._data, self._data_bytes, self._dropping = [], 0, True
                return
            self._data.append(value)

    def _dispatch(self, data: bytes) -> None:
        if self._wanted is not None and not self._wanted(data):
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if type(event) is dict:
            self._on_event(event)
