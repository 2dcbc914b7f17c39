"""ScreenState: a screen_watch's compact frames as operators get them (SPEC §14)."""

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from trapsandbox import errors
from trapsandbox.computers.screen import ScreenGate, ScreenState, compact, expand, max_fps, merge
from trapsandbox.errors import GatewayError
from trapsandbox.limits import MAX_SCREEN_HEIGHT, MAX_SCREEN_WIDTH

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
        # (A frame that wide never gets here from a computer: ``ScreenGate`` refuses it.)
        self.assertEqual(frame["width"], MAX_SCREEN_WIDTH)
        self.assertEqual(frame["cursorX"], 1)
        self.assertEqual(list(frame["rows"]), ["2"])
        self.assertEqual(frame["rows"]["2"]["line"], " " * MAX_SCREEN_WIDTH)


def frame(**rows):
    return {"type": "screen", "cursorX": 1, "cursorY": 1, "rows": rows}


class MergeTests(SynchronousTestCase):
    def test_the_later_frame_wins_and_the_rows_are_both(self):
        first = {"width": 5, "height": 3, "cursorX": 1, "rows": {"1": {"line": "a"}, "2": {}}}
        later = {"cursorX": 4, "rows": {"2": {"line": "b"}, "3": {"line": "c"}}}
        self.assertEqual(
            merge(first, later),
            {
                "width": 5,
                "height": 3,
                "cursorX": 4,
                "rows": {"1": {"line": "a"}, "2": {"line": "b"}, "3": {"line": "c"}},
            },
        )

    def test_rows_no_screen_has_are_not_kept(self):
        keys = {str(y): {} for y in range(1, 10_000)} | {"x": {}, "0": {}}
        merged = merge({}, {"rows": keys})
        self.assertEqual(len(merged["rows"]), MAX_SCREEN_HEIGHT)

    def test_a_frame_merged_then_applied_draws_what_applying_each_draws(self):
        frames = [
            {"width": 4, "height": 2, "cursorX": 1, "cursorY": 1, "rows": {"1": {}, "2": {}}},
            {"cursorX": 2, "cursorY": 1, "rows": {"1": {"line": "ab"}}},
            {"cursorX": 3, "cursorY": 2, "cursorBlink": True, "rows": {"2": {"line": "z"}}},
        ]
        one_by_one = ScreenState()
        for f in frames:
            one_by_one.apply(f)
        merged = ScreenState()
        merged.apply(frames[0])
        merged.apply(merge(frames[1], frames[2]))
        self.assertEqual(merged.rows, one_by_one.rows)
        self.assertEqual(
            (merged.cursor_x, merged.cursor_y, merged.cursor_blink),
            (one_by_one.cursor_x, one_by_one.cursor_y, one_by_one.cursor_blink),
        )


class ScreenGateTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.delivered = []
        self.room = None  # a Deferred of the watcher's room while it has none

    def deliver(self, compact_frame):
        if self.room is not None:
            return self.room
        self.delivered.append(compact_frame)
        return None

    def gate(self, fps=10):
        return ScreenGate(self.clock, fps, self.deliver)

    def test_the_first_frame_goes_at_once(self):
        gate = self.gate()
        gate.take(frame(**{"1": {"line": "a"}}))
        self.assertEqual(len(self.delivered), 1)

    def test_frames_faster_than_max_fps_are_merged_into_the_next_interval(self):
        gate = self.gate(fps=10)
        gate.take(frame(**{"1": {"line": "a"}}))
        for n in range(1000):  # a computer flooding: none goes before its time
            gate.take(frame(**{"2": {"line": str(n)}}))
        self.assertEqual(len(self.delivered), 1)
        self.clock.advance(0.099)
        self.assertEqual(len(self.delivered), 1)
        self.clock.advance(0.001)
        self.assertEqual(len(self.delivered), 2)
        self.assertEqual(self.delivered[1]["rows"], {"2": {"line": "999"}})
        self.clock.advance(1)  # nothing more came: nothing more goes
        self.assertEqual(len(self.delivered), 2)
        self.assertFalse(self.clock.getDelayedCalls())

    def test_a_frame_after_a_quiet_interval_goes_at_once(self):
        gate = self.gate(fps=20)
        gate.take(frame(**{"1": {}}))
        self.clock.advance(0.05)
        gate.take(frame(**{"1": {"line": "b"}}))
        self.assertEqual(len(self.delivered), 2)

    def test_no_room_keeps_the_frame_merged_until_there_is(self):
        gate = self.gate(fps=10)
        room = self.room = Deferred()
        gate.take(frame(**{"1": {"line": "a"}}))
        gate.take(frame(**{"2": {"line": "b"}}))
        self.clock.advance(0.3)
        self.assertEqual(self.delivered, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])  # waits for room: no polling
        self.room = None
        room.callback(None)  # at once, not at the next interval
        self.assertEqual(
            [f["rows"] for f in self.delivered], [{"1": {"line": "a"}, "2": {"line": "b"}}]
        )

    def test_a_watch_ended_while_waiting_for_room_stops_waiting(self):
        gate = self.gate()
        room = self.room = Deferred()
        gate.take(frame(**{"1": {"line": "a"}}))
        gate.stop()
        self.assertTrue(room.called)  # cancelled (and its CancelledError handled)
        self.assertEqual(self.delivered, [])

    def test_a_screen_far_beyond_craftos_ends_the_watch_with_a_reason(self):
        gate = self.gate()
        gate.take(frame(**{"1": {}}))
        gate.take(frame(**{"2": {}}))  # waiting for its time
        with self.assertRaises(GatewayError) as raised:
            gate.take({"width": 512, "height": 512, "rows": {}})
        self.assertEqual(raised.exception.code, errors.TOO_LARGE)
        self.assertIn("512x512", raised.exception.message)
        self.assertIn(f"at most {MAX_SCREEN_WIDTH}x{MAX_SCREEN_HEIGHT}", raised.exception.message)
        self.assertFalse(self.clock.getDelayedCalls())  # and nothing more is delivered

    def test_craftos_largest_monitor_is_relayed(self):
        gate = self.gate()
        gate.take({"width": 164, "height": 81, "rows": {}})
        self.assertEqual(len(self.delivered), 1)

    def test_stop_cancels_what_waits(self):
        gate = self.gate()
        gate.take(frame(**{"1": {}}))
        gate.take(frame(**{"2": {}}))
        gate.stop()
        self.clock.advance(1)
        self.assertEqual(len(self.delivered), 1)

    def test_max_fps_is_the_watch_s_or_the_default(self):
        self.assertEqual(
            [
                max_fps(p)
                for p in ({}, {"maxFps": 20}, {"maxFps": 1}, {"maxFps": 99}, {"maxFps": "5"})
            ],
            [10, 20, 1, 10, 10],
        )
