"""
``trapsandbox-ctl attach ID``: a computer's live screen in the operator's
terminal (SPEC §14), its keys forwarded when the computer allows ``input``.

The screen comes from ``GET /computers/{id}/screen/stream`` (one frame per
``data:`` line, whole rows: ``trapsandbox.computers.screen``) on a thread;
the terminal is read in raw mode on the main thread, and what is typed goes
out as ``POST /computers/{id}/input``.  ``Ctrl-]`` leaves (the terminal is
restored however it ends).  Standard library only, like the rest of ``ctl``.
The pieces that need no terminal (``Renderer``, ``events_of``) are tested
on their own.
"""

from __future__ import annotations

import json
import os
import select
import sys
import termios
import threading
import tty
import urllib.request
from typing import Any

LEAVE = b"\x1d"  # Ctrl-]

# CraftOS's default palette, in blit digit order (0 white ... f black).
DEFAULT_PALETTE = [
    "#f0f0f0", "#f2b233", "#e57fd8", "#99b2f2", "#dede6c", "#7fcc19", "#f2b2cc", "#4c4c4c",
    "#999999", "#4c99b2", "#b266e5", "#3366cc", "#7f664c", "#57a64e", "#cc4c4c", "#111111",
]  # fmt: skip


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    try:
        value = int(hex_colour.lstrip("#"), 16)
    except ValueError:
        value = 0
    return value >> 16 & 255, value >> 8 & 255, value & 255


class Renderer:
    """Screen frames as ANSI: each changed row in 24-bit colour, then the cursor."""

    def __init__(self) -> None:
        self.palette = list(DEFAULT_PALETTE)
        self.rows: dict[str, dict[str, str]] = {}
        self.height = 0

    def _colour(self, digit: str, ground: int) -> str:
        index = int(digit, 16) if digit in "0123456789abcdef" and digit else 0
        r, g, b = _rgb(self.palette[index] if index < len(self.palette) else "#000000")
        return f"\x1b[{ground};2;{r};{g};{b}m"

    def _row(self, y: int, row: dict[str, str]) -> str:
        out = [f"\x1b[{y};1H"]
        last = None
        for char, fg, bg in zip(row["line"], row["text"], row["background"], strict=False):
            if (fg, bg) != last:
                out.append(self._colour(fg, 38) + self._colour(bg, 48))
                last = (fg, bg)
            out.append(char if char.isprintable() else "?")
        out.append("\x1b[0m\x1b[K")
        return "".join(out)

    def draw(self, frame: dict[str, Any]) -> str:
        """The ANSI text that brings the terminal to ``frame``."""
        out = []
        height = frame.get("height", self.height)
        if height != self.height:
            self.rows = {y: row for y, row in self.rows.items() if int(y) <= height}
            self.height = height
            out.append("\x1b[2J")
        changed = dict(frame.get("rows") or {})
        palette = frame.get("palette")
        if isinstance(palette, list):
            self.palette = palette
            changed = {**self.rows, **changed}  # every row, in the new colours
        self.rows.update(changed)
        for y in sorted(changed, key=int):
            out.append(self._row(int(y), changed[y]))
        out.append(f"\x1b[{frame.get('cursorY', 1)};{frame.get('cursorX', 1)}H")
        out.append("\x1b[?25h" if frame.get("cursorBlink") else "\x1b[?25l")
        return "".join(out)


# Terminal escape sequences -> CraftOS key names.
_SEQUENCES = {
    b"\x1b[A": "up",
    b"\x1b[B": "down",
    b"\x1b[C": "right",
    b"\x1b[D": "left",
    b"\x1b[H": "home",
    b"\x1b[F": "end",
    b"\x1b[3~": "delete",
    b"\x1b[5~": "pageUp",
    b"\x1b[6~": "pageDown",
    b"\x1bOP": "f1",
}
_CONTROLS = {
    b"\r": "enter",
    b"\n": "enter",
    b"\x7f": "backspace",
    b"\x08": "backspace",
    b"\t": "tab",
}


def events_of(data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """
    What the operator typed (raw terminal bytes) as ``input`` events, and
    whether they pressed ``Ctrl-]`` (nothing after it is sent).  Ctrl-T is
    terminate; an escape sequence not known here is dropped.
    """
    events: list[dict[str, Any]] = []
    i = 0
    while i < len(data):
        byte = data[i : i + 1]
        if byte == LEAVE:
            return events, True
        if byte == b"\x1b":
            for sequence, key in _SEQUENCES.items():
                if data.startswith(sequence, i):
                    events.append({"key": key})
                    i += len(sequence)
                    break
            else:
                i = _after_sequence(data, i)
            continue
        if byte in _CONTROLS:
            events.append({"key": _CONTROLS[byte]})
        elif byte == b"\x14":
            events.append({"terminate": True})
        elif byte[0] >= 0x20:
            # A UTF-8 character whole; the computer takes one byte a char: ASCII, else "?".
            end = i + 1
            while end < len(data) and data[end] & 0xC0 == 0x80:
                end += 1
            events.append({"char": chr(data[i]) if end == i + 1 else "?"})
            i = end
            continue
        i += 1
    return events, False


def _after_sequence(data: bytes, i: int) -> int:
    """Past the escape sequence at ``i`` (ESC [ or ESC O, up to its final byte), or ESC alone."""
    if data[i + 1 : i + 2] not in (b"[", b"O"):
        return i + 1
    end = i + 2
    while end < len(data) and not 0x40 <= data[end] <= 0x7E:
        end += 1
    return end + 1


def _frames(response: Any, out: Any, renderer: Renderer, stop: threading.Event) -> None:
    """The stream's frames drawn as they come; ``stop`` set when it ends."""
    try:
        for line in response:
            if line.startswith(b"event: error"):
                break
            if line.startswith(b"data: "):
                out.write(renderer.draw(json.loads(line[6:])))
                out.flush()
    except (OSError, ValueError):
        pass
    finally:
        stop.set()


def attach(
    open_stream: Any,
    send: Any,
    can_type: bool,
    stdin_fd: int,
    out: Any,
) -> None:
    """
    Draw the stream ``open_stream()`` returns on ``out`` until it ends or the
    operator presses Ctrl-]; typed keys go to ``send(events)`` if ``can_type``.
    """
    renderer = Renderer()
    stop = threading.Event()
    response = open_stream()
    saved = termios.tcgetattr(stdin_fd)
    try:
        tty.setraw(stdin_fd)
        out.write("\x1b[2J\x1b[H")
        if not can_type:
            out.write("read-only: the computer has not allowed input (Ctrl-] leaves)\r\n")
        out.flush()
        threading.Thread(target=_frames, args=(response, out, renderer, stop), daemon=True).start()
        while not stop.is_set():
            ready, _, _ = select.select([stdin_fd], [], [], 0.2)
            if not ready:
                continue
            events, leave = events_of(os.read(stdin_fd, 1024))
            if events and can_type:
                send(events)
            if leave:
                break
    finally:
        termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        if stop.is_set():
            response.close()
        # Else the frames' thread is blocked reading the stream, holding its buffer's lock:
        # closing it would wait for the next frame, and an idle screen sends none.  The thread
        # is a daemon and the command ends now; the connection ends with the process.
        out.write(f"\x1b[0m\x1b[?25h\x1b[{renderer.height + 1};1H\r\n")
        out.flush()


def stream_request(url: str, token: str | None) -> urllib.request.Request:
    request = urllib.request.Request(url, method="GET")
    request.add_header("Accept", "text/event-stream")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


def run(args: Any, call: Any, token: str | None, path: Any, failed: type[Exception]) -> int:
    """``trapsandbox-ctl attach``: ``call``/``path`` are ctl's, so errors read as its others."""
    if not os.isatty(sys.stdin.fileno()):
        raise failed("attach needs a terminal (stdin is not a tty)")
    listing = call(args, "GET", "/computers")
    found = [c for c in listing.get("computers", []) if c.get("traposId") == args.trapos_id]
    if not found:
        raise failed(f"{args.trapos_id} is not connected")
    capabilities = found[0].get("capabilities") or []
    if "screen" not in capabilities:
        raise failed(f'{args.trapos_id} has not allowed screen: on it, run "sandbox allow screen"')
    url = args.url.rstrip("/") + path(args.trapos_id, "screen/stream", args.account)

    def open_stream() -> Any:
        try:
            return urllib.request.urlopen(stream_request(url, token), timeout=None)
        except OSError as error:
            raise failed(f"cannot watch {args.trapos_id}: {error}") from None

    def send(events: list[dict[str, Any]]) -> None:
        try:
            call(args, "POST", path(args.trapos_id, "input", args.account), {"events": events})
        except failed:
            pass  # a key lost is not worth leaving for

    attach(open_stream, send, "input" in capabilities, sys.stdin.fileno(), sys.stdout)
    return 0
