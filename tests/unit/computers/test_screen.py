"""ScreenState: a screen_watch's compact frames as operators get them (SPEC §14)."""

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.computers.screen import ScreenState, compact, expand

BLIT = "0123456789abcdef"


def row(width):
    # Runs make trimming matter: a few characters, then one repeated.
    chars = st.text(alphabet=" ab", min_size=width, max_size=width)
    colours = st.text(alphabet=BLIT[:3], min_size=width, max_size=width)
    return st.tuples(chars, colours, colours)


@st.composite
def screens(draw):
    width = draw(st.integers(1, 12))
    height = draw(st.integers(1, 6))
    rows = [draw(row(width)) for _ in range(height)]
    edits = draw(
        st.lists(st.dictionaries(st.integers(1, height), row(width), max_size=height), max_size=6)
    )
    return width, height, rows, edits


def wire_rows(rows):
    """Rows as the computer sends them (libsandbox.lua's compactRow)."""
    return {
        str(y): {"line": compact(line), "text": compact(text), "background": compact(back)}
        for y, (line, text, back) in rows.items()
    }


def first_frame(width, height, rows):
    return {
        "type": "screen",
        "width": width,
        "height": height,
        "cursorX": 1,
        "cursorY": 1,
        "cursorBlink": True,
        "rows": wire_rows(dict(enumerate(rows, 1))),
        "palette": ["#f0f0f0"] * 16,
    }


class ScreenStateTests(SynchronousTestCase):
    @settings(max_examples=200, deadline=None)
    @given(screens())
    def test_the_expanded_state_is_the_screen(self, case):
        width, height, rows, edits = case
        screen = dict(enumerate(rows, 1))
        state = ScreenState()
        frame = state.apply(first_frame(width, height, rows))
        self.assertEqual(
            {int(y): (r["line"], r["text"], r["background"]) for y, r in frame["rows"].items()},
            screen,
        )
        for n, edit in enumerate(edits):
            screen.update(edit)
            frame = state.apply(
                {"type": "screen", "cursorX": n, "cursorY": 2, "rows": wire_rows(edit)}
            )
            self.assertEqual(state.rows, screen)
            # Every frame carries the size and blink; only the changed rows, at full width.
            self.assertEqual(
                (frame["width"], frame["height"], frame["cursorX"], frame["cursorBlink"]),
                (width, height, n, True),
            )
            self.assertEqual(sorted(frame["rows"]), sorted(str(y) for y in edit))
            self.assertNotIn("palette", frame)

    def test_the_compact_form_is_the_luas(self):
        self.assertEqual(compact("> hi          "), "> hi ")
        self.assertEqual(compact("0000"), "0")
        self.assertEqual(compact("ab"), "ab")
        self.assertEqual(compact(""), "")
        self.assertEqual(expand("> hi ", 8, " "), "> hi    ")
        self.assertEqual(expand("", 3, "f"), "fff")
        self.assertEqual(expand("abcdef", 3, " "), "abc")

    def test_a_resize_and_the_palette(self):
        state = ScreenState()
        state.apply(first_frame(4, 3, [("ab  ", "0000", "ffff")] * 3))
        frame = state.apply({"cursorX": 1, "cursorY": 1, "width": 6, "height": 2, "rows": {}})
        self.assertEqual((frame["width"], frame["height"]), (6, 2))
        self.assertEqual(state.rows[1], ("ab    ", "000000", "ffffff"))
        self.assertNotIn(3, state.rows)
        frame = state.apply({"cursorX": 1, "cursorY": 1, "palette": ["#000000"] * 16, "rows": []})
        self.assertEqual((frame["rows"], frame["palette"]), ({}, ["#000000"] * 16))

    def test_nonsense_from_the_computer_is_left_out(self):
        state = ScreenState()
        frame = state.apply(
            {
                "width": 10**9,
                "height": 2,
                "cursorX": "x",
                "rows": {"0": {}, "3": {"line": "a"}, "x": {}, "1": "no", "2": {"line": 5}},
            }
        )
        self.assertEqual(frame["width"], 512)
        self.assertEqual(frame["cursorX"], 1)
        self.assertEqual(list(frame["rows"]), ["2"])
        self.assertEqual(frame["rows"]["2"]["line"], " " * 512)
