"""trapsandbox-ctl attach without a terminal: frames as ANSI, keys as input events."""

from twisted.trial.unittest import SynchronousTestCase

from trapsandbox.ops.attach import Renderer, events_of

FRAME = {
    "type": "screen",
    "width": 3,
    "height": 2,
    "cursorX": 2,
    "cursorY": 1,
    "cursorBlink": True,
    "rows": {
        "1": {"line": "ab ", "text": "00e", "background": "fff"},
        "2": {"line": "   ", "text": "000", "background": "fff"},
    },
}


class RendererTests(SynchronousTestCase):
    def test_rows_in_the_palettes_colours_then_the_cursor(self):
        out = Renderer().draw(FRAME)
        self.assertTrue(out.startswith("\x1b[2J\x1b[1;1H"))
        # White on black (CraftOS's defaults), then red for the third cell.
        self.assertIn("\x1b[38;2;240;240;240m\x1b[48;2;17;17;17mab", out)
        self.assertIn("\x1b[38;2;204;76;76m\x1b[48;2;17;17;17m ", out)
        self.assertIn("\x1b[2;1H", out)
        self.assertTrue(out.endswith("\x1b[1;2H\x1b[?25h"))

    def test_later_frames_draw_only_their_rows_and_a_palette_redraws_all(self):
        renderer = Renderer()
        renderer.draw(FRAME)
        out = renderer.draw({**FRAME, "rows": {"2": FRAME["rows"]["2"]}, "cursorBlink": False})
        self.assertNotIn("\x1b[1;1H", out)
        self.assertNotIn("\x1b[2J", out)
        self.assertTrue(out.endswith("\x1b[?25l"))
        palette = ["#000000"] * 15 + ["#ffffff"]
        out = renderer.draw({**FRAME, "rows": {}, "palette": palette})
        self.assertIn("\x1b[1;1H\x1b[38;2;0;0;0m\x1b[48;2;255;255;255mab", out)
        self.assertIn("\x1b[2;1H", out)

    def test_control_characters_are_not_sent_to_the_terminal(self):
        frame = {**FRAME, "rows": {"1": {"line": "\x1b]x", "text": "000", "background": "fff"}}}
        self.assertNotIn("\x1b]", Renderer().draw(frame))


class KeyTests(SynchronousTestCase):
    def test_keys_as_craftos_events(self):
        events, leave = events_of(b"hi\r\x7f\t\x1b[A\x1b[D\x1b[3~\x14")
        self.assertEqual(
            events,
            [
                {"char": "h"},
                {"char": "i"},
                {"key": "enter"},
                {"key": "backspace"},
                {"key": "tab"},
                {"key": "up"},
                {"key": "left"},
                {"key": "delete"},
                {"terminate": True},
            ],
        )
        self.assertFalse(leave)

    def test_ctrl_close_bracket_leaves_and_nothing_after_it_is_sent(self):
        self.assertEqual(events_of(b"a\x1db"), ([{"char": "a"}], True))

    def test_unknown_sequences_and_wide_characters(self):
        self.assertEqual(events_of(b"\x1b[99~x\x1b")[0], [{"char": "x"}])
        self.assertEqual(
            events_of("aé€".encode())[0], [{"char": "a"}, {"char": "?"}] + [{"char": "?"}]
        )
