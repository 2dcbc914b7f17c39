"""
The one path rule (``trapsandbox.computers.paths``, issue 43): a path as CraftOS reads it,
checked against CC:Tweaked's own ``sanitizePath`` (its twin in the CraftOS harness) and the
settings rule's fold (``settingsfile``, itself checked against the Lua client's), and the
surfaces that used to compare raw strings.
"""

import re

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import asking
from tests.harness.craftos import sanitize_path
from tests.harness.fakes import SandboxComputer
from trapsandbox import errors
from trapsandbox.computers import paths, settingsfile
from trapsandbox.computers.paths import canonical, checked, inside
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError

PIECES = ["/", "\\", ".", "..", "...", " ", "a", "b", "proj", "inner", "rom", "é", ".settings"]
DROPPED = re.compile(r'[\x00-\x1f\x7f"*:<>?|]')


def raises(code, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except GatewayError as error:
        return error.code == code
    return False


class CanonicalTests(SynchronousTestCase):
    def test_every_spelling_of_one_path_is_one_path(self):
        for spelling in [
            "/proj/inner",
            "proj/inner",
            "//proj//inner/",
            "/proj/./inner/.",
            "\\proj\\inner",
            "/other/../proj/inner",
            "/ proj / inner ",
            "/proj/.../inner",
            "/a/b/../../proj/x/../inner",
        ]:
            self.assertEqual(canonical(spelling), "/proj/inner", spelling)
        self.assertEqual(canonical(""), "/")
        self.assertEqual(canonical("/"), "/")
        self.assertEqual(canonical("a/.."), "/")

    def test_relative_to_a_cwd(self):
        self.assertEqual(canonical("notes.txt", "/home"), "/home/notes.txt")
        self.assertEqual(canonical("../x", "home/sub"), "/home/x")
        self.assertEqual(canonical("/x", "home"), "/x")  # absolute: the cwd is not used

    def test_what_craftos_would_change_silently_is_refused(self):
        for bad in ["/..", "../x", "/a/../../x", "/a*b", "/a:b", '/"', "/a?", "/a|b", "/a\x00"]:
            self.assertTrue(raises(errors.BAD_REQUEST, canonical, bad), bad)
        self.assertTrue(raises(errors.BAD_REQUEST, canonical, "/" + "x" * 255))
        self.assertTrue(raises(errors.BAD_REQUEST, canonical, "x" * 2000))
        self.assertTrue(raises(errors.BAD_REQUEST, canonical, None))
        self.assertTrue(raises(errors.BAD_REQUEST, canonical, 7))
        self.assertTrue(raises(errors.BAD_REQUEST, canonical, "x", "/../a"))

    @given(st.lists(st.sampled_from(PIECES + ["*", ":", "\t"]), max_size=14).map("".join))
    def test_it_is_what_cc_tweaked_reads_or_a_refusal(self, path):
        try:
            got = canonical(path)
        except GatewayError as error:
            self.assertEqual(error.code, errors.BAD_REQUEST)
            sanitized = sanitize_path(path.encode())
            self.assertTrue(
                DROPPED.search(path) or sanitized == b".." or sanitized.startswith(b"../"),
                (path, sanitized),
            )
            return
        self.assertEqual(got, "/" + sanitize_path(path.encode()).decode(), path)
        self.assertEqual(canonical(got), got)  # a fixed point: a key
        # The settings rule reads the canonical path as it reads the raw one.
        self.assertEqual(
            settingsfile.is_settings_path(got), settingsfile.is_settings_path(path), path
        )

    def test_inside_is_the_same_path_or_under_it_however_a_host_reads_names(self):
        self.assertTrue(inside("/proj", "/proj"))
        self.assertTrue(inside("/proj/inner", "/proj"))
        self.assertTrue(inside("/anything", "/"))
        self.assertFalse(inside("/project", "/proj"))
        self.assertFalse(inside("/proj", "/proj/inner"))
        self.assertTrue(inside("/PROJ/inner", "/proj"))  # a host ignoring case
        self.assertTrue(inside("/pr\u00e9oj/x", "/proj"))  # CraftOS-PC drops non-ASCII
        self.assertFalse(inside("/other", "/proj"))
        self.assertTrue(inside("/..\u00e9", "/proj"))  # unreadable so: taken to overlap

    def test_checked_refuses_the_settings_file_and_changes_of_rom_and_the_root(self):
        for spelling in ["/.settings", "x/../.SETTINGS", "/.settings/inner", "\\.settings."]:
            self.assertTrue(raises(errors.FORBIDDEN, checked, spelling), spelling)
        self.assertEqual(checked("/rom/programs/ls.lua"), "/rom/programs/ls.lua")
        self.assertTrue(raises(errors.FS_ERROR, checked, "/x/../rom/a", write=True))
        self.assertTrue(raises(errors.FS_ERROR, checked, "ROM", write=True))
        self.assertTrue(raises(errors.BAD_REQUEST, checked, "/a/..", write=True))
        self.assertEqual(checked("/romance", write=True), "/romance")
        self.assertEqual(paths.parent("/a/b"), "/a")
        self.assertEqual(paths.parent("/a"), "/")


class SandboxPathTests(SynchronousTestCase):
    """Every file request goes out with the canonical path, or not at all."""

    def setUp(self):
        self.registry = Registry(Clock(), request_timeout=60)
        self.computer = SandboxComputer.connect(self.registry)
        self.sandbox = Sandbox(self.registry)

    def test_the_computer_is_sent_the_canonical_path(self):
        self.computer.files["/proj/a.txt"] = b"a"
        got = self.successResultOf(self.sandbox.read_file(asking("7:base"), "x/../proj//a.txt"))
        self.assertEqual(got["content"], b"a")
        self.successResultOf(self.sandbox.write_file(asking("7:base"), "\\proj\\.\\b", b"b"))
        self.successResultOf(self.sandbox.delete_file(asking("7:base"), "proj/./b"))
        self.assertEqual(
            [(f["type"], f["payload"]["path"]) for f in self.computer.sent],
            [("read_file", "/proj/a.txt"), ("write_file", "/proj/b"), ("delete_file", "/proj/b")],
        )

    def test_a_bad_path_is_refused_before_anything_is_sent(self):
        caller = asking("7:base")
        for d, code in [
            (self.sandbox.read_file(caller, "/../x"), errors.BAD_REQUEST),
            (self.sandbox.list_files(caller, "/a?"), errors.BAD_REQUEST),
            (self.sandbox.write_file(caller, "/rom/x", b""), errors.FS_ERROR),
            (self.sandbox.delete_file(caller, "/"), errors.BAD_REQUEST),
            (self.sandbox.delete_file(caller, "/a/../.Settings"), errors.FORBIDDEN),
            (self.sandbox.move_file(caller, "/proj", "/other/../proj/inner"), errors.BAD_REQUEST),
            (self.sandbox.make_folder(caller, "/rom/new"), errors.FS_ERROR),
        ]:
            self.assertEqual(self.failureResultOf(d, GatewayError).value.code, code)
        self.assertEqual(self.computer.sent, [])

    def test_each_file_of_a_batch_goes_through_the_rule_from_any_surface(self):
        # As an operator's raw request would send it: every file's path is made canonical,
        # and one the rule refuses refuses the whole request.
        request = self.registry.request
        for files, code in [
            ([{"path": "/a", "size": 0}, {"path": "/b/../.settings", "size": 0}], errors.FORBIDDEN),
            ([{"path": "/rom/x", "size": 0}], errors.FS_ERROR),
            ([{"path": "/a?", "size": 0}], errors.BAD_REQUEST),
            (["/a"], errors.BAD_REQUEST),
            ([], errors.BAD_REQUEST),
            ("/a", errors.BAD_REQUEST),
            ([{"path": f"/f{n}", "size": 0} for n in range(65)], errors.BAD_REQUEST),
        ]:
            d = request(asking("7:base"), "write_files", {"files": files})
            self.assertEqual(self.failureResultOf(d, GatewayError).value.code, code, files)
        self.assertEqual(self.computer.sent, [])
        made = paths.request_paths(
            "write_files", {"cwd": "/p", "files": [{"path": "x/../a", "size": 1}, {"path": "\\b"}]}
        )
        self.assertEqual([f["path"] for f in made["files"]], ["/p/a", "/b"])
        self.assertNotIn("cwd", made)
