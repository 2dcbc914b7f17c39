"""Changes, diffs and restore plans: pure functions, so hypothesis drives them directly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from tests.unit.snapshots.programs import PATHS, Computer, sha
from trapsandbox.snapshots.changes import Change, changes, restore_plan, text_diff, to_fetch
from trapsandbox.snapshots.model import FileEntry

SETTINGS = ["/.settings", "/.Settings", "/.settings/x"]


def files_of(computer: Computer) -> dict[str, FileEntry]:
    return {p: FileEntry(len(d), computer.times[p], sha(d)) for p, d in computer.files.items()}


edits = st.lists(
    st.tuples(st.sampled_from(PATHS), st.sampled_from([b"", b"a", b"bb", b"a\n"]) | st.none()),
    max_size=12,
)


def run(computer: Computer, steps) -> None:
    for path, data in steps:
        if data is None:
            computer.delete(path)
        else:
            computer.write(path, data)


class RestorePlanTests(SynchronousTestCase):
    @given(edits, edits)
    def test_applying_the_plan_gives_back_exactly_the_snapshot(self, before, after):
        computer = Computer()
        run(computer, before)
        snapshot, wanted = files_of(computer), dict(computer.files)
        run(computer, after)
        plan = restore_plan(snapshot, files_of(computer))
        contents = {sha(d): d for d in wanted.values()}
        for path in plan.delete:
            computer.delete(path)
        for path, digest in plan.write:
            computer.write(path, contents[digest])
        self.assertEqual(computer.files, wanted)
        # Nothing written that was already right.
        unchanged = {p for p, d in wanted.items() if computer.files.get(p) == d}
        self.assertLessEqual({p for p, _ in plan.write}, unchanged)

    def test_a_directory_where_the_snapshot_has_a_file_goes_whole(self):
        snapshot = {"/d": FileEntry(1, 1, sha(b"d"))}
        current = {"/d/a": FileEntry(1, 2, sha(b"a")), "/d/e/f": FileEntry(1, 2, sha(b"f"))}
        plan = restore_plan(snapshot, current)
        self.assertEqual(
            plan.to_json(), {"delete": ["/d"], "write": [{"path": "/d", "sha256": sha(b"d")}]}
        )

    def test_the_settings_file_is_never_written_or_deleted(self):
        entry = FileEntry(2, 1, sha(b"pw"))
        for path in SETTINGS:
            self.assertEqual(restore_plan({path: entry}, {}).write, ())
            self.assertEqual(restore_plan({}, {path: entry}).delete, ())


class ChangesTests(SynchronousTestCase):
    snapshot = {
        "/same": FileEntry(3, 10, sha(b"abc")),
        "/touched": FileEntry(3, 10, sha(b"abc")),
        "/edited": FileEntry(3, 10, sha(b"abc")),
        "/moved": FileEntry(3, 10, sha(b"abc")),
        "/gone": FileEntry(5, 10, sha(b"hello")),
    }
    listing = {
        "/same": (3, 10),
        "/touched": (3, 11),
        "/edited": (4, 11),
        "/moved": (3, 12),
        "/new": (2, 11),
        "/.settings": (9, 11),
    }

    def test_only_new_files_and_those_whose_size_or_time_moved_are_fetched(self):
        self.assertEqual(
            to_fetch(self.snapshot, self.listing), ["/edited", "/moved", "/new", "/touched"]
        )

    def test_added_modified_and_deleted_with_sizes(self):
        hashes = {"/touched": sha(b"abc"), "/edited": sha(b"abcd"), "/new": sha(b"xy")}
        found = changes(self.snapshot, self.listing, hashes)
        self.assertEqual(found.added, (Change("/new", None, 2),))
        # Touched (same content): not a change; moved but not fetched: counted modified.
        self.assertEqual(found.modified, (Change("/edited", 3, 4), Change("/moved", 3, 3)))
        self.assertEqual(found.deleted, (Change("/gone", 5, None),))
        self.assertEqual(len(found), 4)

    @given(edits, edits)
    def test_no_changes_after_nothing_and_every_edit_seen(self, before, after):
        computer = Computer()
        run(computer, before)
        snapshot, old = files_of(computer), dict(computer.files)
        self.assertEqual(len(changes(snapshot, computer.listing(), {})), 0)
        run(computer, after)
        listing = computer.listing()
        hashes = {p: sha(computer.files[p]) for p in to_fetch(snapshot, listing)}
        found = changes(snapshot, listing, hashes)
        differ = {
            p for p in old.keys() | computer.files.keys() if old.get(p) != computer.files.get(p)
        }
        seen = {c.path for c in found.added + found.modified + found.deleted}
        self.assertEqual(seen, differ)


class TextDiffTests(SynchronousTestCase):
    def test_a_unified_diff_of_text(self):
        diff = text_diff("/s.lua", b"a\nb\nc\n", b"a\nB\nc\n")
        self.assertEqual(
            diff.splitlines(),
            ["--- a/s.lua", "+++ b/s.lua", "@@ -1,3 +1,3 @@", " a", "-b", "+B", " c"],
        )

    def test_binary_and_non_utf8_are_one_line(self):
        self.assertEqual(text_diff("/b", b"\xff", b"\xfe\xfd"), "/b: binary, 1 bytes -> 2 bytes")
        self.assertEqual(text_diff("/b", b"a\0", b"a"), "/b: binary, 2 bytes -> 1 bytes")

    def test_the_diff_is_bounded(self):
        many = b"".join(b"%d\n" % n for n in range(1000))
        diff = text_diff("/l", b"", many, max_lines=50)
        self.assertEqual(len(diff.splitlines()), 51)
        self.assertTrue(diff.endswith("... cut at 50 lines"))
        self.assertEqual(
            text_diff("/l", b"", many, max_bytes=100),
            "/l: too large to compare, 0 bytes -> 3890 bytes",
        )
