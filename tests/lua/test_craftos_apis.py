"""The CraftOS harness's APIs against what CC:Tweaked does: the terminal and term.redirect,
window, colours, the disk (space, binary handles, messages), the yield limit, events,
multishell tabs, shell and textutils.

Expected values come from CC:Tweaked's sources (ROM Lua and Java): each test names what it
pins. A chunk stores what it saw in the global table ``R``, read back as JSON."""

import json

from twisted.internet import defer
from twisted.trial.unittest import TestCase

from tests.harness.craftos import Computer

ABORT = "Too long without yielding"


class CraftOSTestCase(TestCase):
    timeout = 30

    def computer(self, **kwargs):
        kwargs.setdefault("id", 1)
        c = Computer(self.mktemp(), **kwargs)
        self.addCleanup(c.shutdown)
        return c

    @staticmethod
    def results(c):
        return json.loads(c.eval("return textutils.serializeJSON(R)"))

    @defer.inlineCallbacks
    def run_chunk(self, code, c=None, timeout=5.0, **kwargs):
        """Run ``code`` (with ``R = {}`` first) as a process to its end; returns
        ``(computer, R, (ok, error))``."""
        c = c or self.computer(**kwargs)
        proc = c.run_lua("_G.R = {}\n" + code)
        yield c.wait_for(lambda: proc.finished, timeout, "the chunk to end")
        return c, self.results(c), (proc.ok, proc.error)

    @defer.inlineCallbacks
    def run_ok(self, code, **kwargs):
        c, r, (ok, err) = yield self.run_chunk(code, **kwargs)
        self.assertTrue(ok, err)
        return c, r


class TerminalTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_print_wraps_words_and_scrolls_like_bios_write(self):
        c, r = yield self.run_ok(
            """
            R.a = print('hello world foo')
            R.b = print('abcdefghijklmnop')
            R.cursor = { term.getCursorPos() }
            """,
            size=(10, 3),
            multishell=False,
        )
        # "world" does not fit after "hello " and moves down; the 16-letter word is broken at
        # the edge; the bottom line scrolls the screen up.
        self.assertEqual(c.screen_lines(), ["abcdefghij", "klmnop    ", "          "])
        self.assertEqual((r["a"], r["b"]), (2, 2))  # print returns the lines it moved down
        self.assertEqual(r["cursor"], [1, 3])
        self.assertEqual(c.output, "hello world foo\nabcdefghijklmnop\n")  # the flat log

    @defer.inlineCallbacks
    def test_write_blit_colours_and_cursor(self):
        c, r = yield self.run_ok(
            """
            term.setCursorPos(3, 2)
            term.setTextColour(colours.red)
            term.setBackgroundColour(colours.blue)
            term.write('ab')
            R.afterWrite = { term.getCursorPos() }
            term.blit('XyZ', 'E01', 'f0a')
            R.afterBlit = { term.getCursorPos() }
            R.colours = { term.getTextColour(), term.getBackgroundColour() }
            R.sameLength = { pcall(term.blit, 'ab', '0', '00') }
            R.zero = { pcall(term.setTextColour, 0) }
            R.big = { pcall(term.setTextColour, 2 ^ 16) }
            term.setTextColour(3)
            R.three = term.getTextColour()
            R.isColour = { term.isColour(), term.isColor() }
            R.size = { term.getSize() }
            term.setCursorPos(0, 0)
            term.write('unseen')
            R.outside = { term.getCursorPos() }
            R.write42 = true
            term.setCursorPos(1, 3)
            term.write(42)
            term.write(1.5)
            """,
            size=(12, 4),
            multishell=False,
        )
        screen = c.screen()
        self.assertEqual(screen.lines[1], "  abXyZ     ")
        self.assertEqual(screen.text_colours[1], "00eeE0100000")
        self.assertEqual(screen.background_colours[1], "ffbbf0afffff")
        self.assertEqual(r["afterWrite"], [5, 2])
        self.assertEqual(r["afterBlit"], [8, 2])
        self.assertEqual(r["colours"], [16384, 2048])
        self.assertEqual(r["sameLength"], [False, "Arguments must be the same length"])
        self.assertEqual(r["zero"], [False, "Colour out of range"])
        self.assertEqual(r["big"], [False, "Colour out of range"])
        self.assertEqual(r["three"], 2)  # the highest set bit: orange
        self.assertEqual(r["isColour"], [True, True])
        self.assertEqual(r["size"], [12, 4])
        self.assertEqual(r["outside"], [6, 0])  # off-screen writes move the cursor only
        self.assertNotIn("unseen", "".join(screen.lines))
        self.assertEqual(screen.lines[2], "421.5       ")
        self.assertEqual(screen.cursor, (6, 3))

    @defer.inlineCallbacks
    def test_clear_clear_line_and_scroll_use_the_current_colours(self):
        c, _ = yield self.run_ok(
            """
            for i = 1, 3 do term.setCursorPos(1, i) term.write('line' .. i) end
            term.setBackgroundColour(colours.green)
            term.setCursorPos(1, 2)
            term.clearLine()
            term.scroll(-1)
            """,
            size=(5, 3),
            multishell=False,
        )
        screen = c.screen()
        self.assertEqual(screen.lines, ["     ", "line1", "     "])
        self.assertEqual(screen.background_colours, ["ddddd", "fffff", "ddddd"])
        c2, _ = yield self.run_ok(
            "term.write('x') term.setBackgroundColour(colours.red) term.clear()",
            size=(3, 2),
            multishell=False,
        )
        self.assertEqual(c2.screen().lines, ["   ", "   "])
        self.assertEqual(c2.screen().background_colours, ["eee", "eee"])

    @defer.inlineCallbacks
    def test_basic_computer_is_not_colour(self):
        _, r = yield self.run_ok("R.c = term.isColour()", colour=False, multishell=False)
        self.assertIs(r["c"], False)

    @defer.inlineCallbacks
    def test_palette(self):
        _, r = yield self.run_ok(
            """
            R.red = { term.getPaletteColour(colours.red) }
            term.setPaletteColour(colours.red, 0x112233)
            R.changed = { term.getPaletteColour(colours.red) }
            R.native = { term.nativePaletteColour(colours.red) }
            R.nativeHasIt = term.native().nativePaletteColour ~= nil
            """,
            multishell=False,
        )

        def close_to(values, rgb):
            self.assertEqual([round(v * 255, 6) for v in values], list(rgb))

        close_to(r["red"], (0xCC, 0x4C, 0x4C))
        close_to(r["changed"], (0x11, 0x22, 0x33))
        close_to(r["native"], (0xCC, 0x4C, 0x4C))
        self.assertIs(r["nativeHasIt"], False)  # term.lua moves it onto term

    @defer.inlineCallbacks
    def test_redirect_looks_methods_up_through_a_metatable_like_craftos(self):
        """CraftOS-PC's term.lua (v2.8.3) and CC:Tweaked's index every native method name on
        the target: a wrapper whose methods come from ``__index`` is complete, a copy of it
        made with ``pairs`` is not, and printError then fails as on a real computer
        ("bios.lua:277: Redirect object is missing method isColour.")."""
        c, r = yield self.run_ok(
            """
            local native = term.current()
            local wrapper = setmetatable({
              write = function(s) return native.write(s) end,
              blit = function(...) return native.blit(...) end,
            }, { __index = native })
            term.redirect(wrapper)
            print('through the wrapper')
            R.wrapped = { pcall(printError, 'an error line') }
            local copy = {}
            for name, fn in pairs(wrapper) do copy[name] = fn end
            term.redirect(copy)
            R.copied = { pcall(printError, 'never drawn') }
            R.stub = rawget(copy, 'isColour') ~= nil
            term.redirect(native)
            """,
            size=(30, 4),
            multishell=False,
        )
        self.assertEqual(r["wrapped"], [True])
        self.assertEqual(
            c.screen_lines()[:2], ["through the wrapper".ljust(30), "an error line".ljust(30)]
        )
        self.assertFalse(r["copied"][0])
        self.assertIn("Redirect object is missing method isColour.", r["copied"][1])
        self.assertTrue(r["stub"])  # term.redirect fills the gap on the target itself

    @defer.inlineCallbacks
    def test_redirect_returns_the_previous_target(self):
        c, r = yield self.run_ok(
            """
            local native = term.native()
            R.startsNative = term.current() == native
            local win = window.create(native, 3, 2, 6, 2)
            local previous = term.redirect(win)
            R.previousIsNative = previous == native
            R.currentIsWin = term.current() == win
            write('one two three')
            R.back = term.redirect(previous) == win
            R.restored = term.current() == native
            R.line1 = { win.getLine(1) }
            R.line2 = { win.getLine(2) }
            local partial = { write = function() end }
            term.redirect(partial)
            local ok, err = pcall(function() return term.getSize() end)
            term.redirect(native)
            R.missing = { ok, err }
            R.self = { pcall(term.redirect, term) }
            """,
            size=(10, 4),
            multishell=False,
        )
        self.assertTrue(r["startsNative"] and r["previousIsNative"] and r["currentIsWin"])
        self.assertTrue(r["back"] and r["restored"])
        # print wrapped at the window's width (6) and scrolled inside it.
        self.assertEqual(r["line1"], ["two   ", "000000", "ffffff"])
        self.assertEqual(r["line2"], ["three ", "000000", "ffffff"])
        self.assertEqual(c.screen_lines()[1:3], ["  two     ", "  three   "])
        self.assertFalse(r["missing"][0])
        self.assertIn("Redirect object is missing method getSize.", r["missing"][1])
        self.assertFalse(r["self"][0])
        self.assertIn("term is not a recommended redirect target", r["self"][1])

    @defer.inlineCallbacks
    def test_print_error_is_red_and_logged(self):
        c, r = yield self.run_ok(
            "printError('bad', 1) R.after = term.getTextColour()", size=(8, 2), multishell=False
        )
        self.assertEqual(c.errors, "bad\t1\n")
        self.assertIn("bad\t1\n", c.output)
        self.assertEqual(c.screen().text_colours[0][:5], "eeeee")
        self.assertEqual(r["after"], 1)

    @defer.inlineCallbacks
    def test_write_expects_a_string_or_number(self):
        _, r = yield self.run_ok("R.e = { pcall(write, {}) } R.n = write(5)", multishell=False)
        self.assertFalse(r["e"][0])
        self.assertIn("bad argument #1", r["e"][1])
        self.assertIn("string or number expected, got table", r["e"][1])
        self.assertEqual(r["n"], 0)


class WindowTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_get_line_after_writes_and_scroll(self):
        c, r = yield self.run_ok(
            """
            local w = window.create(term.current(), 2, 2, 5, 3)
            w.setTextColour(colours.red)
            w.write('ab')
            w.setBackgroundColour(colours.blue)
            w.write('cdefg')
            R.first = { w.getLine(1) }
            R.cursor = { w.getCursorPos() }
            w.scroll(1)
            R.scrolled1 = { w.getLine(1) }
            R.scrolled3 = { w.getLine(3) }
            R.range = { pcall(w.getLine, 4) }
            R.zero = { pcall(w.getLine, 0) }
            """,
            size=(8, 5),
            multishell=False,
        )
        self.assertEqual(r["first"], ["abcde", "eeeee", "ffbbb"])  # clipped at the edge
        self.assertEqual(r["cursor"], [8, 1])
        self.assertEqual(r["scrolled1"], ["     ", "00000", "fffff"])
        self.assertEqual(r["scrolled3"], ["     ", "eeeee", "bbbbb"])  # new lines: current colours
        self.assertFalse(r["range"][0])
        self.assertIn("Line is out of range.", r["range"][1])
        self.assertFalse(r["zero"][0])
        # The window drew itself into its parent at (2, 2); then the scroll redrew it.
        lines = c.screen_lines()
        self.assertEqual(lines[1], "        ")
        self.assertEqual(c.screen().background_colours[3], "fbbbbbff")

    @defer.inlineCallbacks
    def test_blit_lowercases_and_checks_lengths(self):
        _, r = yield self.run_ok(
            """
            local w = window.create(term.current(), 1, 1, 4, 1)
            w.blit('AB', 'EF', '0A')
            R.line = { w.getLine(1) }
            R.bad = { pcall(w.blit, 'a', 'bb', 'c') }
            R.parent = { pcall(window.create, term, 1, 1, 2, 2) }
            """,
            multishell=False,
        )
        self.assertEqual(r["line"], ["AB  ", "ef00", "0aff"])
        self.assertFalse(r["bad"][0])
        self.assertIn("Arguments must be the same length", r["bad"][1])
        self.assertFalse(r["parent"][0])
        self.assertIn("term is not a recommended window parent", r["parent"][1])

    @defer.inlineCallbacks
    def test_invisible_windows_draw_when_shown(self):
        c = self.computer(size=(6, 2), multishell=False)
        yield self.run_ok(
            """
            _G.W = window.create(term.current(), 1, 1, 6, 2, false)
            W.write('hidden')
            R.visible = W.isVisible()
            """,
            c=c,
        )
        self.assertEqual(c.screen_lines(), ["      ", "      "])
        c.eval("W.setVisible(true)")
        self.assertEqual(c.screen_lines(), ["hidden", "      "])
        self.assertIs(c.eval("return W.isVisible()"), True)
        c.eval("term.native().clear() W.redraw()")
        self.assertEqual(c.screen_lines()[0], "hidden")

    @defer.inlineCallbacks
    def test_reposition_keeps_content(self):
        c, r = yield self.run_ok(
            """
            local w = window.create(term.current(), 1, 1, 4, 2)
            w.write('abcd')
            w.setCursorPos(1, 2)
            w.write('efgh')
            term.native().clear()
            w.reposition(3, 2, 2, 3)
            R.pos = { w.getPosition() }
            R.size = { w.getSize() }
            R.lines = { (w.getLine(1)), (w.getLine(2)), (w.getLine(3)) }
            w.reposition(1, 1, 6, 1)
            R.wider = w.getLine(1)
            """,
            size=(6, 4),
            multishell=False,
        )
        self.assertEqual(r["pos"], [3, 2])
        self.assertEqual(r["size"], [2, 3])
        self.assertEqual(r["lines"], ["ab", "ef", "  "])
        self.assertEqual(r["wider"], "ab    ")
        self.assertEqual(c.screen_lines()[0], "ab    ")

    @defer.inlineCallbacks
    def test_window_cursor_moves_the_parent_cursor(self):
        c, r = yield self.run_ok(
            """
            local w = window.create(term.current(), 3, 2, 4, 2)
            w.setCursorPos(2, 2)
            R.parent = { term.getCursorPos() }
            w.setCursorPos(9, 9)
            R.outside = { term.getCursorPos() }
            w.setCursorBlink(true)
            R.blink = term.getCursorBlink()
            """,
            size=(8, 4),
            multishell=False,
        )
        self.assertEqual(r["parent"], [4, 3])
        self.assertEqual(r["outside"], [0, 0])  # window.lua parks the cursor off-screen
        self.assertIs(r["blink"], True)


class ColoursAndKeysTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_colours(self):
        _, r = yield self.run_ok(
            """
            R.blit = { colours.toBlit(colours.white), colours.toBlit(colours.black),
              colors.toBlit(colors.red) }
            R.fromBlit = { colours.fromBlit('e'), colours.fromBlit('f') }
            R.badBlit = { colours.fromBlit('z') == nil, colours.fromBlit('ee') == nil }
            R.range = { pcall(colours.toBlit, 2 ^ 17) }
            R.grey = { colours.grey, colours.gray == nil, colors.gray, colours.lightGrey }
            R.sets = { colours.combine(colours.red, colours.blue),
              colours.subtract(colours.combine(1, 2, 4), 2),
              colours.test(colours.combine(1, 4), 4), colours.test(1, 2) }
            R.rgb = { colours.packRGB(1, 0, 0), colours.packRGB(0, 1, 1),
              colours.unpackRGB(0xFF00CC) }
            """,
        )
        self.assertEqual(r["blit"], ["0", "f", "e"])
        self.assertEqual(r["fromBlit"], [16384, 32768])
        self.assertEqual(r["badBlit"], [True, True])
        self.assertEqual(r["range"], [False, "Colour out of range"])
        self.assertEqual(r["grey"], [128, True, 128, 256])
        self.assertEqual(r["sets"], [18432, 5, True, False])
        self.assertEqual(r["rgb"][:4], [0xFF0000, 0x00FFFF, 1, 0])
        self.assertEqual(round(r["rgb"][4] * 255, 6), 0xCC)

    @defer.inlineCallbacks
    def test_keys(self):
        _, r = yield self.run_ok(
            "R.k = { keys.enter, keys.a, keys.space, keys.leftCtrl, "
            "keys.getName(65), keys.getName(257) }"
        )
        self.assertEqual(r["k"], [257, 65, 32, 341, "a", "enter"])


class DiskTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_binary_round_trip_of_every_byte(self):
        c, r = yield self.run_ok(
            """
            local all = {}
            for i = 0, 255 do all[#all + 1] = string.char(i) end
            all = table.concat(all)
            local h = fs.open('/bytes.bin', 'wb')
            for i = 0, 127 do h.write(i) end  -- a number writes one byte
            h.write(all:sub(129))             -- a string writes its bytes
            h.close()
            h = fs.open('/bytes.bin', 'rb')
            local numbers = {}
            for i = 1, 4 do numbers[i] = h.read() end
            local chunk = h.read(252)
            R.atEnd = { h.read(), h.read(10), h.readAll() }
            R.seek = { h.seek('set', 0) }
            R.all = h.readAll() == all
            R.seekEnd = { h.seek('end', -1) }
            R.last = h.read()
            R.negative = { h.seek('set', -1) }
            h.close()
            R.numbers = numbers
            R.chunk = chunk == all:sub(5)
            R.size = fs.getSize('/bytes.bin')
            local t = fs.open('/bytes.bin', 'r')
            R.text = { t.read(), t.read(2) }  -- text mode reads strings, bytes unchanged
            R.textAll = t.readAll() == all:sub(4)
            t.close()
            R.closed = { pcall(t.read) }
            """
        )
        self.assertEqual(c.read_file("/bytes.bin"), bytes(range(256)))
        self.assertEqual(r["numbers"], [0, 1, 2, 3])
        self.assertTrue(r["chunk"])
        self.assertEqual(r["atEnd"], [None, None, ""])
        self.assertEqual(r["seek"], [0])
        self.assertTrue(r["all"])
        self.assertEqual((r["seekEnd"], r["last"]), ([255], 255))
        self.assertEqual(r["negative"], [None, "Position is negative"])
        self.assertEqual(r["size"], 256)
        self.assertEqual(r["text"], ["\u0000", "\u0001\u0002"])
        self.assertTrue(r["textAll"])
        self.assertEqual(r["closed"][0], False)
        self.assertIn("attempt to use a closed file", r["closed"][1])

    @defer.inlineCallbacks
    def test_free_space_follows_cc_tweaked_accounting(self):
        c, r = yield self.run_ok(
            """
            R.start = { fs.getFreeSpace('/'), fs.getCapacity('/'), fs.getFreeSpace('/rom'),
              fs.getCapacity('rom') }
            local h = fs.open('/big.txt', 'w')
            h.write(string.rep('x', 10000))
            R.writing = fs.getFreeSpace('/')   -- counted as it is written, before close
            h.close()
            R.big = fs.getFreeSpace('/')
            h = fs.open('/small.txt', 'w') h.write('hi') h.close()
            R.small = fs.getFreeSpace('/')      -- every file counts at least 500 bytes
            fs.makeDir('/a/b')
            R.dirs = fs.getFreeSpace('/')       -- and every folder 500
            fs.delete('/big.txt')
            fs.delete('/a')
            R.deleted = fs.getFreeSpace('/')
            h = fs.open('/small.txt', 'w') h.close()
            R.truncated = fs.getFreeSpace('/')
            """,
            multishell=False,
        )
        self.assertEqual(r["start"], [1_000_000, 1_000_000, 0])  # rom: no space, no capacity
        self.assertEqual(r["writing"], 1_000_000 - 10_000)
        self.assertEqual(r["big"], 1_000_000 - 10_000)
        self.assertEqual(r["small"], 1_000_000 - 10_000 - 500)
        self.assertEqual(r["dirs"], 1_000_000 - 10_000 - 1500)
        self.assertEqual(r["deleted"], 1_000_000 - 500)
        self.assertEqual(r["truncated"], 1_000_000 - 500)
        self.assertEqual(c.free_space, 1_000_000 - 500)

    @defer.inlineCallbacks
    def test_out_of_space_is_raised_by_the_write(self):
        c, r = yield self.run_ok(
            """
            local h = fs.open('/a.bin', 'wb')
            h.write(string.rep('a', 1500))
            R.free = fs.getFreeSpace('/')
            R.over = { pcall(h.write, string.rep('b', 1000)) }
            R.fits = { pcall(h.write, string.rep('c', 500)) }
            h.close()
            R.size = fs.getSize('/a.bin')
            R.newFile = { fs.open('/b.bin', 'w') }
            R.dir = { pcall(fs.makeDir, '/d') }
            """,
            capacity=2000,
            multishell=False,
        )
        self.assertEqual(r["free"], 500)
        self.assertFalse(r["over"][0])
        self.assertTrue(r["over"][1].endswith("Out of space"), r["over"][1])
        self.assertEqual(r["fits"], [True])
        self.assertEqual(r["size"], 2000)  # the write that did not fit wrote nothing
        self.assertEqual(c.read_file("/a.bin"), b"a" * 1500 + b"c" * 500)
        self.assertEqual(r["newFile"], [None, "/b.bin: Out of space"])
        self.assertFalse(r["dir"][0])
        self.assertIn("/d: Out of space", r["dir"][1])
        self.assertEqual(c.free_space, 0)

    @defer.inlineCallbacks
    def test_capacity_is_per_computer(self):
        _, r = yield self.run_ok(
            "R.s = { fs.getFreeSpace('/'), fs.getCapacity('/') }", capacity=4 * 1024 * 1024
        )
        self.assertEqual(r["s"], [4 * 1024 * 1024, 4 * 1024 * 1024])

    @defer.inlineCallbacks
    def test_rom_is_read_only(self):
        c, r = yield self.run_ok(
            """
            R.open = { fs.open('/rom/x', 'w') }
            R.append = { fs.open('rom/programs/set.lua', 'a') }
            R.delete = { pcall(fs.delete, '/rom/programs') }
            R.makeDir = { pcall(fs.makeDir, '/rom/d') }
            R.move = { pcall(fs.move, '/rom/programs/set.lua', '/set.lua') }
            R.moveIn = { pcall(fs.move, '/x', '/rom/x') }
            R.copyIn = { pcall(fs.copy, '/rom/programs/set.lua', '/rom/y') }
            R.copyOut = { pcall(fs.copy, '/rom/programs/set.lua', '/set.lua') }
            R.readOnly = { fs.isReadOnly('/rom'), fs.isReadOnly('rom/programs/set.lua'),
              fs.isReadOnly('/'), fs.isReadOnly('/nope') }
            R.drive = { fs.getDrive('/rom/programs'), fs.getDrive('/'), fs.getDrive('/missing') }
            R.attributes = fs.attributes('/rom/programs/set.lua').isReadOnly
            R.readable = fs.open('/rom/programs/set.lua', 'r') ~= nil
            """
        )
        self.assertEqual(r["open"], [None, "/rom/x: Access denied"])
        self.assertEqual(r["append"], [None, "/rom/programs/set.lua: Access denied"])
        self.assertFalse(r["delete"][0])
        self.assertTrue(r["delete"][1].endswith("/rom/programs: Access denied"), r["delete"])
        self.assertTrue(r["makeDir"][1].endswith("/rom/d: Access denied"), r["makeDir"])
        # FileSystem.move checks read-only first and names no path.
        self.assertEqual(r["move"], [False, "Access denied"])
        self.assertTrue(r["moveIn"][1].endswith("Access denied"), r["moveIn"])
        self.assertTrue(r["copyIn"][1].endswith("/rom/y: Access denied"), r["copyIn"])
        self.assertEqual(r["copyOut"], [True])
        self.assertEqual(r["readOnly"], [True, True, False, False])
        self.assertEqual(r["drive"], ["rom", "hdd"])  # a missing path has no drive (nil)
        self.assertIs(r["attributes"], True)
        self.assertTrue(r["readable"])
        self.assertEqual(c.read_file("/set.lua"), c.read_file("/rom/programs/set.lua"))

    @defer.inlineCallbacks
    def test_missing_paths_and_wrong_kinds(self):
        c, r = yield self.run_ok(
            """
            fs.makeDir('/d')
            local h = fs.open('/f', 'w') h.write('x') h.close()
            R.open = { fs.open('/nope.txt', 'r') }
            R.openDir = { fs.open('/d', 'r') }
            R.writeDir = { fs.open('/d', 'w') }
            R.updateMissing = { fs.open('/nope', 'r+') }
            R.mode = { pcall(fs.open, '/f', 'x') }
            R.list = { pcall(fs.list, '/nothere') }
            R.listFile = { pcall(fs.list, '/f') }
            R.size = { pcall(fs.getSize, '/nope') }
            R.attributes = { pcall(fs.attributes, '/nope') }
            R.moveMissing = { pcall(fs.move, '/nope', '/y') }
            R.moveOnto = { pcall(fs.move, '/f', '/d') }
            R.copyOnto = { pcall(fs.copy, '/f', '/d') }
            R.copyMissing = { pcall(fs.copy, '/nope', '/z') }
            R.makeDirOnFile = { pcall(fs.makeDir, '/f') }
            R.deleteRoot = { pcall(fs.delete, '/') }
            R.deleteMissing = { pcall(fs.delete, '/nope') }
            R.inside = { pcall(fs.move, '/d', '/d/e') }
            R.arg = { pcall(fs.exists, nil) }
            """
        )
        self.assertEqual(r["open"], [None, "/nope.txt: No such file"])
        self.assertEqual(r["openDir"], [None, "/d: Not a file"])
        self.assertEqual(r["writeDir"], [None, "/d: Cannot write to directory"])
        self.assertEqual(r["updateMissing"], [None, "/nope: No such file"])
        self.assertFalse(r["mode"][0])
        self.assertIn("Unsupported mode", r["mode"][1])

        def fails_with(key, message):
            self.assertFalse(r[key][0], key)
            self.assertTrue(r[key][1].endswith(message), (key, r[key][1]))

        fails_with("list", "/nothere: No such file")  # CC:Tweaked 1.108.4+ (was Not a directory)
        fails_with("listFile", "/f: Not a directory")
        fails_with("size", "/nope: No such file")
        fails_with("attributes", "/nope: No such file")
        self.assertEqual(r["moveMissing"], [False, "No such file"])  # FileSystem.move: no path
        self.assertEqual(r["moveOnto"], [False, "File exists"])
        fails_with("copyOnto", "/d: File exists")
        fails_with("copyMissing", "/nope: No such file")
        fails_with("makeDirOnFile", "/f: File exists")
        fails_with("deleteRoot", "/: Access denied")
        self.assertEqual(r["inside"], [False, "Can't move a directory inside itself"])
        fails_with("arg", "bad argument #1 (string expected, got nil)")
        self.assertEqual(r["deleteMissing"], [True])

    @defer.inlineCallbacks
    def test_errors_name_the_callers_line(self):
        _, _, (ok, err) = yield self.run_chunk("local x = 1\nfs.getSize('/nope')")
        self.assertFalse(ok)
        self.assertEqual(err, "harness:3: /nope: No such file")

    @defer.inlineCallbacks
    def test_attributes_list_and_sizes(self):
        c, r = yield self.run_ok(
            """
            fs.makeDir('/dir/sub')
            local h = fs.open('/dir/b.txt', 'w') h.write('12345') h.close()
            h = fs.open('/dir/a.txt', 'w') h.close()
            R.list = fs.list('/dir')
            local a = fs.attributes('/dir/b.txt')
            R.file = { a.size, a.isDir, a.isReadOnly, type(a.created),
              a.modified == a.modification }
            local d = fs.attributes('/dir')
            R.dir = { d.size, d.isDir }
            R.root = fs.list('/')
            R.sizes = { fs.getSize('/dir/b.txt'), fs.getSize('/dir') }
            R.kinds = { fs.isDir('/dir'), fs.isDir('/dir/b.txt'), fs.exists('/dir/sub'),
              fs.exists('/nope'), fs.exists('/') }
            """
        )
        self.assertEqual(r["list"], ["a.txt", "b.txt", "sub"])
        self.assertEqual(r["file"], [5, False, False, "number", True])
        self.assertEqual(r["dir"], [0, True])
        self.assertEqual(r["root"], ["dir", "rom"])  # the rom mount is listed at the root
        self.assertEqual(r["sizes"], [5, 0])
        self.assertEqual(r["kinds"], [True, False, True, False, True])

    @defer.inlineCallbacks
    def test_text_handles(self):
        c, r = yield self.run_ok(
            """
            local h = fs.open('/t.txt', 'w')
            h.write('one\\r\\ntwo\\n')
            h.writeLine('three')
            h.write(42)
            h.write(true)
            h.flush()
            R.seekable = h.seek ~= nil
            h.close()
            h = fs.open('/t.txt', 'a')
            R.appendSeek = h.seek == nil
            h.write('\\nlast\\r')
            h.close()
            h = fs.open('/t.txt', 'r')
            R.lines = { h.readLine(), h.readLine(true), h.readLine(), h.readLine() }
            R.rest = { h.readLine(), h.readLine() == nil }
            h.close()
            h = fs.open('/t.txt', 'r+')
            h.seek('set', 5)
            h.write('TWO')
            h.seek('set', 0)
            R.updated = h.readLine(true)
            R.updated2 = h.readLine()
            h.close()
            h = fs.open('/empty.txt', 'w') h.close()
            h = fs.open('/empty.txt', 'r')
            R.empty = { h.readLine(), h.readAll(), h.read(), h.read(0) }
            h.close()
            """
        )
        self.assertEqual(c.read_file("/t.txt"), b"one\r\nTWO\nthree\n42true\nlast\r")
        self.assertTrue(r["seekable"])
        self.assertTrue(r["appendSeek"])
        self.assertEqual(r["lines"], ["one", "two\n", "three", "42true"])
        self.assertEqual(r["rest"], ["last\r", True])
        self.assertEqual(r["updated"], "one\r\n")
        self.assertEqual(r["updated2"], "TWO")
        self.assertEqual(r["empty"], [None, ""])  # then nil, nil

    @defer.inlineCallbacks
    def test_writing_creates_parents_and_move_into_place(self):
        c, r = yield self.run_ok(
            """
            local h = fs.open('/deep/er/tmp.part', 'wb') h.write('new') h.close()
            h = fs.open('/target.txt', 'w') h.write('old') h.close()
            R.onto = { pcall(fs.move, '/deep/er/tmp.part', '/target.txt') }
            fs.delete('/target.txt')
            fs.move('/deep/er/tmp.part', '/target.txt')
            R.moved = { fs.exists('/deep/er/tmp.part'), fs.exists('/target.txt') }
            fs.move('/target.txt', '/made/for/it.txt')
            R.parents = fs.isDir('/made/for')
            """
        )
        self.assertFalse(r["onto"][0])
        self.assertTrue(r["onto"][1].endswith("File exists"))
        self.assertEqual(r["moved"], [False, True])
        self.assertTrue(r["parents"])
        self.assertEqual(c.read_file("/made/for/it.txt"), b"new")

    @defer.inlineCallbacks
    def test_paths_stay_inside_the_computer(self):
        c = self.computer()
        outside = c.root.parent / "outside.txt"
        c, r = yield self.run_ok(
            """
            R.up = { fs.open('../outside.txt', 'w') }
            R.deep = { fs.open('/a/../../outside.txt', 'w') }
            R.exists = fs.exists('../outside.txt')
            R.combine = { fs.combine('a/b', '../c'), fs.combine('/x/', '', 'y\\\\z'),
              fs.combine('..', 'q') }
            R.names = { fs.getName('a/b.lua'), fs.getName('/'), fs.getDir('a/b/c'),
              fs.getDir('/'), fs.getDir('a') }
            R.clean = fs.combine(' a ', 'b:c', '...', 'd')
            """,
            c=c,
        )
        self.assertEqual(r["up"], [None, "/../outside.txt: Invalid Path"])
        self.assertEqual(r["deep"], [None, "/../outside.txt: Invalid Path"])
        self.assertIs(r["exists"], False)
        self.assertFalse(outside.exists())
        self.assertEqual(r["combine"], ["a/c", "x/y/z", "../q"])
        self.assertEqual(r["names"], ["b.lua", "root", "a/b", "..", ""])
        self.assertEqual(r["clean"], "a/bc/d")

    @defer.inlineCallbacks
    def test_lua_cannot_reach_into_python(self):
        _, r = yield self.run_ok(
            """
            local host
            for i = 1, 20 do
              local name, value = debug.getupvalue(fs.exists, i)
              if name == 'host' then host = value end
            end
            R.found = host ~= nil
            local ok, err = pcall(function() return host.fsExists.__globals__ end)
            R.attr = { ok, tostring(err) }
            R.python = python == nil
            R.dump = string.dump == nil
            R.bytecode = { load('\\27Lua') }
            """
        )
        self.assertTrue(r["found"])  # debug is CraftOS's whole library...
        self.assertFalse(r["attr"][0])  # ...but the Python behind it is out of reach
        self.assertIn("may not reach into Python objects", r["attr"][1])
        self.assertTrue(r["python"] and r["dump"])
        self.assertIsNone(r["bytecode"][0])  # load takes text only, as Cobalt does
        self.assertIn("binary chunk", r["bytecode"][1])

    @defer.inlineCallbacks
    def test_python_writes_are_counted(self):
        c = self.computer()
        c.write_file("/payload.bin", b"z" * 3000)
        self.assertEqual(c.free_space, 1_000_000 - 3000)
        _, r = yield self.run_ok("R.free = fs.getFreeSpace('/')", c=c)
        self.assertEqual(r["free"], 1_000_000 - 3000)


class YieldLimitTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_inner_coroutine_errors_and_the_outer_one_continues(self):
        _, r = yield self.run_ok(
            """
            local outer = coroutine.create(function()
              local inner = coroutine.create(function() while true do end end)
              local ok, err = coroutine.resume(inner)
              R.inner = { ok, err, coroutine.status(inner) }
              return 'outer finished'
            end)
            R.outer = { coroutine.resume(outer) }
            """,
            yield_limit=0.5,
        )
        self.assertEqual(r["inner"], [False, "harness:4: " + ABORT, "dead"])
        self.assertEqual(r["outer"], [True, "outer finished"])

    @defer.inlineCallbacks
    def test_wrapped_coroutines_are_covered(self):
        _, r = yield self.run_ok(
            """
            local spin = coroutine.wrap(function() local n = 0 while true do n = n + 1 end end)
            R.e = { pcall(spin) }
            """,
            yield_limit=0.5,
        )
        self.assertFalse(r["e"][0])
        self.assertTrue(r["e"][1].endswith(ABORT), r["e"])

    @defer.inlineCallbacks
    def test_top_level_loop_ends_its_process_and_the_computer_runs_on(self):
        c = self.computer(yield_limit=0.5)
        waiter = c.run_lua("local _, v = os.pullEvent('go') print('waiter got ' .. v)")
        spinner = c.run_lua("while true do end", name="spinner")
        yield c.wait_for(lambda: spinner.finished, 5, "the spinner to be stopped")
        self.assertEqual((spinner.ok, spinner.error), (False, "spinner:1: " + ABORT))
        self.assertTrue(c.alive)
        c.queue_event("go", "on")
        ok, err = yield waiter.done
        self.assertTrue(ok, err)
        self.assertIn("waiter got on", c.output)

    @defer.inlineCallbacks
    def test_a_program_run_by_the_shell_is_stopped_and_reported(self):
        c = self.computer(yield_limit=0.5)
        c.write_file("/spin.lua", "local x = 0\nwhile true do x = x + 1 end")
        proc = c.run("spin")
        ok, err = yield c.wait_for(lambda: proc.finished, 5).addCallback(lambda _: proc.done)
        self.assertEqual((ok, err), (True, None))  # the shell printed the error and ended
        self.assertIn("/spin.lua:2: " + ABORT, c.errors)

    @defer.inlineCallbacks
    def test_yielding_resets_the_clock(self):
        _, r = yield self.run_ok(
            """
            local start = os.clock()
            local rounds = 0
            while os.clock() - start < 1.2 do
              local t = os.clock()
              while os.clock() - t < 0.1 do end
              os.queueEvent('tick')
              os.pullEvent('tick')
              rounds = rounds + 1
            end
            R.rounds = rounds
            """,
            yield_limit=0.5,
        )
        self.assertGreaterEqual(r["rounds"], 8)

    @defer.inlineCallbacks
    def test_code_that_catches_the_error_and_keeps_running_shuts_the_computer_down(self):
        c = self.computer(yield_limit=0.3)
        proc = c.run_lua(
            "while true do pcall(function() while true do end end) end", name="stubborn"
        )
        yield c.wait_for(lambda: proc.finished, 5, "the hard abort")
        self.assertEqual((proc.ok, proc.error), (False, "stubborn:1: " + ABORT))
        yield c.wait_for(lambda: not c.alive, 2, "the computer to shut down").addErrback(
            lambda f: None
        )
        self.assertFalse(c.alive)

    @defer.inlineCallbacks
    def test_a_programs_own_hooks_run_and_the_limit_still_applies(self):
        _, r = yield self.run_ok(
            """
            local co = coroutine.create(function()
              local n = 0
              debug.sethook(function() n = n + 1 R.hooked = n end, '', 100)
              R.gethook = select(3, debug.gethook())
              while true do end
            end)
            R.result = { coroutine.resume(co) }
            """,
            yield_limit=0.5,
        )
        self.assertFalse(r["result"][0])
        self.assertTrue(r["result"][1].endswith(ABORT))
        self.assertGreater(r["hooked"], 10)
        self.assertEqual(r["gethook"], 100)


class EventTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_pull_event_raises_terminated_and_pull_event_raw_does_not(self):
        c = self.computer()
        raw = c.run_lua("_G.R = {} R.raw = { os.pullEventRaw() }", name="raw")
        c.terminate()
        yield raw.done
        self.assertEqual(self.results(c)["raw"], ["terminate"])
        cooked = c.run_lua("os.pullEvent('never')", name="cooked")
        c.terminate()
        ok, err = yield cooked.done
        self.assertEqual((ok, err), (False, "Terminated"))
        self.assertIn("Terminated", c.errors)  # multishell prints a tab's error

    @defer.inlineCallbacks
    def test_terminate_goes_to_the_focused_tab_only(self):
        c = self.computer()
        first = c.run_lua("os.pullEvent('x')", name="first")
        second = c.run_lua("os.pullEvent('x')", name="second")
        c.terminate()
        yield first.done
        self.assertFalse(second.finished)
        c.focus(second)
        c.terminate()
        ok, err = yield second.done
        self.assertEqual(err, "Terminated")

    @defer.inlineCallbacks
    def test_without_multishell_every_process_gets_terminate(self):
        c = self.computer(multishell=False)
        procs = [c.run_lua("os.pullEvent('x')") for _ in range(2)]
        c.terminate()
        results = yield defer.gatherResults([p.done for p in procs])
        self.assertEqual(results, [(False, "Terminated")] * 2)

    @defer.inlineCallbacks
    def test_sleep(self):
        _, r = yield self.run_ok(
            "local t = os.clock() sleep(0.05) os.sleep(0.05) R.slept = os.clock() - t "
            "R.bad = { pcall(function() sleep('x') end) }"
        )
        self.assertGreaterEqual(r["slept"], 0.09)
        self.assertFalse(r["bad"][0])
        self.assertIn(
            "bad argument #1 to 'sleep' (number or nil expected, got string)", r["bad"][1]
        )

    @defer.inlineCallbacks
    def test_computer_id_and_label(self):
        _, r = yield self.run_ok(
            "R.a = { os.getComputerID(), os.getComputerLabel(), os.computerID() } "
            "os.setComputerLabel('new') R.b = os.getComputerLabel()",
            id=9,
            label="lab",
        )
        self.assertEqual(r["a"], [9, "lab", 9])
        self.assertEqual(r["b"], "new")


class MultishellTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_each_tab_draws_into_its_own_window(self):
        c = self.computer(size=(20, 5))
        first = c.run_lua("print('first tab') os.pullEvent('stop')", name="first")
        self.assertEqual(c.screen_lines()[0], "first tab".ljust(20))
        second = c.run_lua(
            "print('second tab') _G.R2 = { multishell.getCurrent(), multishell.getCount(), "
            "multishell.getFocus(), term.current().getLine == nil, "
            "term.current() ~= term.native() } "
            "os.pullEvent('stop')",
            name="second",
        )
        # Two tabs: the tab bar takes the first row; the focused (first) tab is shown below.
        self.assertEqual(c.screen_lines()[:2], [" first  second".ljust(20), "first tab".ljust(20)])
        self.assertEqual(second.screen_lines()[0], "second tab".ljust(20))
        self.assertEqual(len(second.screen_lines()), 4)
        self.assertNotIn("second tab", "".join(c.screen_lines()))
        self.assertIn("second tab", c.output)  # the flat log has every tab
        self.assertEqual(c.eval("return textutils.serializeJSON(R2)"), b"[2,2,1,true,true]")
        c.focus(second)
        self.assertEqual(c.screen_lines()[1], "second tab".ljust(20))
        c.queue_event("stop")
        yield defer.gatherResults([first.done, second.done])
        self.assertEqual(c.eval("return multishell.getCount()"), 0)

    @defer.inlineCallbacks
    def test_a_tabs_redirect_is_its_own(self):
        c = self.computer(size=(20, 4))
        c.run_lua(
            "_G.W = window.create(term.current(), 1, 1, 20, 4, false) term.redirect(W) "
            "os.pullEvent('go') print('into W')"
        )
        other = c.run_lua("os.pullEvent('go') print('into other tab')")
        c.queue_event("go")
        yield other.done
        self.assertEqual(c.eval("return (W.getLine(1))").decode().strip(), "into W")
        self.assertNotIn("into other tab", c.eval("return (W.getLine(2))").decode())

    @defer.inlineCallbacks
    def test_shell_open_tab_and_launch(self):
        c = self.computer()
        c.write_file("/bgprog.lua", "print('bg ran', ...) os.pullEvent('stop')")
        _, r = yield self.run_ok(
            """
            R.tab = shell.openTab('bgprog', 'x')
            R.count = multishell.getCount()
            R.title = multishell.getTitle(R.tab)
            R.missing = shell.openTab('nosuchprogram')
            R.launched = multishell.launch({}, '/bgprog.lua', 'y')
            R.focus = multishell.getFocus()
            R.setFocus = { multishell.setFocus(R.tab), multishell.setFocus(99) }
            """,
            c=c,
        )
        self.assertEqual(r["tab"], 2)
        self.assertEqual(r["count"], 2)
        self.assertEqual(r["title"], "bgprog")
        self.assertIsNone(r.get("missing"))
        self.assertEqual(r["launched"], 3)
        self.assertEqual(r["focus"], 1)
        self.assertEqual(r["setFocus"], [True, False])
        self.assertIn("bg ran\tx", c.output)
        self.assertIn("bg ran\ty", c.output)
        self.assertIn("No such program", c.errors)


class ShellTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_resolve_program_path_and_dir(self):
        c = self.computer()
        c.write_file("/programs/hi.lua", "print('hi')")
        c.write_file("/tool", "print('tool')")
        _, r = yield self.run_ok(
            """
            R.rom = shell.resolveProgram('set')
            R.withSlash = shell.resolveProgram('/programs/hi')
            R.inDir = shell.resolveProgram('tool')
            R.missing = shell.resolveProgram('nope') == nil
            shell.setAlias('greet', '/programs/hi.lua')
            R.alias = shell.resolveProgram('greet')
            R.path = shell.path()
            R.dir = shell.dir()
            R.setDir = { pcall(shell.setDir, '/nope') }
            shell.setDir('/programs')
            R.relative = { shell.resolve('x.lua'), shell.resolve('/x.lua'),
              shell.resolveProgram('hi') }
            """,
            c=c,
        )
        self.assertEqual(r["rom"], "rom/programs/set.lua")
        self.assertEqual(r["withSlash"], "programs/hi.lua")
        self.assertEqual(r["inDir"], "tool")
        self.assertTrue(r["missing"])
        self.assertEqual(r["alias"], "programs/hi.lua")
        self.assertTrue(r["path"].startswith(".:/rom/programs:/rom/programs/http"))
        self.assertEqual(r["dir"], "")
        self.assertFalse(r["setDir"][0])
        self.assertIn("Not a directory", r["setDir"][1])
        self.assertEqual(r["relative"], ["programs/x.lua", "x.lua", "programs/hi.lua"])

    @defer.inlineCallbacks
    def test_run_execute_and_os_run(self):
        c = self.computer()
        c.write_file(
            "/args.lua",
            "print('args', table.concat({ ... }, '|'), arg[0]) "
            "R.running = shell.getRunningProgram()",
        )
        c.write_file("/boom.lua", "error('boom')")
        c.write_file("/ok.lua", "print('ok', ...)")
        c.write_file("/syntax.lua", "this is not lua")
        _, r = yield self.run_ok(
            """
            R.run = shell.run('args', '"a b"', 'c')
            R.execute = shell.execute('args', 'x')
            R.boom = shell.run('boom')
            R.syntax = shell.run('syntax')
            R.missing = shell.run('nope')
            R.empty = shell.run('')
            R.badArg = { pcall(shell.execute, 'args', 1) }
            R.osRun = { os.run({}, '/boom.lua'), os.run({}, '/ok.lua', 'z'),
              os.run({}, '/nope.lua') }
            """,
            c=c,
        )
        self.assertEqual(r["run"], True)
        self.assertIn("args\ta b|c\targs\n", c.output)
        self.assertIn("args\tx\targs\n", c.output)
        self.assertEqual(r["running"], "args.lua")
        self.assertEqual([r["boom"], r["syntax"], r["missing"], r["empty"]], [False] * 4)
        self.assertIn("/boom.lua:1: boom\n", c.errors)
        self.assertIn("No such program\n", c.errors)
        self.assertIn("/syntax.lua:1:", c.errors)
        self.assertFalse(r["badArg"][0])
        self.assertIn("bad argument #2", r["badArg"][1])
        self.assertEqual(r["osRun"], [False, True, False])
        self.assertIn("ok\tz\n", c.output)
        self.assertIn("File not found", c.errors)

    @defer.inlineCallbacks
    def test_startup_aliases_reach_later_processes(self):
        c = self.computer()
        c.write_file("/programs/hi.lua", "print('hi from alias')")
        c.write_file("/startup.lua", "shell.setAlias('hey', '/programs/hi.lua')")
        yield c.boot().done
        proc = c.run("hey")
        yield proc.done
        self.assertIn("hi from alias", c.output)


class TextutilsTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_serialize_formats_as_craftos_does(self):
        _, r = yield self.run_ok(
            r"""
            local s = textutils.serialize
            R.scalars = { s(42), s(1.5), s('hi'), s(true), s(nil), s(0/0), s(1/0), s(-1/0) }
            R.quoted = s('a"b\\c\nd\re\0f\1')
            R.table = s({ 1, 2, 'x', a = 1, ['b c'] = true, [10] = 5, ['end'] = 0, n = {} })
            R.nested = s({ k = { 1 } })
            R.compact = s({ 1, { a = 2 }, x = 'y' }, { compact = true })
            R.empty = s({})
            local t = {} t.self = t
            R.recursive = { pcall(s, t) }
            local shared = {}
            R.repeated = { pcall(s, { shared, shared }) }
            R.allowed = s({ shared, shared }, { allow_repetitions = true })
            R.fn = { pcall(s, print) }
            local back = textutils.unserialize(s({ 1, 'two', x = { y = false } }))
            R.back = { back[1], back[2], back.x.y }
            R.bad = textutils.unserialize('{') == nil
            """
        )
        self.assertEqual(r["scalars"], ["42", "1.5", '"hi"', "true", "nil", "0/0", "1/0", "-1/0"])
        self.assertEqual(r["quoted"], '"a\\"b\\\\c\\\nd\\re\\000f\u0001"')
        self.assertEqual(
            r["table"],
            '{\n  1,\n  2,\n  "x",\n  [ 10 ] = 5,\n  a = 1,\n  [ "b c" ] = true,\n'
            '  [ "end" ] = 0,\n  n = {},\n}',
        )
        self.assertEqual(r["nested"], "{\n  k = {\n    1,\n  },\n}")
        self.assertEqual(r["compact"], '{1,{a=2,},x="y",}')
        self.assertEqual(r["empty"], "{}")
        self.assertEqual(r["recursive"], [False, "Cannot serialize table with recursive entries"])
        self.assertEqual(r["repeated"], [False, "Cannot serialize table with repeated entries"])
        self.assertEqual(r["allowed"], "{\n  {},\n  {},\n}")
        self.assertEqual(r["fn"], [False, "Cannot serialize type function"])
        self.assertEqual(r["back"], [1, "two", False])
        self.assertTrue(r["bad"])

    @defer.inlineCallbacks
    def test_url_encode(self):
        _, r = yield self.run_ok(r"R.u = textutils.urlEncode('a b&c~\n\233')")
        self.assertEqual(r["u"], "a+b%26c%7E%0D%0A%C3%A9")


class CapturePatternTests(CraftOSTestCase):
    @defer.inlineCallbacks
    def test_a_program_in_a_coroutine_with_a_capturing_redirect(self):
        """SPEC §9 exec's shape: a program runs in a coroutine beside the daemon, its output
        captured through term.redirect and still drawn. As on CraftOS, print reaches a
        redirect as words and spaces: a new line is a cursor move (or a scroll), never a
        written "\\n"."""
        c, r = yield self.run_ok(
            """
            local calls = {}
            local parent = term.current()
            local capture = {}
            for k, fn in pairs(parent) do
              capture[k] = function(...)
                if k == 'write' or k == 'setCursorPos' or k == 'scroll' then
                  calls[#calls + 1] = k .. ':' .. table.concat({ ... }, ',')
                end
                return fn(...)
              end
            end
            local program = coroutine.create(function(...)
              print('hello from', ...)
              local _, v = os.pullEvent('go')
              write('got ' .. v)
              error('exec failed')
            end)
            local function step(...)
              local previous = term.redirect(capture)
              local ok, result = coroutine.resume(program, ...)
              term.redirect(previous)
              return ok, result
            end
            local ok, result = step('exec')
            print('daemon still here')
            os.queueEvent('go', 'value')
            while coroutine.status(program) ~= 'dead' do
              local event = table.pack(os.pullEventRaw(result))
              ok, result = step(table.unpack(event, 1, event.n))
            end
            R.calls = calls
            R.ended = { ok, result }
            """,
            size=(20, 5),
        )
        self.assertEqual(
            r["calls"],
            [
                "write:hello",
                "write: ",
                "write:from",
                "write:\t",
                "write:exec",
                "setCursorPos:1,2",
                "write:got",
                "write: ",
                "write:value",
            ],
        )
        self.assertEqual(r["ended"], [False, "harness:18: exec failed"])
        self.assertEqual(
            c.screen_lines()[:3],
            ["hello from\texec".ljust(20), "daemon still here".ljust(20), "got value".ljust(20)],
        )
