"""The embedded store against a real SQLite file, in a temporary directory."""

from __future__ import annotations

import os
import sqlite3
import stat

from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from tests.unit.snapshots.store_tests import A, StoreTests, entry, sha
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots.sqlitestore import SCHEMA_VERSION, SqliteStore

# Version 1's tables, as trapsandbox made them before issue 43: a row per file.
SCHEMA_1 = """
CREATE TABLE computers (
  account TEXT NOT NULL, trapos_id TEXT NOT NULL, last INTEGER NOT NULL,
  PRIMARY KEY (account, trapos_id)
) WITHOUT ROWID;
CREATE TABLE snapshots (
  account TEXT NOT NULL, trapos_id TEXT NOT NULL, seq INTEGER NOT NULL,
  created INTEGER NOT NULL, reason TEXT NOT NULL, files INTEGER NOT NULL, bytes INTEGER NOT NULL,
  PRIMARY KEY (account, trapos_id, seq)
) WITHOUT ROWID;
CREATE TABLE files (
  account TEXT NOT NULL, trapos_id TEXT NOT NULL, seq INTEGER NOT NULL, path TEXT NOT NULL,
  size INTEGER NOT NULL, modified INTEGER NOT NULL, sha256 TEXT NOT NULL,
  PRIMARY KEY (account, trapos_id, seq, path),
  FOREIGN KEY (account, trapos_id, seq) REFERENCES snapshots ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX files_by_content ON files (account, sha256);
CREATE TABLE content (
  account TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL, stored INTEGER NOT NULL,
  data BLOB NOT NULL, UNIQUE (account, sha256)
);
"""


class SqliteStoreTests(StoreTests, TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.directory = self.mktemp()
        os.makedirs(self.directory, mode=0o700)

    async def open_store(self, **settings):
        self._settings = settings
        store = await SqliteStore.open(self.directory, reactor, **settings)
        self.addCleanup(store.close)
        return store

    async def test_the_file_is_private_in_wal_mode_and_versioned(self):
        await self.store()
        path = os.path.join(self.directory, limits.SNAPSHOTS_FILE_NAME)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with sqlite3.connect(path) as db:
            self.assertEqual(db.execute("PRAGMA journal_mode").fetchone()[0], "wal")
            self.assertEqual(db.execute("PRAGMA user_version").fetchone()[0], SCHEMA_VERSION)
        db.close()

    async def test_a_file_from_a_newer_version_is_refused_untouched(self):
        path = os.path.join(self.directory, limits.SNAPSHOTS_FILE_NAME)
        db = sqlite3.connect(path)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.close()
        try:
            await SqliteStore.open(self.directory, reactor)
        except GatewayError as error:
            self.assertEqual(error.code, errors.UNAVAILABLE)
            self.assertIn(f"schema version {SCHEMA_VERSION + 1}", error.message)
        else:
            raise AssertionError("opened")

    async def test_a_symbolic_link_in_its_place_is_refused(self):
        target = os.path.join(self.directory, "elsewhere")
        os.symlink(target, os.path.join(self.directory, limits.SNAPSHOTS_FILE_NAME))
        try:
            await SqliteStore.open(self.directory, reactor)
        except GatewayError as error:
            self.assertIn("cannot open", error.message)
        else:
            raise AssertionError("opened")
        self.assertFalse(os.path.exists(target))

    async def test_a_version_1_file_is_migrated_in_place_and_keeps_working(self):
        path = os.path.join(self.directory, limits.SNAPSHOTS_FILE_NAME)
        db = sqlite3.connect(path)
        db.executescript(SCHEMA_1 + "PRAGMA user_version = 1;")
        with db:
            for data in (b"one", b"two", b"orphan"):
                db.execute(
                    "INSERT INTO content VALUES (?, ?, ?, 0, ?)", (A, sha(data), len(data), data)
                )
            db.execute("INSERT INTO computers VALUES (?, '1:', 2), (?, '2:', 1)", (A, A))
            for trapos_id, seq, files in (
                ("1:", 1, {"/a": b"one", "/b": b"one"}),
                ("1:", 2, {"/a": b"two", "/b": b"one"}),
                ("2:", 1, {"/c": b"two"}),
            ):
                db.execute(
                    "INSERT INTO snapshots VALUES (?, ?, ?, 1000, 'ask', ?, ?)",
                    (A, trapos_id, seq, len(files), sum(map(len, files.values()))),
                )
                db.executemany(
                    "INSERT INTO files VALUES (?, ?, ?, ?, ?, 7, ?)",
                    [(A, trapos_id, seq, p, len(d), sha(d)) for p, d in files.items()],
                )
        db.close()

        store = await self.store(grace=0)
        with sqlite3.connect(path) as db:
            self.assertEqual(db.execute("PRAGMA user_version").fetchone()[0], SCHEMA_VERSION)
        db.close()
        first = (await store.get(A, "1:", "1")).files
        self.assertEqual(
            {p: e.to_json() for p, e in first.items()},
            {"/a": entry(b"one", 7), "/b": entry(b"one", 7)},
        )
        self.assertEqual(await store.latest(A, "1:"), (await store.get(A, "1:", "2")).files)
        self.assertEqual([s.id for s in await store.list(A, "1:")], ["2", "1"])
        # The references were counted: a prune sweeps only what nothing uses.
        self.assertEqual((await store.prune(A)).content, 1)
        self.assertEqual(await store.content(A, sha(b"one")), b"one")
        self.assertEqual(await store.delete_computer(A, "1:"), 2)
        await store.prune(A)
        self.assertEqual(await store.missing(A, [sha(b"one"), sha(b"two")]), {sha(b"one")})
        self.assertEqual(await store.commit(A, "1:", {"/a": entry(b"two")}, "ask"), "3")
