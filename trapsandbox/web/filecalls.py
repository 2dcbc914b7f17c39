"""
A file change from the web console as one step (issue 34), request types of
``/operator`` (``operator.OperatorRequests.send``)::

    type          payload                               answer
    file_write    {path, content (base64)}              partials {written, size} after each
                                                        part, then {bytesWritten, sizeBytes}
    file_move     {from, to}                            {moved: [file paths, as they are now]}
    folder_make   {path}                                {made: path}

The computer reads and writes at most a frame's worth of a file per request, so a
save of a large file is several ``write_file`` parts, a rename a read, a write and a
delete, a folder's rename all of that for each file in it.  Sent by the page one
by one, each would be an entry of the computer's activity; sent here, they are
made quietly (``Caller.quietly``) and the change is one entry, by whoever sent
it (``Registry.track``: ``write_file``, ``move_file``, ``make_folder``).  Each
request still needs what the computer allows (``fs.read`` to read, ``fs.write``
to write and delete), checked where it goes out; ``file_write`` is as atomic
as ``Sandbox.write_file`` (the last part moves the file into place).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred

from trapsandbox import errors, limits
from trapsandbox.computers import wire
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
    path = payload.get(name)
    if type(path) is not str or not path.strip("/ ") or len(path) > limits.MAX_ID_LENGTH * 4:
        raise errors.bad_request(f"{name} must be a path on the computer (a non-empty string)")
    return "/" + path.strip("/")


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
            if source == target or target.startswith(source + "/"):
                raise errors.bad_request("to must not be from itself or inside it")
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
            self._registry.track(caller.key, kind, shown, d, caller.sender)
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

    async def _move(self, caller: Caller, source: str, target: str) -> dict[str, Any]:
        sandbox = self._sandbox
        if await self._exists(caller, target):
            raise GatewayError(errors.FS_ERROR, f"{wire.cut(target)} already exists")
        files, empty = await self._contents(caller, source)
        moved = []
        for path in files:
            new = target + path[len(source) :]
            got = await sandbox.read_file(caller, path, 0, None)
            await sandbox.write_file(caller, new, got["content"])
            moved.append(new)
        for folder in empty:  # made anew: no file in them carries them over
            await self._folder(caller, target + folder[len(source) :])
        await sandbox.delete_file(caller, source)
        return {"moved": moved}

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
        placeholder = f"{path}/{PLACEHOLDER}"
        await self._sandbox.write_file(caller, placeholder, b"")
        await self._sandbox.delete_file(caller, placeholder)
        return {"made": path}
