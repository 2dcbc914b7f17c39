"""
A file change from the web console as one step (issue 34), request types of
``/operator`` (``operator.OperatorRequests.send``)::

    type          payload                               answer
    file_write    {path, content (base64)}              partials {written, size} after each
                                                        part, then {bytesWritten, sizeBytes}
    file_move     {from, to}                            {moved: [paths, as they are now]}
    folder_make   {path}                                {made: path, existed}

Every path is made canonical and checked once, first (``computers.paths``): a move into
itself is refused however it is spelt (``/other/../proj/inner``), and ``/rom``, the root
and the settings file are refused before anything is sent.

A client that announces ``move_file`` and ``make_folder`` in its hello
(``wire.FEATURES``) checks and does a move or a folder in one step on the computer, with
no yield between: nothing saved meanwhile is lost, no target made meanwhile is
overwritten, and making a folder that exists deletes nothing.  With an older client the
gateway composes them from reads, writes and deletes (each file read and written under
the new name, checked unchanged, then deleted; a folder made with a placeholder file),
holding the paths (``pathlocks``) so no change through the gateway mixes in; a player's
own save meanwhile is not lost (a file changed after it was copied is kept, and the move
fails saying so), though a narrow window is left between the last check and the delete.

Sent by the page one by one, the requests would each be an entry of the computer's
activity; sent here, they are made quietly (``Caller.quietly``) and the change is one
entry, by whoever sent it (``ActivityFeed.track``: ``write_file``, ``move_file``,
``make_folder``).  Each request still needs what the computer allows (``fs.read`` to read,
``fs.write`` to write, move and delete), checked where it goes out; ``file_write`` is as
atomic as ``Sandbox.write_file`` (the last part moves the file into place).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred

from trapsandbox import errors, limits
from trapsandbox.computers import paths, wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.sandbox import Sandbox
from trapsandbox.errors import GatewayError

WRITE, MOVE, FOLDER = "file_write", "file_move", "folder_make"
TYPES = frozenset({WRITE, MOVE, FOLDER})
# Files moved with a folder at most (each read and written whole).
MAX_MOVED_FILES = 1000
# The file a new folder is made with (CraftOS makes a file's missing folders), then deleted.
PLACEHOLDER = ".folder"


def _path(payload: dict[str, Any], name: str) -> str:
    """``payload[name]``, canonical and checked as a path to change (``paths.checked``)."""
    return paths.checked(payload.get(name), write=True, name=name)


def _content(payload: dict[str, Any]) -> bytes:
    content = payload.get("content")
    if type(content) is not str:
        raise errors.bad_request("content must be the file's bytes in base64")
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise errors.bad_request("content is not valid base64") from None
    if len(data) > limits.MAX_FILE_BYTES:
        raise GatewayError(
            errors.TOO_LARGE, f"at most {limits.MAX_FILE_BYTES} bytes can be written at once"
        )
    return data


def _missing(error: GatewayError) -> bool:
    return error.code == errors.FS_ERROR and "No such file" in error.message


def _directory(error: GatewayError) -> bool:
    return error.code == errors.FS_ERROR and "Is a directory" in error.message


class FileCalls:
    def __init__(self, registry: Registry, sandbox: Sandbox | None) -> None:
        self._registry = registry
        self._sandbox = sandbox

    def request(
        self,
        kind: str,
        caller: Caller,
        payload: dict[str, Any],
        on_partial: Callable[[dict[str, Any]], None] | None = None,
    ) -> Deferred[dict[str, Any]]:
        """One of ``TYPES``, by ``caller`` (aimed at the computer); raises ``GatewayError``
        for bad input (400) at once."""
        quiet = caller.quietly()
        if self._sandbox is None:
            raise GatewayError(errors.UNAVAILABLE, "this gateway serves no file requests here")
        if kind == WRITE:
            path, data = _path(payload, "path"), _content(payload)
            written = None
            if on_partial is not None:
                size = len(data)
                written = lambda n: on_partial({"written": n, "size": size})  # noqa: E731
            work = self._write(quiet, path, data, written)
            return self._one(caller, "write_file", {"path": path}, work)
        if kind == MOVE:
            source, target = _path(payload, "from"), _path(payload, "to")
            if paths.inside(target, source):
                raise errors.bad_request(
                    f"to must not be from itself or inside it ({target} is in {source})"
                )
            shown = {"path": f"{source} \u2192 {target}"}
            return self._one(caller, "move_file", shown, self._move(quiet, source, target))
        path = _path(payload, "path")
        return self._one(caller, "make_folder", {"path": path}, self._folder(quiet, path))

    def _one(
        self, caller: Caller, kind: str, shown: dict[str, Any], work: Any
    ) -> Deferred[dict[str, Any]]:
        """``work`` (a coroutine making its requests quietly), shown as one activity entry
        ``kind`` by ``caller``."""
        d = Deferred.fromCoroutine(work)
        if self._registry.find(*caller.key) is not None:
            self._registry.activity.track(caller.key, kind, shown, d, caller.sender)
        return d

    async def _write(
        self,
        caller: Caller,
        path: str,
        data: bytes,
        on_written: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        return await self._sandbox.write_file(caller, path, data, on_written=on_written)

    async def _exists(self, caller: Caller, path: str) -> bool:
        try:
            await self._sandbox.read_file(caller, path, 0, 0)
        except GatewayError as error:
            if _missing(error):
                return False
            if _directory(error):
                return True
            raise
        return True

    async def _one_step(
        self, caller: Caller, feature: str, work: Callable[[], Deferred]
    ) -> dict[str, Any] | None:
        """``work()``, ``feature``'s request done on the computer in one step, and its
        answer; None when its client does not know it (then the gateway composes it)."""
        # None: another process holds it (then asked; an older client's unknown_type means no).
        features = self._registry.features(caller)
        if features is not None and feature not in features:
            return None
        try:
            return await work()
        except GatewayError as error:
            if error.code == errors.UNKNOWN_TYPE:
                return None
            raise

    async def _move(self, caller: Caller, source: str, target: str) -> dict[str, Any]:
        hold = await self._sandbox.locks.acquire(caller.key, (source, target))
        try:
            move = lambda: self._sandbox.move_file(caller, source, target)  # noqa: E731
            if await self._one_step(caller, wire.MOVE_FILE, move) is not None:
                return {"moved": [target]}
            return await self._composed_move(caller, source, target)
        finally:
            hold.release()

    async def _composed_move(self, caller: Caller, source: str, target: str) -> dict[str, Any]:
        sandbox = self._sandbox
        if await self._exists(caller, target):
            raise GatewayError(errors.FS_ERROR, f"{wire.cut(target)} already exists")
        files, empty = await self._contents(caller, source)
        moved = []
        # What each copied file held, by digest: up to MAX_MOVED_FILES files of a MiB each
        # would otherwise be kept until the move ends.
        copied: list[tuple[str, bytes]] = []
        for path in files:
            new = target + path[len(source) :]
            got = await sandbox.read_file(caller, path, 0, None)
            await sandbox.write_file(caller, new, got["content"], lock=False)
            copied.append((path, hashlib.sha256(got["content"]).digest()))
            moved.append(new)
        for folder in empty:  # made anew: no file in them carries them over
            await self._composed_folder(caller, target + folder[len(source) :])
        # Only what was copied goes, each checked unchanged first: a save made meanwhile
        # stays where it was saved (and the move says so).
        kept = []
        for path, digest in copied:
            now = await sandbox.read_file(caller, path, 0, None)
            if hashlib.sha256(now["content"]).digest() != digest:
                kept.append(path)
                continue
            await sandbox.delete_file(caller, path, lock=False)
        if not kept:
            await self._remove_if_empty(caller, source)
        if kept:
            raise GatewayError(
                errors.FS_ERROR,
                f"{wire.cut(kept[0])} changed while it was moved: it is kept as it is now, "
                f"its copy at {wire.cut(target + kept[0][len(source) :])} is as it was",
            )
        return {"moved": moved}

    async def _remove_if_empty(self, caller: Caller, source: str) -> None:
        """Delete the folder ``source`` (or the file it was) once nothing is left in it."""
        try:
            entry = await self._entry(caller, source)
        except GatewayError as error:
            if _missing(error):
                return
            raise
        if entry.get("type") == "dir":  # (a file is one saved again at the path: kept)
            await self._prune(caller, source)

    async def _prune(self, caller: Caller, folder: str) -> bool:
        """Delete ``folder`` when only empty folders are left in it; whether it went."""
        listed = await self._sandbox.list_files(caller, folder)
        for each in listed.get("entries", []):
            if not isinstance(each, dict) or each.get("type") != "dir":
                return False  # a file made meanwhile: the folder stays with it
            if not await self._prune(caller, f"{folder}/{each.get('name')}"):
                return False
        await self._sandbox.delete_file(caller, folder, lock=False)
        return True

    async def _entry(self, caller: Caller, path: str) -> dict[str, Any]:
        """``path``'s entry in its folder's listing (its type, whether it is read-only)."""
        parent, name = path.rsplit("/", 1)
        listed = await self._sandbox.list_files(caller, parent or "/")
        for entry in listed.get("entries", []):
            if isinstance(entry, dict) and entry.get("name") == name:
                return entry
        raise GatewayError(errors.FS_ERROR, f"{wire.cut(path)}: No such file")

    async def _contents(self, caller: Caller, source: str) -> tuple[list[str], list[str]]:
        """
        ``([source], [])`` for a file, else the files under the folder ``source`` and its
        empty folders (itself too, when empty); refused at once when any of them is
        read-only (``/rom``, a read-only mount), before anything is written.
        """
        entry = await self._entry(caller, source)
        if entry.get("readOnly"):
            raise GatewayError(errors.FS_ERROR, f"{wire.cut(source)} is read-only")
        if entry.get("type") != "dir":
            return [source], []
        files: list[str] = []
        empty: list[str] = []
        folders = [source]
        while folders:
            folder = folders.pop()
            listed = await self._sandbox.list_files(caller, folder)
            entries = [e for e in listed.get("entries", []) if isinstance(e, dict)]
            if not entries:
                empty.append(folder)
            for each in entries:
                path = f"{folder}/{each.get('name')}"
                if each.get("readOnly"):
                    raise GatewayError(errors.FS_ERROR, f"{wire.cut(path)} is read-only")
                (folders if each.get("type") == "dir" else files).append(path)
                if len(files) > MAX_MOVED_FILES:
                    raise GatewayError(
                        errors.TOO_LARGE, f"a folder of over {MAX_MOVED_FILES} files is not moved"
                    )
        return files, empty

    async def _folder(self, caller: Caller, path: str) -> dict[str, Any]:
        hold = await self._sandbox.locks.acquire(caller.key, (path,))
        try:
            make = lambda: self._sandbox.make_folder(caller, path)  # noqa: E731
            made = await self._one_step(caller, wire.MAKE_FOLDER, make)
            if made is not None:
                return {"made": path, "existed": made.get("existed") is True}
            return await self._composed_folder(caller, path)
        finally:
            hold.release()

    async def _composed_folder(self, caller: Caller, path: str) -> dict[str, Any]:
        """A folder made with a placeholder written in it and deleted; one that exists is
        left as it is (nothing in it is touched)."""
        try:
            await self._sandbox.read_file(caller, path, 0, 0)
        except GatewayError as error:
            if _directory(error):
                return {"made": path, "existed": True}
            if not _missing(error):
                raise
        else:
            raise GatewayError(errors.FS_ERROR, f"{wire.cut(path)}: File exists")
        placeholder = f"{path}/{PLACEHOLDER}"
        await self._sandbox.write_file(caller, placeholder, b"", lock=False)
        await self._sandbox.delete_file(caller, placeholder, lock=False)
        return {"made": path, "existed": False}
