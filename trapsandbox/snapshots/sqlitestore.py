"""
The embedded snapshot store (SPEC §15): one SQLite file in the state directory.

Python's ``sqlite3`` blocks, so every statement runs on one thread of our own, on one
connection, never on the reactor's thread; each operation is one transaction there
(``BEGIN IMMEDIATE`` for a write), so a commit or a prune is atomic and operations never
interleave.  WAL mode: a reader (an operator's ``sqlite3`` shell, say) does not stop a
write.  The schema is made when the file is new and carries its version
(``PRAGMA user_version``); an older file is migrated in place as it opens (one
transaction), a file from a newer trapsandbox is refused, not rewritten.

Tables (every key starts with the account, so one account never reaches another's rows)::

    computers (account, trapos_id, last)                 the last id given: never reused
    snapshots (account, trapos_id, seq, created, reason, files, bytes, manifest)
    content   (account, sha256, size, stored, refs, data)
              stored: last touched, epoch ms; refs: how many snapshots use it

``manifest`` is the file list as the Redis store keeps it too and as the quota counts it
(``model.manifest``), one blob per snapshot.  Version 1 kept a row per file instead, with
an index by content: each path stored twice beside the account and traposId, 714 bytes a
file of a 200-character path against 288 now, none of it counted (issue 43).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from trapsandbox import limits
from trapsandbox.snapshots import model, retention
from trapsandbox.snapshots.model import FileEntry, MissingContent, NotFound, Snapshot, Summary
from trapsandbox.snapshots.store import SnapshotStore, not_found

T = TypeVar("T")

SCHEMA_VERSION = 2
# The columns a migration adds carry the defaults ALTER TABLE needs, here too: a new file
# and a migrated one have the same tables.
SCHEMA = """
CREATE TABLE computers (
  account TEXT NOT NULL, trapos_id TEXT NOT NULL, last INTEGER NOT NULL,
  PRIMARY KEY (account, trapos_id)
) WITHOUT ROWID;
CREATE TABLE snapshots (
  account TEXT NOT NULL, trapos_id TEXT NOT NULL, seq INTEGER NOT NULL,
  created INTEGER NOT NULL, reason TEXT NOT NULL, files INTEGER NOT NULL, bytes INTEGER NOT NULL,
  manifest BLOB NOT NULL DEFAULT x'',
  PRIMARY KEY (account, trapos_id, seq)
) WITHOUT ROWID;
CREATE TABLE content (
  account TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL, stored INTEGER NOT NULL,
  data BLOB NOT NULL, refs INTEGER NOT NULL DEFAULT 0, UNIQUE (account, sha256)
);
"""
# SQLite's default bound on the parameters of one statement is 32766; stay well under it.
_CHUNK = 500


class SqliteStore(SnapshotStore):
    """Open with ``SqliteStore.open``; ``close`` when done (the reactor's shutdown, say)."""

    def __init__(self, path: str, reactor: Any, **settings: Any) -> None:
        super().__init__(**settings)
        self.path = path
        self._reactor = reactor
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="trapsandbox-snapshots")
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._trigger: Any = None

    @classmethod
    def open(cls, directory: str, reactor: Any, **settings: Any) -> Deferred[SqliteStore]:
        """The store in ``directory`` (the state directory, already private), opened."""
        store = cls(os.path.join(directory, limits.SNAPSHOTS_FILE_NAME), reactor, **settings)
        store._pool.start()
        # Like adbapi's pools: the thread never outlives the reactor, even if no one closes
        # it or a close's answer comes after the reactor stopped (a "during" trigger is not
        # waited for, and a thread's answer is delivered only while the reactor runs).
        store._trigger = reactor.addSystemEventTrigger("during", "shutdown", store._final)
        d = store._run(store._open)
        d.addCallbacks(lambda _: store, store._failed_open)
        return d

    def _failed_open(self, failure: Failure) -> Failure:
        return self.close().addBoth(lambda _: failure)

    def close(self) -> Deferred[None]:
        """Close the file and stop the thread; again is harmless."""
        if self._closed:
            return succeed(None)
        d = self._run(self._close)
        self._closed = True
        d.addBoth(lambda result: (self._stop(), result)[1])
        return d

    def _final(self) -> None:
        """The reactor is stopping: the queued work (the close among it) runs, then the
        thread ends, before this returns."""
        self._trigger = None
        if not self._closed:
            self._closed = True
            self._pool.callInThread(self._close)
        self._stop()

    def _stop(self) -> None:
        if self._trigger is not None:
            self._reactor.removeSystemEventTrigger(self._trigger)
            self._trigger = None
        if self._pool.started:
            self._pool.stop()

    # -- On the store's thread ---------------------------------------------------------------

    def _run(self, f: Callable[..., T], *args: Any) -> Deferred[T]:
        if self._closed:
            return fail(model.unavailable("closed"))
        return deferToThreadPool(self._reactor, self._pool, f, *args)

    def _open(self) -> None:
        # Made 0600 before SQLite sees it (its -wal and -shm files copy the mode); a
        # symbolic link planted in its place is refused.
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.close(fd)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as error:
            raise model.unavailable(f"cannot open {self.path}: {error}") from None
        try:
            db.execute("PRAGMA busy_timeout = 5000")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                db.executescript(
                    f"BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
                )
            elif version == 1:
                _migrate_1_to_2(db)
            elif version != SCHEMA_VERSION:
                raise model.unavailable(
                    f"{self.path} has schema version {version}; this trapsandbox knows "
                    f"{SCHEMA_VERSION}: refused, left as it is"
                )
        except BaseException:
            db.close()
            raise
        self._db = db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _transaction(self, f: Callable[..., T], *args: Any, write: bool = False) -> Deferred[T]:
        def run() -> T:
            db = self._db
            if db is None:
                raise model.unavailable("closed")
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = f(db, *args)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return result
            except sqlite3.Error as error:
                raise model.unavailable(f"SQLite failed: {error}") from None

        return self._run(run)

    # -- The operations ----------------------------------------------------------------------

    def _latest(self, account: str, trapos_id: str) -> Deferred:
        def latest(db: sqlite3.Connection) -> dict[str, FileEntry]:
            row = db.execute(
                "SELECT manifest FROM snapshots WHERE account = ? AND trapos_id = ? "
                "ORDER BY seq DESC LIMIT 1",
                (account, trapos_id),
            ).fetchone()
            return {} if row is None else model.from_manifest(row[0])

        return self._transaction(latest)

    def _missing(self, account: str, hashes: list[str], now: int) -> Deferred:
        def missing(db: sqlite3.Connection) -> set[str]:
            absent = set(hashes)
            for chunk in _chunks(hashes):
                marks = ",".join("?" * len(chunk))
                present = db.execute(
                    f"UPDATE content SET stored = max(stored, ?) "  # noqa: S608 (marks only)
                    f"WHERE account = ? AND sha256 IN ({marks}) RETURNING sha256",
                    (now, account, *chunk),
                ).fetchall()
                absent.difference_update(sha for (sha,) in present)
            return absent

        return self._transaction(missing, write=True)

    def _put_content(self, account: str, sha256: str, data: bytes, now: int) -> Deferred:
        def put(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO content (account, sha256, size, stored, data) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (account, sha256) DO UPDATE SET stored = max(stored, excluded.stored)",
                (account, sha256, len(data), now, data),
            )

        return self._transaction(put, write=True)

    def _commit(
        self, account: str, trapos_id: str, files: dict[str, FileEntry], reason: str, now: int
    ) -> Deferred:
        def commit(db: sqlite3.Connection) -> str:
            hashes = sorted({e.sha256 for e in files.values()})
            absent = set(hashes)
            for chunk in _chunks(hashes):
                marks = ",".join("?" * len(chunk))
                present = db.execute(
                    f"SELECT sha256 FROM content "  # noqa: S608 (marks only)
                    f"WHERE account = ? AND sha256 IN ({marks})",
                    (account, *chunk),
                ).fetchall()
                absent.difference_update(sha for (sha,) in present)
            if absent:
                raise MissingContent(absent)
            (seq,) = db.execute(
                "INSERT INTO computers (account, trapos_id, last) VALUES (?, ?, 1) "
                "ON CONFLICT (account, trapos_id) DO UPDATE SET last = last + 1 RETURNING last",
                (account, trapos_id),
            ).fetchone()
            count, size = model.sized(files)
            db.execute(
                "INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (account, trapos_id, seq, now, reason, count, size, model.manifest(files)),
            )
            _count_refs(db, account, hashes, 1)
            return str(seq)

        return self._transaction(commit, write=True)

    def _list(self, account: str, trapos_id: str) -> Deferred:
        def listing(db: sqlite3.Connection) -> list[Summary]:
            rows = db.execute(
                "SELECT seq, created, reason, files, bytes FROM snapshots "
                "WHERE account = ? AND trapos_id = ? ORDER BY seq DESC",
                (account, trapos_id),
            )
            return [Summary(str(seq), account, trapos_id, *rest) for seq, *rest in rows]

        return self._transaction(listing)

    def _get(self, account: str, trapos_id: str, seq: int, snapshot_id: str) -> Deferred:
        def get(db: sqlite3.Connection) -> Snapshot:
            row = db.execute(
                "SELECT created, reason, manifest FROM snapshots "
                "WHERE account = ? AND trapos_id = ? AND seq = ?",
                (account, trapos_id, seq),
            ).fetchone()
            if row is None:
                raise not_found(snapshot_id)
            created, reason, manifest = row
            files = model.from_manifest(manifest)
            return Snapshot(str(seq), account, trapos_id, created, reason, files)

        return self._transaction(get)

    def _content(self, account: str, sha256: str) -> Deferred:
        def content(db: sqlite3.Connection) -> bytes:
            row = db.execute(
                "SELECT data FROM content WHERE account = ? AND sha256 = ?", (account, sha256)
            ).fetchone()
            if row is None:
                raise NotFound(f"no content {sha256[:12]}... stored")
            return bytes(row[0])

        return self._transaction(content)

    def _prune(self, account: str, before: int) -> Deferred:
        def prune(db: sqlite3.Connection) -> model.Pruned:
            held = _held(db, account)
            dropped = retention.to_drop(held, self.keep, self.quota)
            _drop(db, account, dropped)
            swept = db.execute(
                "DELETE FROM content WHERE account = ? AND stored <= ? AND refs <= 0 "
                "RETURNING size",
                (account, before),
            ).fetchall()
            return model.Pruned(
                tuple((h.trapos_id, str(h.seq)) for h in dropped),
                len(swept),
                sum(size for (size,) in swept),
            )

        return self._transaction(prune, write=True)

    def _delete_computer(self, account: str, trapos_id: str) -> Deferred:
        def delete(db: sqlite3.Connection) -> int:
            return _drop(db, account, _held(db, account, trapos_id))

        return self._transaction(delete, write=True)


def _held(db: sqlite3.Connection, account: str, trapos_id: str | None = None) -> list:
    """The account's snapshots (or one computer's) as retention sees them."""
    where, args = "account = ?", [account]
    if trapos_id is not None:
        where, args = where + " AND trapos_id = ?", [account, trapos_id]
    rows = db.execute(
        f"SELECT trapos_id, seq, created, manifest FROM snapshots WHERE {where}",  # noqa: S608
        args,
    )
    return [
        retention.held(t, seq, created, model.from_manifest(manifest), manifest)
        for t, seq, created, manifest in rows
    ]


def _drop(db: sqlite3.Connection, account: str, dropped: list[retention.Held]) -> int:
    """Delete ``dropped`` and uncount the content each used; how many there were."""
    for held in dropped:
        db.execute(
            "DELETE FROM snapshots WHERE account = ? AND trapos_id = ? AND seq = ?",
            (account, held.trapos_id, held.seq),
        )
        _count_refs(db, account, sorted(held.content), -1)
    return len(dropped)


def _count_refs(db: sqlite3.Connection, account: str, hashes: list[str], by: int) -> None:
    """One more (or fewer) snapshot uses each of ``hashes`` (distinct)."""
    for chunk in _chunks(hashes):
        marks = ",".join("?" * len(chunk))
        db.execute(
            f"UPDATE content SET refs = refs + ? "  # noqa: S608 (marks only)
            f"WHERE account = ? AND sha256 IN ({marks})",
            (by, account, *chunk),
        )


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """
    Version 1's row per file becomes each snapshot's manifest, and each content's
    references are counted, in one transaction: a failure leaves the file as it was.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("ALTER TABLE snapshots ADD COLUMN manifest BLOB NOT NULL DEFAULT x''")
        db.execute("ALTER TABLE content ADD COLUMN refs INTEGER NOT NULL DEFAULT 0")
        lists: dict[tuple[str, str, int], dict[str, FileEntry]] = {}
        for key in db.execute("SELECT account, trapos_id, seq FROM snapshots"):
            lists[key] = {}
        for account, trapos_id, seq, path, size, modified, sha in db.execute(
            "SELECT account, trapos_id, seq, path, size, modified, sha256 FROM files"
        ):
            lists[account, trapos_id, seq][path] = FileEntry(size, modified, sha)
        db.executemany(
            "UPDATE snapshots SET manifest = ? WHERE account = ? AND trapos_id = ? AND seq = ?",
            [(model.manifest(files), *key) for key, files in lists.items()],
        )
        db.execute(
            "UPDATE content SET refs = (SELECT count(*) FROM (SELECT DISTINCT trapos_id, seq "
            "FROM files WHERE files.account = content.account "
            "AND files.sha256 = content.sha256))"
        )
        db.execute("DROP TABLE files")
        db.execute("PRAGMA user_version = 2")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _chunks(items: list[str]) -> list[list[str]]:
    return [items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK)]
