"""
A screen_watch's frames, as operators get them (SPEC §14).

The computer sends compact frames (``libsandbox.lua``'s ``Watch:frame``): the
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
"""

from __future__ import annotations

from typing import Any

from trapsandbox.limits import MAX_SCREEN_SIDE

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
    """The twin of ``libsandbox.lua``'s ``compactRow`` for one part (tests, and the Lua's rule)."""
    stop = len(s)
    while stop > 1 and s[stop - 2] == s[-1]:
        stop -= 1
    return s[:stop]


def _side(value: object, fallback: int) -> int:
    if type(value) is int and value >= 0:
        return min(value, MAX_SCREEN_SIDE)
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
        width = _side(compact_frame.get("width"), self.width)
        height = _side(compact_frame.get("height"), self.height)
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
