"""``Snapshots`` on a fake computer (``programs.Computer`` behind a fake ``Sandbox``) and
the real SQLite store: what travels, what is refused, what a restore does."""

from __future__ import annotations

import os

from twisted.internet import reactor
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from tests.harness.callers import asking
from tests.unit.snapshots.programs import Computer
from trapsandbox import errors, limits
from trapsandbox.computers.registry import Registry
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots.service import Snapshots, _several
from trapsandbox.snapshots.sqlitestore import SqliteStore


class FakeSandbox:
    """The four calls ``Snapshots`` makes, on a ``Computer``; it records what was read."""

    def __init__(self, computer: Computer) -> None:
        self.computer = computer
        self.registry = Registry(Clock())  # where the activity of each operation is told
        self.reads: list[str] = []
        self.vanish: set[str] = set()  # deleted between the listing and the read
        self.batch = 0  # bytes of files in one write_files (0: one write_file each)
        self.batches: list[list[str]] = []

    def snapshot_list(self, caller, timeout):
        files = [
            {"path": p, "size": s, "modified": m} for p, (s, m) in self.computer.listing().items()
        ]
        for path in self.vanish:
            self.computer.delete(path)
        return succeed({"files": files, "total": sum(f["size"] for f in files)})

    def read_file(self, caller, path, offset=0, length=None):
        self.reads.append(path)
        if path not in self.computer.files:
            return fail(GatewayError(errors.FS_ERROR, f"{path}: No such file"))
        data = self.computer.files[path]
        chunk = data[offset : offset + 100]  # small reads: files span several
        return succeed(
            {"content": chunk, "sizeBytes": len(data), "offset": offset, "bytesRead": len(chunk)}
        )

    def write_file(self, caller, path, content, max_bytes=None):
        self.computer.write(path, content)
        return succeed({"bytesWritten": len(content), "sizeBytes": len(content)})

    def batch_bytes(self, caller):
        return self.batch

    def write_files(self, caller, files):
        self.batches.append([path for path, _ in files])
        for path, content in files:
            self.computer.write(path, content)
        return succeed([path for path, _ in files])

    def delete_file(self, caller, path):
        self.computer.delete(path)
        return succeed({"deleted": True})


class SnapshotsTests(TestCase):
    timeout = 30

    async def setUp(self):
        directory = self.mktemp()
        os.makedirs(directory, mode=0o700)
        self.store = await SqliteStore.open(directory, reactor)
        self.addCleanup(self.store.close)
        self.computer = Computer()
        self.computer.write("/a.txt", b"hello\n")
        self.computer.write("/d/big.bin", bytes(range(256)) * 2)
        self.sandbox = FakeSandbox(self.computer)
        self.snapshots = Snapshots(self.sandbox, self.store, clock=reactor)

    async def test_only_what_changed_travels(self):
        first = await self.snapshots.take(asking("7:", "acc"), "manual")
        self.assertEqual((first["files"], first["fetched"]), (2, 2))
        self.sandbox.reads.clear()
        self.computer.write("/a.txt", b"hello again\n")
        second = await self.snapshots.take(asking("7:", "acc"), "manual")
        self.assertEqual(second["fetched"], 1)
        self.assertEqual(self.sandbox.reads, ["/a.txt"])

    async def test_a_snapshot_with_nothing_to_fetch_asks_the_store_for_no_content(self):
        asked = []
        missing = self.store._missing
        self.patch(self.store, "_missing", lambda *a: asked.append(a[1]) or missing(*a))
        await self.snapshots.take(asking("7:", "acc"), "manual")
        self.assertEqual(len(asked), 1)
        again = await self.snapshots.take(asking("7:", "acc"), "manual")
        self.assertEqual(again["fetched"], 0)
        self.assertEqual(len(asked), 1, "no trip to the store's thread for nothing")
        snapshot = await self.store.get("acc", "7:", again["id"])
        self.assertEqual(sorted(snapshot.files), ["/a.txt", "/d/big.bin"])

    async def test_a_file_gone_before_its_read_is_left_out(self):
        self.sandbox.vanish.add("/a.txt")
        taken = await self.snapshots.take(asking("7:", "acc"), "manual")
        self.assertEqual(taken["files"], 1)
        snapshot = await self.store.get("acc", "7:", taken["id"])
        self.assertEqual(list(snapshot.files), ["/d/big.bin"])

    async def test_over_the_bound_is_refused_before_any_read(self):
        self.store.max_bytes = 100
        error = await self.assertFailure(
            self.snapshots.take(asking("7:", "acc"), "manual"), GatewayError
        )
        self.assertEqual(error.code, errors.TOO_LARGE)
        self.assertEqual(self.sandbox.reads, [])
        self.assertEqual(await self.store.list("acc", "7:"), [])

    async def test_a_list_past_the_accounts_quota_is_refused_before_any_read(self):
        for n in range(30):
            self.computer.write(f"/{'long' * 50}/{n}", b"")
        self.store.quota = 8_000  # 30 paths of 200 characters: 6,000 bytes and their JSON
        error = await self.assertFailure(
            self.snapshots.take(asking("7:", "acc"), "manual"), GatewayError
        )
        self.assertEqual(error.code, errors.TOO_LARGE)
        self.assertIn("SANDBOX_SNAPSHOT_QUOTA_MB", error.message)
        self.assertEqual(self.sandbox.reads, [])
        self.assertEqual(await self.store.list("acc", "7:"), [])

    async def test_restore_and_undo(self):
        taken = await self.snapshots.take(asking("7:", "acc"), "manual")
        before = dict(self.computer.files)
        self.computer.write("/a.txt", b"changed")
        self.computer.write("/new", b"new")
        self.computer.delete("/d/big.bin")
        edited = dict(self.computer.files)
        done = await self.snapshots.restore(asking("7:", "acc"), taken["id"])
        self.assertEqual(self.computer.files, before)
        self.assertEqual(done["deleted"], ["/new"])
        self.assertEqual(done["written"], ["/a.txt", "/d/big.bin"])
        await self.snapshots.restore(asking("7:", "acc"), done["before"])
        self.assertEqual(self.computer.files, edited)

    async def test_a_restore_sends_small_files_several_to_a_request(self):
        for n in range(10):
            self.computer.write(f"/s/{n}", b"x" * 100)
        taken = await self.snapshots.take(asking("7:", "acc"), "manual")
        before = dict(self.computer.files)
        for path in list(self.computer.files):
            self.computer.delete(path)
        # Room for four of the small files, their frame counted.
        self.sandbox.batch = 4 * (100 + 6 * len("/s/0") + 64)
        await self.snapshots.restore(asking("7:", "acc"), taken["id"])
        self.assertEqual(self.computer.files, before)
        batched = [path for batch in self.sandbox.batches for path in batch]
        self.assertEqual(sorted(batched), sorted(before))
        for batch in self.sandbox.batches:
            cost = sum(len(before[path]) + 6 * len(path) + 64 for path in batch)
            self.assertLessEqual(cost, self.sandbox.batch, batch)
        self.assertLessEqual(len(self.sandbox.batches), 5)  # 12 files, (mostly) 4 to a batch

    async def test_a_missing_snapshot_changes_nothing(self):
        self.computer.write("/new", b"new")
        error = await self.assertFailure(
            self.snapshots.restore(asking("7:", "acc"), "9"), GatewayError
        )
        self.assertEqual(error.code, "not_found")
        self.assertIn("/new", self.computer.files)
        self.assertEqual(await self.store.list("acc", "7:"), [])

    async def test_a_call_while_the_store_opens_waits_for_it(self):
        clock = Clock()
        snapshots = Snapshots(self.sandbox, clock=clock)
        listed = snapshots.list(asking("7:", "acc"))
        self.assertNoResult(listed)
        snapshots.attach(self.store)
        self.assertEqual(clock.getDelayedCalls(), [])  # its bound is cancelled
        self.assertEqual(await listed, [])

    async def test_a_store_still_opening_past_the_bound_is_unavailable(self):
        clock = Clock()
        snapshots = Snapshots(self.sandbox, clock=clock)
        listed = snapshots.list(asking("7:", "acc"))
        clock.advance(limits.SNAPSHOT_STORE_OPEN_WAIT)
        error = self.failureResultOf(listed, GatewayError).value
        self.assertEqual(error.code, errors.UNAVAILABLE)
        self.assertIn("still opening", error.message)
        snapshots.attach(self.store)  # the waiter it gave up on is gone
        self.assertEqual(await snapshots.list(asking("7:", "acc")), [])

    async def test_a_close_while_the_store_opens_waits_and_closes_it(self):
        snapshots = Snapshots(self.sandbox, clock=Clock())
        opening = Deferred()
        snapshots.opening(opening)
        closed = snapshots.close()
        self.assertNoResult(closed)
        directory = self.mktemp()
        os.makedirs(directory, mode=0o700)
        store = await SqliteStore.open(directory, reactor)
        opening.callback(store)
        await closed
        error = await self.assertFailure(store.list("acc", "7:"), GatewayError)
        self.assertEqual(error.code, errors.UNAVAILABLE)  # closed
        self.assertIsNone(self.successResultOf(Snapshots(self.sandbox, clock=Clock()).close()))

    async def test_a_store_that_failed_or_a_gateway_stopping_answers_at_once(self):
        snapshots = Snapshots(self.sandbox, clock=Clock())
        waiting = snapshots.list(asking("7:", "acc"))
        snapshots.close()
        error = self.failureResultOf(waiting, GatewayError).value
        self.assertEqual(
            (error.code, error.message),
            (errors.UNAVAILABLE, "the snapshot store: the gateway is stopping"),
        )
        failed = Snapshots(self.sandbox, clock=Clock())
        failed.failed(Failure(OSError("disk full")))
        error = self.failureResultOf(failed.list(asking("7:", "acc")), GatewayError).value
        self.assertIn("disk full", error.message)


class SeveralAtOnceTests(SynchronousTestCase):
    """What a snapshot reads or restores goes several files at once, bounded (``_several``)."""

    def setUp(self):
        self.started: list[tuple[str, Deferred]] = []

    def call(self, name):
        d = Deferred()
        self.started.append((name, d))
        return d

    def several(self, sizes):
        calls = [(self.call, (name,)) for name in sizes]
        return Deferred.fromCoroutine(_several(calls, size=lambda call: sizes[call[1][0]]))

    def names(self):
        return [name for name, d in self.started if not d.called]

    def test_small_files_go_many_at_once_a_large_one_alone(self):
        small = {f"s{n}": 10 for n in range(limits.FILES_AT_ONCE + 2)}
        sizes = {**small, "big": limits.FILE_BYTES_AT_ONCE + 1, "after": 10}
        done = self.several(sizes)
        self.assertEqual(len(self.names()), limits.FILES_AT_ONCE)  # the count bound
        self.started[0][1].callback(None)
        self.assertEqual(len(self.names()), limits.FILES_AT_ONCE)  # one ended, one more
        while "big" not in [name for name, _ in self.started]:
            for _, d in list(self.started):
                if not d.called:
                    d.callback(None)
        self.assertEqual(self.names(), ["big"])  # alone, once all before it ended
        self.started[-1][1].callback(None)
        self.assertEqual(self.names(), ["after"])
        self.started[-1][1].callback(None)
        self.successResultOf(done)

    def test_the_bytes_in_flight_are_bounded(self):
        part = limits.FILE_BYTES_AT_ONCE // 3
        self.several({"a": part, "b": part, "c": part, "d": part})
        self.assertEqual(self.names(), ["a", "b", "c"])
        self.started[0][1].callback(None)
        self.assertEqual(self.names(), ["b", "c", "d"])

    def test_the_first_failure_starts_nothing_more_and_waits_for_what_started(self):
        done = self.several({"a": 1, "b": 1, **{f"x{n}": 1 for n in range(40)}})
        self.started[1][1].errback(Failure(GatewayError(errors.FS_ERROR, "/b: Out of space")))
        started = len(self.started)
        self.started[0][1].callback(None)
        self.assertNoResult(done)  # the others started go on to their end
        for _, d in self.started[2:]:
            d.callback(None)
        self.assertEqual(len(self.started), started)  # nothing more was started
        self.assertEqual(self.failureResultOf(done, GatewayError).value.message, "/b: Out of space")
