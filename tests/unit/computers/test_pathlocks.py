"""
Changes of one computer's files that cannot mix (``trapsandbox.computers.pathlocks``, issue
43): overlapping paths one after another in the order they came, others side by side, a
bounded wait on the injected clock; and ``Sandbox.write_file`` holding its path, so two
writes of one file are never interleaved part by part.
"""

import base64

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from tests.harness.callers import asking
from tests.harness.fakes import HeldComputer
from trapsandbox import errors, limits
from trapsandbox.computers.pathlocks import Held, PathLocks, _overlap
from trapsandbox.computers.paths import inside
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError

A = ("local", "7:a")
B = ("local", "8:b")


class PathLockTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.locks = PathLocks(self.clock, wait=10, max_waiters=2)

    def test_overlapping_changes_go_one_after_another_in_order(self):
        first = self.successResultOf(self.locks.acquire(A, ["/proj"]))
        inner = self.locks.acquire(A, ["/proj/a.txt"])
        same = self.locks.acquire(A, ["/PROJ"])
        self.assertNoResult(inner)
        self.assertNoResult(same)
        first.release()
        held = self.successResultOf(inner)
        self.assertNoResult(same)  # /PROJ overlaps /proj/a.txt too (a host may ignore case)
        held.release()
        held.release()  # (twice is once)
        self.successResultOf(same).release()
        self.assertEqual(self.locks.busy(A), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_other_paths_and_other_computers_go_at_once(self):
        first = self.successResultOf(self.locks.acquire(A, ["/proj"]))
        self.successResultOf(self.locks.acquire(A, ["/project"])).release()
        self.successResultOf(self.locks.acquire(B, ["/proj"])).release()
        # A later change of other paths does not wait behind an earlier waiting one.
        waiting = self.locks.acquire(A, ["/proj/x", "/other"])
        self.successResultOf(self.locks.acquire(A, ["/third"])).release()
        self.assertNoResult(waiting)
        first.release()
        self.successResultOf(waiting).release()

    def test_a_wait_is_bounded_on_the_clock(self):
        self.successResultOf(self.locks.acquire(A, ["/f"]))
        waiting = self.locks.acquire(A, ["/f"])
        self.clock.advance(9.9)
        self.assertNoResult(waiting)
        self.clock.advance(0.1)
        error = self.failureResultOf(waiting, GatewayError).value
        self.assertEqual(error.code, errors.OVERLOADED)
        self.assertIn("/f on 7:a was still under way after 10 s", error.message)
        self.assertEqual(self.locks.busy(A), 1)

    def test_too_many_waiting_are_refused_at_once_and_a_cancelled_wait_leaves(self):
        held = self.successResultOf(self.locks.acquire(A, ["/f"]))
        one, two = self.locks.acquire(A, ["/f"]), self.locks.acquire(A, ["/f"])
        error = self.failureResultOf(self.locks.acquire(A, ["/f"]), GatewayError).value
        self.assertEqual(error.code, errors.OVERLOADED)
        one.cancel()
        self.failureResultOf(one, CancelledError)
        held.release()
        self.successResultOf(two).release()
        self.assertEqual(self.locks.busy(A), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class WriteLockTests(SynchronousTestCase):
    def setUp(self):
        self.clock = Clock()
        self.registry = Registry(self.clock, request_timeout=600)
        self.computer = HeldComputer.connect(self.registry)
        self.sandbox = Sandbox(self.registry)

    def test_two_writes_of_one_file_never_interleave_and_the_last_answered_is_on_disk(self):
        size = 3 * limits.FILE_CHUNK_BYTES
        a = self.sandbox.write_file(asking("7:base"), "/f.bin", b"A" * size)
        b = self.sandbox.write_file(asking("7:base"), "f.bin", b"B" * size)  # the same path
        # Only the first write's parts go out until its last is answered: those before its
        # last at once, its last once they are written.
        self.assertEqual(self.held(), [(0, False, b"A"), (limits.FILE_CHUNK_BYTES, False, b"A")])
        self.computer.answer_next()
        self.computer.answer_next()
        self.assertEqual(self.held(), [(2 * limits.FILE_CHUNK_BYTES, True, b"A")])
        self.assertNoResult(b)
        self.computer.answer_next()
        self.assertEqual(self.successResultOf(a)["bytesWritten"], size)
        self.assertEqual(self.computer.files["/f.bin"], b"A" * size)
        self.assertEqual([b for _, _, b in self.held()], [b"B", b"B"])
        for _ in range(3):
            self.computer.answer_next()
        self.assertEqual(self.successResultOf(b)["bytesWritten"], size)
        self.assertEqual(self.computer.files["/f.bin"], b"B" * size)
        # Each write's parts carry one writeId of its own (its temporary file's name).
        ids = [f["payload"]["part"]["writeId"] for f in self.computer.sent]
        self.assertEqual(len(set(ids[:3])), 1)
        self.assertEqual(len(set(ids[3:])), 1)
        self.assertNotEqual(ids[0], ids[3])
        self.assertRegex(ids[0], r"^[0-9a-f]{16}$")

    def held(self):
        return [
            (p["part"]["offset"], p["part"]["final"], base64.b64decode(p["content"])[:1])
            for _, p in self.computer.held
        ]

    def test_writes_of_other_files_go_side_by_side(self):
        self.sandbox.write_file(asking("7:base"), "/a", b"a")
        self.sandbox.write_file(asking("7:base"), "/b", b"b")
        self.assertEqual([p["path"] for _, p in self.computer.held], ["/a", "/b"])

    def test_a_failed_write_lets_the_next_one_go(self):
        a = self.sandbox.write_file(asking("7:base"), "/rom2/../f", b"a")
        b = self.sandbox.write_file(asking("7:base"), "/f", b"b")
        request, _ = self.computer.held.pop(0)
        self.computer.fs_error(request, "/f: Out of space")
        self.failureResultOf(a, GatewayError)
        self.computer.answer_next()
        self.assertEqual(self.successResultOf(b)["bytesWritten"], 1)
        self.assertEqual(self.sandbox.locks.busy(("local", "7:base")), 0)


# Canonical paths from a few names (case and a non-ASCII letter among them, so that two
# spellings may be one path on some CraftOS).
_names = st.sampled_from(["a", "A", "b", "ab", "a.b", "r\u00e9", "re"])
_paths = st.lists(_names, max_size=3).map(lambda parts: "/" + "/".join(parts))


class OverlapTests(SynchronousTestCase):
    @given(st.lists(_paths, max_size=4), st.lists(_paths, max_size=4))
    def test_changes_overlap_exactly_when_a_path_of_one_is_inside_a_path_of_the_other(
        self, one, other
    ):
        locks = PathLocks(Clock())
        first, second = (Held(A, tuple(paths), locks) for paths in (one, other))
        pairwise = any(inside(x, y) or inside(y, x) for x in one for y in other)
        self.assertEqual(_overlap(first, second), pairwise)
        self.assertEqual(_overlap(second, first), pairwise)
