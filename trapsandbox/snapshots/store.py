"""
The interface of a snapshot store (SPEC §15), and what both stores share.

Taking a snapshot is three steps, and only the last one makes it visible::

    latest(account, traposId)        the newest files map: only what differs is fetched
    missing(account, hashes)         which of the fetched files' content is not stored yet
    put_content(account, sha, data)  each of those (its hash checked)
    commit(account, traposId, files, reason) -> id     atomic; refused (MissingContent,
                                     nothing listed) unless all its content is stored, and
                                     (TOO_LARGE) when it alone passes the account's quota

so a crash mid-way leaves at most content no snapshot uses, which ``prune`` removes once
nothing touched it for ``SNAPSHOT_ORPHAN_GRACE`` (``missing`` and ``put_content`` touch
what they see, so a snapshot being taken keeps what it checked).  Everything is keyed by
account: content is stored per account (no account learns whether another holds a file),
and another account's snapshot answers ``NotFound`` exactly like a missing one.

Subclasses implement the ``_`` methods on arguments already checked here.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred

from trapsandbox import limits
from trapsandbox.snapshots import model, retention
from trapsandbox.snapshots.model import FileEntry, NotFound, Snapshot, Summary


class SnapshotStore(abc.ABC):
    """Every method returns a Deferred; a bad argument fails it with a ``GatewayError``."""

    def __init__(
        self,
        now: Callable[[], float] = time.time,
        keep: int = limits.SNAPSHOTS_KEEP,
        quota: int = limits.SNAPSHOT_QUOTA_BYTES,
        grace: float = limits.SNAPSHOT_ORPHAN_GRACE,
        max_bytes: int = limits.SNAPSHOT_MAX_BYTES,
    ) -> None:
        self._now = now
        # Retention (SANDBOX_SNAPSHOTS_KEEP, SANDBOX_SNAPSHOT_QUOTA_MB) and the bound of one
        # snapshot (SANDBOX_SNAPSHOT_MAX_MB), which ``Snapshots`` also reads from here.
        self.keep = keep
        self.quota = quota
        self.grace = grace
        self.max_bytes = max_bytes

    def now_ms(self) -> int:
        return int(self._now() * 1000)

    # -- The interface -----------------------------------------------------------------------
    # maybeDeferred: a check that raises fails the Deferred, before the store is touched.

    def latest(self, account: str, trapos_id: str) -> Deferred[dict[str, FileEntry]]:
        """The newest snapshot's files map; empty when the computer has none."""
        return maybeDeferred(lambda: self._latest(_account(account), _computer(trapos_id)))

    def missing(self, account: str, hashes: Iterable[str]) -> Deferred[set[str]]:
        """Those of ``hashes`` the store does not hold for ``account`` (the others touched).
        None asked about (a snapshot that fetched nothing): none missing, without a trip to
        the store's thread."""

        def look() -> Any:
            name = _account(account)
            checked = sorted({model.check_sha256(h) for h in hashes})
            return self._missing(name, checked, self.now_ms()) if checked else set()

        return maybeDeferred(look)

    def put_content(self, account: str, sha256: str, data: bytes) -> Deferred[None]:
        """Store ``data`` under ``sha256`` (checked) for ``account``; again is harmless."""
        return maybeDeferred(
            lambda: self._put_content(
                _account(account),
                sha256,
                model.check_content(sha256, data, self.max_bytes),
                self.now_ms(),
            )
        )

    def commit(
        self, account: str, trapos_id: str, files: Mapping[str, Any], reason: str
    ) -> Deferred[str]:
        """Make a snapshot of ``files`` visible, atomically; its id.  Refused, nothing
        saved, when it alone takes more than the quota (``retention.check_fits``)."""

        def commit() -> Deferred:
            checked = _account(account), _computer(trapos_id)
            listed = model.check_files(files, self.max_bytes)
            why = model.check_reason(reason)
            retention.check_fits(listed, self.quota)
            return self._commit(*checked, listed, why, self.now_ms())

        return maybeDeferred(commit)

    def list(self, account: str, trapos_id: str) -> Deferred[list[Summary]]:
        """The computer's snapshots, newest first."""
        return maybeDeferred(lambda: self._list(_account(account), _computer(trapos_id)))

    def get(self, account: str, trapos_id: str, snapshot_id: str) -> Deferred[Snapshot]:
        """One snapshot with its files map, or ``NotFound``."""

        def get() -> Deferred:
            checked = _account(account), _computer(trapos_id)
            seq = model.sequence(snapshot_id)
            if seq is None:
                raise not_found(snapshot_id)
            return self._get(*checked, seq, snapshot_id)

        return maybeDeferred(get)

    def content(self, account: str, sha256: str) -> Deferred[bytes]:
        """The bytes stored under ``sha256`` for ``account``, or ``NotFound``."""
        return maybeDeferred(lambda: self._content(_account(account), model.check_sha256(sha256)))

    def prune(self, account: str) -> Deferred[model.Pruned]:
        """Retention (``retention.to_drop``), then content no snapshot uses and none touched."""
        before = self.now_ms() - int(self.grace * 1000)
        return maybeDeferred(lambda: self._prune(_account(account), before))

    def delete_computer(self, account: str, trapos_id: str) -> Deferred[int]:
        """Drop every snapshot of the computer (its content goes at the next prune)."""
        return maybeDeferred(lambda: self._delete_computer(_account(account), _computer(trapos_id)))

    @abc.abstractmethod
    def close(self) -> Deferred[None]: ...

    # -- What a store implements -------------------------------------------------------------

    @abc.abstractmethod
    def _latest(self, account: str, trapos_id: str) -> Deferred: ...

    @abc.abstractmethod
    def _missing(self, account: str, hashes: list[str], now: int) -> Deferred: ...

    @abc.abstractmethod
    def _put_content(self, account: str, sha256: str, data: bytes, now: int) -> Deferred: ...

    @abc.abstractmethod
    def _commit(
        self, account: str, trapos_id: str, files: dict[str, FileEntry], reason: str, now: int
    ) -> Deferred: ...

    @abc.abstractmethod
    def _list(self, account: str, trapos_id: str) -> Deferred: ...

    @abc.abstractmethod
    def _get(self, account: str, trapos_id: str, seq: int, snapshot_id: str) -> Deferred: ...

    @abc.abstractmethod
    def _content(self, account: str, sha256: str) -> Deferred: ...

    @abc.abstractmethod
    def _prune(self, account: str, before: int) -> Deferred: ...

    @abc.abstractmethod
    def _delete_computer(self, account: str, trapos_id: str) -> Deferred: ...


def not_found(snapshot_id: object) -> NotFound:
    return NotFound(f"no snapshot {model.wire.cut(snapshot_id)} of this computer")


def _account(account: object) -> str:
    return model.check_name(account, "an account")


def _computer(trapos_id: object) -> str:
    return model.check_name(trapos_id, "a traposId")
