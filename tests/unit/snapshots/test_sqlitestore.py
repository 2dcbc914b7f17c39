"""The embedded store against a real SQLite file, in a temporary directory."""

from __future__ import annotations

import os
import sqlite3
import stat

from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from tests.unit.snapshots.store_tests import StoreTests
from trapsandbox import errors, limits
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots.sqlitestore import SCHEMA_VERSION, SqliteStore


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
            self.assertIn("schema version 2", error.message)
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
