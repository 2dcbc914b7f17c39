"""
A screen_watch's frames, as operators get them (SPEC §14).

The computer sends compact frames (``lua/sandbox/screen.lua``'s ``Watch:frame``): the
first has every row, the size, the cursor, its blink and the palette; later
ones only the rows that changed and the cursor, with the size, the blink and
the palette only when they changed; and each row's ``line``, ``text`` and
``background`` has its final run of one character cut to one (a string
shorter than the width goes on with its last character).  That keeps one row
change under 300 bytes on the computer's wire.

Operators get whole rows and the whole state in every frame instead: a
``ScreenState`` per watch turns each compact frame into
``{type: "screen", width, height, cursorX, cursorY, cursorBlink, rows: {"<y>":
{line, text, background}}, palette?}``, rows full width, so a console or a
terminal draws a frame without knowing the computer's encoding.  Everything
the gateway hands to operators (HTTP's stream, ``/operator``, ``ctl attach``)
goes through it.

What a computer sends is not trusted to be small or slow: a ``ScreenGate``
stands between the computer and each watch (``hooks.ScreenPacing``).  It
refuses a frame claiming a screen far beyond CraftOS's (``MAX_SCREEN_WIDTH``
x ``MAX_SCREEN_HEIGHT``: the watch is ended with ``too_large``), and passes
frames on at most ``maxFps`` times a second, the compact frames arriving
meanwhile merged into one (the latest state of each row): a computer sending
faster costs the gateway a dict merge per frame, and the expansion to whole
rows (``ScreenState``) happens once per frame passed on, only when the
watcher has room for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from trapsandbox import errors
from trapsandbox.computers import wire
from trapsandbox.errors import GatewayError
from trapsandbox.limits import (
    DEFAULT_SCREEN_FPS,
    MAX_SCREEN_FPS,
    MAX_SCREEN_HEIGHT,
    MAX_SCREEN_WIDTH,
)

log = Logger()

# Whether a watcher has room for a screen frame now: None, or the Deferred of when it will.
Room = Callable[[], "Deferred[None] | None"]

# What a missing or empty part of a row stands for: a blank in white on black.
_BLANK = {"line": " ", "text": "0", "background": "f"}
_PARTS = ("line", "text", "background")


def expand(s: str, width: int, blank: str) -> str:
    """A compact row part at full ``width``: its last character repeated, or cut."""
    if not s:
        s = blank
    if len(s) >= width:
        return s[:width]
    return s + s[-1] * (width - len(s))


def compact(s: str) -> str:
    """The twin of ``lua/sandbox/screen.lua``'s ``compactRow`` for one part (tests, the rule)."""
    stop = len(s)
    while stop > 1 and s[stop - 2] == s[-1]:
        stop -= 1
    return s[:stop]


def _side(value: object, fallback: int, most: int) -> int:
    if type(value) is int and value >= 0:
        return min(value, most)
    return fallback


def _whole(value: object, fallback: int) -> int:
    return value if type(value) is int else fallback


class ScreenState:
    """
    One watch's screen as its frames built it.  ``apply`` takes each compact
    frame from the computer, in order, and gives the frame for operators;
    ``rows`` (``y`` -> ``(line, text, background)``, from 1) is the screen.
    """

    def __init__(self) -> None:
        self.width = 0
        self.height = 0
        self.cursor_x = 1
        self.cursor_y = 1
        self.cursor_blink = False
        self.palette: list[str] | None = None
        self.rows: dict[int, tuple[str, str, str]] = {}

    def apply(self, compact_frame: dict[str, Any]) -> dict[str, Any]:
        """The operators' frame for the computer's next ``compact_frame``."""
        width = _side(compact_frame.get("width"), self.width, MAX_SCREEN_WIDTH)
        height = _side(compact_frame.get("height"), self.height, MAX_SCREEN_HEIGHT)
        if width != self.width or height != self.height:
            self._resize(width, height)
        self.cursor_x = _whole(compact_frame.get("cursorX"), self.cursor_x)
        self.cursor_y = _whole(compact_frame.get("cursorY"), self.cursor_y)
        blink = compact_frame.get("cursorBlink")
        if type(blink) is bool:
            self.cursor_blink = blink
        rows: dict[str, dict[str, str]] = {}
        sent = compact_frame.get("rows")
        for key, row in sent.items() if isinstance(sent, dict) else ():
            y = _row_number(key)
            if y is None or not 1 <= y <= height or not isinstance(row, dict):
                continue
            parts = tuple(
                expand(p if isinstance(p := row.get(name), str) else "", width, _BLANK[name])
                for name in _PARTS
            )
            self.rows[y] = parts  # type: ignore[assignment]
            rows[str(y)] = dict(zip(_PARTS, parts, strict=True))
        frame: dict[str, Any] = {
            "type": "screen",
            "width": width,
            "height": height,
            "cursorX": self.cursor_x,
            "cursorY": self.cursor_y,
            "cursorBlink": self.cursor_blink,
            "rows": rows,
        }
        palette = compact_frame.get("palette")
        if isinstance(palette, list) and all(isinstance(c, str) for c in palette):
            self.palette = palette[:16]
            frame["palette"] = self.palette
        return frame

    def _resize(self, width: int, height: int) -> None:
        # The computer sends every row after a resize; until then, rows keep what they had.
        self.width, self.height = width, height
        self.rows = {
            y: tuple(expand(p, width, _BLANK[n]) for p, n in zip(row, _PARTS, strict=True))  # type: ignore[misc]
            for y, row in self.rows.items()
            if y <= height
        }


def _row_number(key: object) -> int | None:
    if isinstance(key, str) and key.isdigit() and len(key) < 6:
        return int(key)
    return None


def too_large(compact_frame: dict[str, Any]) -> GatewayError | None:
    """Why ``compact_frame`` is refused: a screen far larger than CraftOS's (None: it is not)."""
    width, height = compact_frame.get("width"), compact_frame.get("height")
    wide = type(width) is int and width > MAX_SCREEN_WIDTH
    tall = type(height) is int and height > MAX_SCREEN_HEIGHT
    if not (wide or tall):
        return None
    return GatewayError(
        errors.TOO_LARGE,
        f"the computer sent a screen of {wire.cut(repr(width))}x{wire.cut(repr(height))}; "
        f"at most {MAX_SCREEN_WIDTH}x{MAX_SCREEN_HEIGHT} is relayed (CraftOS's largest "
        "monitor is 164x81): the watch is ended",
    )


def merge(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """
    One compact frame saying what ``earlier`` then ``later`` said: ``later``'s
    fields win, and the rows are both frames' (``later``'s row where both
    have it).  Rows that no screen could have are left out, so a merge never
    holds more than ``MAX_SCREEN_HEIGHT`` rows however many keys were sent.
    """
    merged = {**earlier, **later}
    rows = earlier.get("rows")
    kept = dict(rows) if isinstance(rows, dict) else {}
    sent = later.get("rows")
    for key, row in sent.items() if isinstance(sent, dict) else ():
        y = _row_number(key)
        if y is not None and 1 <= y <= MAX_SCREEN_HEIGHT:
            kept[key] = row
    merged["rows"] = kept
    return merged


def max_fps(payload: dict[str, Any]) -> float:
    """A ``screen_watch`` payload's ``maxFps`` (SPEC §14: 1..20, default 10)."""
    fps = payload.get("maxFps")
    if type(fps) in (int, float) and 1 <= fps <= MAX_SCREEN_FPS:
        return float(fps)
    # (Out of range: the computer refuses the watch; until it does, the default.)
    return float(DEFAULT_SCREEN_FPS)


class ScreenGate:
    """
    Between a computer and one screen watch: ``take`` each compact frame the
    computer sends (raises ``GatewayError(too_large)`` for one that must end
    the watch); ``deliver`` hears at most ``fps`` frames a second, each the
    merge of those that came since the last.  ``deliver`` may answer a
    Deferred (its watcher has no room now, and that fires when it has): the
    frame is kept, merged with what comes next, and offered again then.
    ``stop`` when the watch ends.
    """

    def __init__(
        self,
        clock: IReactorTime,
        fps: float,
        deliver: Callable[[dict[str, Any]], Deferred[None] | None],
    ) -> None:
        self._clock = clock
        self._interval = 1.0 / fps
        self._deliver = deliver
        self._pending: dict[str, Any] | None = None
        self._last = -math.inf
        self._timer: IDelayedCall | None = None
        self._room: Deferred[None] | None = None

    def take(self, compact_frame: dict[str, Any]) -> None:
        refusal = too_large(compact_frame)
        if refusal is not None:
            self.stop()
            raise refusal
        if self._pending is None:
            self._pending = merge({}, compact_frame)
        else:
            self._pending = merge(self._pending, compact_frame)
        if self._timer is not None or self._room is not None:
            return  # it goes when the timer fires, or the watcher has room
        wait = self._last + self._interval - self._clock.seconds()
        if wait <= 0:
            self._offer()
        else:
            self._timer = self._clock.callLater(wait, self._offer)

    def _offer(self) -> None:
        self._timer = None
        frame = self._pending
        if frame is None:
            return
        try:
            room = self._deliver(frame)
        except Exception:
            log.failure("a watcher of a screen failed")
            room = None
        if room is not None:
            self._room = room
            room.addCallbacks(self._has_room, lambda failure: failure.trap(CancelledError))
            return
        self._pending = None
        self._last = self._clock.seconds()

    def _has_room(self, _: object) -> None:
        self._room = None
        self._offer()

    def stop(self) -> None:
        """The watch ended: nothing more is delivered."""
        self._pending = None
        room, self._room = self._room, None
        if room is not None:
            room.cancel()
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None


def frames_to(
    on_frame: Callable[[dict[str, Any]], None], room: Room | None = None
) -> Callable[[dict[str, Any]], Deferred[None] | None]:
    """
    A screen watch's compact frames to ``on_frame``, expanded (``ScreenState``)
    only when the watcher has room for one (``room()`` answers None; no
    ``room``: always): else the Deferred of its room, and the registry's
    ``ScreenGate`` keeps the frame (merged with the next) until then.
    """
    state = ScreenState()

    def relay(compact: dict[str, Any]) -> Deferred[None] | None:
        wait = None if room is None else room()
        if wait is not None:
            return wait
        on_frame(state.apply(compact))
        return None

    return relay
