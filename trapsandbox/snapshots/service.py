"""
Snapshots of a computer's files (SPEC §15): what the routes, ``trapsandbox-ctl``, the
game's ``sandbox`` commands and the ask hook call.  The storage layer decides nothing
about computers; this is where a computer is asked, in the order the store expects::

    take     snapshot_list -> refuse past the store's max_bytes, or a list that alone
             passes the account's quota (nothing saved)
             -> fetch what to_fetch names -> hash -> missing -> put_content -> commit -> prune
    changes  snapshot_list -> fetch what differs from the snapshot -> changes + text_diff
    restore  the snapshot (NotFound before anything moves) -> take one of now ("restore",
             so an undo can be undone) -> restore_plan: deletes, then each write whole
             (``write_file``'s parts: a file is replaced whole or not at all)

Every method takes the account first: the store and the registry both answer another
account's computer or snapshot exactly like a missing one.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet.defer import Deferred, FirstError, TimeoutError, gatherResults, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.computers import wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.computers.settingsfile import is_settings_path
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots import changes as diff
from trapsandbox.snapshots import model, retention
from trapsandbox.snapshots.model import FileEntry
from trapsandbox.snapshots.store import SnapshotStore

log = Logger()

OPENING = "it is still opening"
_UNREAD = "0" * 64


def _listed(answer: dict[str, Any], max_bytes: int) -> dict[str, tuple[int, int]]:
    """A ``snapshot_list`` answer as path -> (size, modified ms), checked (``max_bytes``:
    the bound of one snapshot, SANDBOX_SNAPSHOT_MAX_MB)."""
    files = answer.get("files")
    if isinstance(files, dict) and not files:  # an empty list as CraftOS may encode it
        files = []
    if not isinstance(files, list):
        raise GatewayError(errors.INTERNAL, "the computer's file list has no files")
    listing: dict[str, tuple[int, int]] = {}
    for item in files:
        if not isinstance(item, dict):
            raise GatewayError(errors.INTERNAL, "the computer's file list is malformed")
        path, size, modified = item.get("path"), item.get("size"), item.get("modified")
        if isinstance(modified, float) and modified.is_integer():
            modified = int(modified)
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        if (
            type(path) is not str
            or not path.startswith("/")
            or type(size) is not int
            or type(modified) is not int
            or size < 0
            or modified < 0
        ):
            raise GatewayError(errors.INTERNAL, "the computer's file list is malformed")
        if not is_settings_path(path):
            listing[path] = (size, modified)
    if len(listing) > limits.SNAPSHOT_MAX_FILES:
        raise GatewayError(
            errors.TOO_LARGE,
            f"the computer has {len(listing)} files: a snapshot holds at most "
            f"{limits.SNAPSHOT_MAX_FILES}",
        )
    model.check_total(sum(size for size, _ in listing.values()), max_bytes)
    return listing


class Snapshots:
    """
    ``store`` may come later (``opening``, or ``attach``): the embedded store opens on its
    thread while the gateway starts.  A call meanwhile waits for it
    (``SNAPSHOT_STORE_OPEN_WAIT`` at most, on ``clock``); one that finds it failed, or still
    opening past that, answers ``unavailable`` and why.
    """

    def __init__(
        self, sandbox: Sandbox, store: SnapshotStore | None = None, *, clock: IReactorTime
    ) -> None:
        self._sandbox = sandbox
        self._store = store
        self._clock = clock
        self._broken = OPENING
        self._closed = False
        self._waiting: list[Deferred[None]] = []
        self._opening: Deferred[object] | None = None

    def opening(self, store: Deferred[SnapshotStore]) -> None:
        """``store`` fires with the store once open: attached then (closed, if ``close``
        came first), or its failure kept.  ``close`` waits for it, so no store's thread or
        connection outlives a close made while it opened."""
        self._opening = store.addCallbacks(self.attach, self.failed)

    def attach(self, store: SnapshotStore) -> SnapshotStore | Deferred[None]:
        if self._closed:  # opened after the gateway stopped
            return store.close()
        self._store = store
        self._settled()
        return store

    def failed(self, failure: Failure) -> None:
        """The store could not be opened: said once in the log, and by every call."""
        self._broken = failure.getErrorMessage()
        log.error("snapshots are unavailable: {why}", why=self._broken)
        self._settled()

    def ready(self) -> Deferred[None]:
        """Fires once the store is open, or failed to open (then every call says why)."""
        if self._store is not None or self._broken != OPENING:
            return succeed(None)
        d: Deferred[None] = Deferred(self._waiting.remove)
        self._waiting.append(d)
        return d

    def _settled(self) -> None:
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(None)

    def close(self) -> Deferred[None]:
        store, self._store, self._closed = self._store, None, True
        self._broken = "the gateway is stopping"
        self._settled()
        if store is not None:
            return store.close()
        if self._opening is None:
            return succeed(None)
        closed: Deferred[None] = Deferred()
        self._opening.addBoth(lambda result: (closed.callback(None), result)[1])
        return closed

    def store(self) -> SnapshotStore:
        if self._store is None:
            raise model.unavailable(self._broken)
        return self._store

    async def _opened(self) -> SnapshotStore:
        """The store, once it is open (a call right after the gateway started waits)."""
        try:
            await self.ready().addTimeout(limits.SNAPSHOT_STORE_OPEN_WAIT, self._clock)
        except TimeoutError:
            pass  # store() says it is still opening
        return self.store()

    # -- The operations ----------------------------------------------------------------------

    def list(self, caller: Caller) -> Deferred[list[dict[str, Any]]]:
        """The computer's snapshots, newest first, as JSON."""

        async def run() -> list[dict[str, Any]]:
            store = await self._opened()
            return [s.to_json() for s in await store.list(*caller.key)]

        return Deferred.fromCoroutine(run())

    def take(self, caller: Caller, reason: str = "manual") -> Deferred[dict]:
        """A snapshot now: ``{id, files, bytes, fetched}``."""

        async def run() -> dict[str, Any]:
            snap_id, files, fetched, _ = await self._take(caller.quietly(), reason)
            count, size = model.sized(files)
            return {"id": snap_id, "files": count, "bytes": size, "fetched": fetched}

        return self._shown(caller, "snapshot", {"reason": reason}, run)

    def changes(self, caller: Caller, snapshot_id: str) -> Deferred[dict]:
        """From snapshot ``snapshot_id`` to the computer now: ``{snapshot, added, modified,
        deleted, diffs: [{path, diff}]}`` (a bounded diff per modified file)."""

        async def run() -> dict[str, Any]:
            account, trapos_id = caller.key
            store = await self._opened()
            snapshot = await store.get(account, trapos_id, snapshot_id)
            listing, _ = await self._list(caller.quietly())
            fetched = await self._fetch(
                caller.quietly(), diff.to_fetch(snapshot.files, listing), listing
            )
            hashes = {path: _sha(data) for path, data in fetched.items()}
            found = diff.changes(snapshot.files, listing, hashes)
            diffs = []
            for change in found.modified:
                if change.path in fetched:
                    before = await store.content(account, snapshot.files[change.path].sha256)
                    text = diff.text_diff(change.path, before, fetched[change.path])
                    diffs.append({"path": change.path, "diff": text})
            return {"snapshot": snapshot.id, **found.to_json(), "diffs": diffs}

        return self._shown(caller, "snapshot_changes", {"snapshot": snapshot_id}, run)

    def restore(self, caller: Caller, snapshot_id: str) -> Deferred[dict]:
        """Bring the computer's files back to ``snapshot_id``: ``{restored, before, deleted,
        written}`` (``before``: the snapshot of the state it replaced, to undo the undo)."""

        async def run() -> dict[str, Any]:
            account, trapos_id = caller.key
            quiet = caller.quietly()
            store = await self._opened()
            target = await store.get(account, trapos_id, snapshot_id)
            before, current, _, free = await self._take(quiet, "restore")
            plan = diff.restore_plan(target.files, current)
            need = diff.restore_space(plan, target.files, current)
            if free is not None and need > free:
                # Known before the first deletion: a restore is whole or not at all.
                raise GatewayError(
                    errors.FS_ERROR,
                    f"Out of space: restoring snapshot {target.id} needs {need} bytes free "
                    f"on {wire.cut(trapos_id)}, which has {free}: nothing was changed "
                    "(delete some files there, then restore again)",
                )

            async def write(batch: list[tuple[str, str]]) -> None:
                # Read together: the store answers them one after another in its thread,
                # not each after a trip back through the reactor.
                reads = [store.content(account, sha) for _, sha in batch]
                try:
                    read = await gatherResults(reads, consumeErrors=True)
                except FirstError as error:
                    error.subFailure.raiseException()
                contents = list(zip((path for path, _ in batch), read, strict=True))
                if len(contents) > 1:
                    await self._sandbox.write_files(quiet, contents)
                else:
                    path, data = contents[0]
                    await self._sandbox.write_file(quiet, path, data, max_bytes=store.max_bytes)

            def size(batch: list[tuple[str, str]]) -> int:
                # A file of more than one part goes alone: its temporary file outlives a
                # request, and the space the restore checked holds one such at a time.
                sizes = [target.files[path].size for path, _ in batch]
                if max(sizes) > limits.FILE_CHUNK_BYTES:
                    return limits.FILE_BYTES_AT_ONCE + 1
                return sum(sizes)

            await _several(
                [(self._sandbox.delete_file, (quiet, path)) for path in plan.delete],
                size=lambda _: 0,
            )
            # Small files several to a request, where the computer's client takes that.
            batches = _batches(plan.write, target.files, self._sandbox.batch_bytes(quiet))
            await _several([(write, (batch,)) for batch in batches], size=lambda c: size(c[1][0]))
            return {
                "restored": target.id,
                "before": before,
                "deleted": list(plan.delete),
                "written": [path for path, _ in plan.write],
            }

        return self._shown(caller, "snapshot_restore", {"snapshot": snapshot_id}, run)

    def _shown(
        self,
        caller: Caller,
        type: str,
        names: dict[str, str],
        run: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
    ) -> Deferred[dict]:
        """
        ``run()``, in the computer's activity (SPEC §14) as one entry of ``type`` by
        ``caller``, instead of the many file requests it makes (``Caller.quietly``).
        """
        d = Deferred.fromCoroutine(run())
        self._sandbox.registry.activity.track(caller.key, type, names, d, caller.sender)
        return d

    # -- The steps ---------------------------------------------------------------------------

    async def _take(
        self, caller: Caller, reason: str
    ) -> tuple[str, dict[str, FileEntry], int, int | None]:
        """(id, files map, how many files were fetched, the computer's free bytes or None)."""
        model.check_reason(reason)
        account, trapos_id = caller.key
        store = await self._opened()
        latest = await store.latest(account, trapos_id)
        listing, free = await self._list(caller)
        # A list that alone would not fit the account's quota is refused before anything
        # is read: sizes 0 and one hash bound what the commit will count from below.
        unread = {path: FileEntry(0, modified, _UNREAD) for path, (_, modified) in listing.items()}
        retention.check_fits(unread, store.quota)
        fetched = await self._fetch(caller, diff.to_fetch(latest, listing), listing)
        hashes = {path: _sha(data) for path, data in fetched.items()}
        absent = await store.missing(account, hashes.values())
        for path, data in fetched.items():
            if hashes[path] in absent:
                await store.put_content(account, hashes[path], data)
                absent.discard(hashes[path])
        files = {}
        for path, (_, modified) in listing.items():
            if path in fetched:
                # What was read, should the file have moved since it was listed.
                files[path] = FileEntry(len(fetched[path]), modified, hashes[path])
            elif path in latest:
                files[path] = latest[path]
        snap_id = await store.commit(account, trapos_id, files, reason)
        try:
            await store.prune(account)
        except GatewayError as error:
            # The snapshot is taken; retention catches up at the next one.
            log.warn("snapshots of {account}: prune failed: {why}", account=account, why=error)
        return snap_id, files, len(fetched), free

    async def _list(self, caller: Caller) -> tuple[dict[str, tuple[int, int]], int | None]:
        """The computer's files, and its free bytes (None: a client that does not say)."""
        answer = await self._sandbox.snapshot_list(caller, limits.SNAPSHOT_LIST_TIMEOUT)
        free = answer.get("free")
        if type(free) is float and free.is_integer():
            free = int(free)
        return _listed(answer, self.store().max_bytes), free if type(free) is int else None

    async def _fetch(
        self,
        caller: Caller,
        paths: list[str],
        listing: dict[str, tuple[int, int]],
    ) -> dict[str, bytes]:
        """The content of ``paths``; one deleted since it was listed leaves the listing."""
        fetched = {}

        async def fetch(path: str) -> None:
            try:
                fetched[path] = await self._read(caller, path)
            except GatewayError as error:
                if error.code != errors.FS_ERROR:
                    raise
                del listing[path]

        await _several(
            [(fetch, (path,)) for path in paths],
            size=lambda call: listing[call[1][0]][0],
        )
        fetched = {path: fetched[path] for path in paths if path in fetched}  # (listed order)
        model.check_total(sum(len(data) for data in fetched.values()), self.store().max_bytes)
        return fetched

    async def _read(self, caller: Caller, path: str) -> bytes:
        """A whole file, past ``read_file``'s bound of one call if need be."""
        parts: list[bytes] = []
        offset = 0
        while True:
            answer = await self._sandbox.read_file(caller, path, offset=offset)
            parts.append(answer["content"])
            offset += answer["bytesRead"]
            if not answer["bytesRead"] or offset >= answer["sizeBytes"]:
                return b"".join(parts)
            model.check_total(offset, self.store().max_bytes)


async def _several(
    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]],
    size: Callable[[tuple[Callable[..., Any], tuple[Any, ...]]], int],
) -> None:
    """
    Each ``f(*args)`` of ``calls`` (a Deferred or a coroutine), started in order (the
    computer takes its requests in the order they come), several at once: at most
    ``FILES_AT_ONCE``, and the files' ``size`` in flight at most ``FILE_BYTES_AT_ONCE``
    (one larger runs alone), so what waits for the computer stays bounded.  The first
    failure stops what has not started and is raised once what has started has ended.
    """
    running: deque[tuple[Deferred, int]] = deque()
    failed: list[Failure] = []  # as they happen, so none more starts after the first
    held = 0

    async def drain(room: int) -> None:
        nonlocal held
        while running and (
            len(running) >= limits.FILES_AT_ONCE or held + room > limits.FILE_BYTES_AT_ONCE
        ):
            d, sized = running.popleft()
            held -= sized
            await d

    for call in calls:
        sized = size(call)
        await drain(sized)
        if failed:
            break
        f, args = call
        result = f(*args)
        d = result if isinstance(result, Deferred) else Deferred.fromCoroutine(result)
        running.append((d.addErrback(failed.append), sized))
        held += sized
    await drain(limits.FILE_BYTES_AT_ONCE + 1)  # (all of them)
    if failed:
        failed[0].raiseException()


def _batches(writes: list[tuple[str, str]], sizes: dict[str, FileEntry], most: int):
    """
    ``writes`` in order, in runs of at most ``most`` bytes each, what their frame says of each
    file counted too (its path, escaped, and its size), and at most ``BATCH_FILES`` files (a
    larger file alone): what one ``write_files`` carries.
    """
    batches: list[list[tuple[str, str]]] = []
    held = 0
    for write in writes:
        cost = sizes[write[0]].size + 6 * len(write[0]) + 64
        if batches and held + cost <= most and len(batches[-1]) < limits.BATCH_FILES:
            batches[-1].append(write)
            held += cost
        else:
            batches.append([write])
            held = cost
    return batches


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
