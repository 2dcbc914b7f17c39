"""
The computer as a sandbox (SPEC §9): run programs and Lua, files, the screen.

    gateway_request exec {command, args?, cwd?, timeoutMs?, maxOutputBytes?}
        <- partial {type: stdout_delta | stderr_delta, data} ...
        <- {exitCode, timedOut, durationMs, stdout, stderr, stdoutTruncated?, stderrTruncated?}
    gateway_request eval {code, timeoutMs?, maxOutputBytes?}
        <- {ok, returns: [string], stdout, error?, durationMs, timedOut}
    gateway_request list_files {path}        <- {path, entries: [{name, type, size, readOnly}]}
    gateway_request read_file {path, offset?, length?, encoding: base64}
        <- {content, encoding, sizeBytes, offset, bytesRead}
    gateway_request write_file {path, content, encoding: base64,
                                part?: {offset, final, size, writeId}}
        <- {bytesWritten, sizeBytes}
    gateway_request write_files {encoding: binary, writeId, files: [{path, size}]} + bytes
        <- {written: [{path, sizeBytes}], failed?: {path, code, message}}
                                             (a client announcing it: several whole files)
    gateway_request delete_file {path}       <- {deleted}
    gateway_request move_file {from, to}     <- {moved: true}        (a client announcing it)
    gateway_request make_folder {path}       <- {made, existed}      (a client announcing it)
    gateway_request snapshot_list {}         <- {files: [{path, size, modified}], total}
    gateway_request screen {}                <- {width, height, cursorX, cursorY, lines, ...}
    gateway_request cancel {messageId}       <- {cancelled}
    gateway_request input {events}           <- {queued}
    gateway_request screen_watch {maxFps?}
        <- partial compact frames (``computers.screen``) until cancelled
    gateway_request list_peripherals {}      <- {peripherals: [{name, types, methods}]}
    gateway_request call_peripheral {name, method, args?}   <- {returns: [json]}
    gateway_request peripheral_events {events?, timeoutMs?}
        <- partial {type: event, name, args} ... <- {events, timedOut} (SPEC §16)
    gateway_request turtle {action, args?}   <- {returns, fuel, selected}

``Sandbox`` is what the HTTP endpoints and the MCP tools share: each method
fires with the computer's answer payload, or fails with a ``GatewayError``
(the gateway's own refusal, or the computer's ``ok: false`` answer with its
code: ``forbidden``, ``fs_error``, ``bad_request``, ``cancelled``, …).  Files
cross in parts, so every message stays under a computer's 128 KiB limit: raw bytes
of at most ``BINARY_PART_BYTES`` in binary messages to a client that announced them
(``computers.parts``), else base64 of at most ``FILE_CHUNK_BYTES`` in JSON; up to
``FILE_WINDOW`` parts of one read or write in flight, and what every write sends one
computer at most ``FILE_BYTES_AT_ONCE`` (``filebudget``).  The methods here split and
join them, up to ``MAX_FILE_BYTES`` in one call.

Every path is made canonical and checked here (``paths.checked``) before it is sent, and
a change (a write, a delete) holds its path (``pathlocks``) while it runs: two writes of
one file go one after the other, each in a temporary file of its own on the computer
(``writeId``), so the file is one of them whole, never parts of both.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger
from twisted.python.failure import Failure

from trapsandbox import errors, limits
from trapsandbox.computers import parts, paths, wire
from trapsandbox.computers.callers import Caller
from trapsandbox.computers.filebudget import FileBudget
from trapsandbox.computers.pathlocks import PathLocks
from trapsandbox.computers.registry import Registry
from trapsandbox.computers.screen import Room, frames_to
from trapsandbox.errors import GatewayError
from trapsandbox.limits import FILE_CHUNK_BYTES, MAX_FILE_BYTES

log = Logger()

# Called with (type, data): type "stdout_delta" or "stderr_delta".
OutputListener = Callable[[str, str], None]


def _answer(response: wire.ComputerResponse) -> dict[str, Any]:
    """The payload of a computer's answer; its ``ok: false`` as a ``GatewayError``."""
    if response.ok:
        return response.payload or {}
    error = response.error or errors.Error(errors.INTERNAL, "the computer gave no reason")
    raise GatewayError(error.code, error.message)


def _decode(content: object) -> bytes:
    if not isinstance(content, str):
        raise GatewayError(errors.INTERNAL, "the computer's answer has no file content")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise GatewayError(errors.INTERNAL, "the computer sent file content that is not base64")


def _count(payload: dict[str, Any], name: str) -> int:
    value = payload.get(name)
    if type(value) is not int or value < 0:
        raise GatewayError(errors.INTERNAL, f"the computer's answer has no valid {name}")
    return value


class Sandbox:
    def __init__(self, registry: Registry, locks: PathLocks | None = None) -> None:
        self._registry = registry
        self._locks = PathLocks(registry.clock) if locks is None else locks
        # What every write to one computer sends shares this: its queue stays bounded.
        self._budget = FileBudget(limits.FILE_BYTES_AT_ONCE)

    @property
    def registry(self) -> Registry:
        return self._registry

    @property
    def locks(self) -> PathLocks:
        """The paths of each computer being changed (a move holds its own, ``filecalls``)."""
        return self._locks

    def _call(
        self,
        caller: Caller,
        type: str,
        payload: dict[str, Any],
        timeout: float | None = None,
        on_partial: Callable[[dict[str, Any]], None] | None = None,
    ) -> Deferred:
        d = self._registry.request(caller, type, payload, timeout, on_partial)
        return d.addCallback(_answer)

    async def _sent(
        self,
        caller: Caller,
        size: int,
        type: str,
        payload: dict[str, Any],
        failed: list[Failure] | None = None,
    ) -> dict[str, Any]:
        """``_call`` of a request carrying ``size`` bytes of files, within the computer's
        ``FileBudget``: it waits for room, and gives it back once answered.  A failure is
        noted in ``failed`` before the room is given back, and one that was waiting when a
        part before it failed fails with it, unsent."""
        await self._budget.take(caller.key, size)
        try:
            if failed:
                failed[0].raiseException()
            return await self._call(caller, type, payload, limits.FILE_REQUEST_TIMEOUT)
        except BaseException:
            if failed is not None:
                failed.append(Failure())
            raise
        finally:
            self._budget.give(caller.key, size)

    def execute(
        self,
        caller: Caller,
        command: str,
        args: list[str] | None = None,
        cwd: str | None = None,
        timeout_ms: float | None = None,
        max_output_bytes: int | None = None,
        on_output: OutputListener | None = None,
    ) -> Deferred:
        """Run ``command`` on the computer; ``on_output`` hears its output as it comes."""
        payload: dict[str, Any] = {"command": command}
        if args:
            payload["args"] = args
        if cwd is not None:
            payload["cwd"] = cwd
        return self._run(caller, "exec", payload, timeout_ms, max_output_bytes, on_output)

    def eval(
        self,
        caller: Caller,
        code: str,
        timeout_ms: float | None = None,
        max_output_bytes: int | None = None,
        on_output: OutputListener | None = None,
    ) -> Deferred:
        """Run Lua ``code``; a compile or runtime error is an answer with ``ok: false``."""
        return self._run(
            caller,
            "eval",
            {"code": code},
            timeout_ms,
            max_output_bytes,
            on_output,
        )

    def _run(
        self,
        caller: Caller,
        type: str,
        payload: dict[str, Any],
        timeout_ms: float | None,
        max_output_bytes: int | None,
        on_output: OutputListener | None,
    ) -> Deferred:
        if timeout_ms is None:
            timeout_ms = limits.DEFAULT_RUN_TIMEOUT_MS
        payload["timeoutMs"] = timeout_ms
        if max_output_bytes is not None:
            payload["maxOutputBytes"] = max_output_bytes
        # The computer ends the run at timeoutMs and answers; past the margin it is gone.
        timeout = timeout_ms / 1000 + limits.RUN_ANSWER_MARGIN
        on_partial = None if on_output is None else _output_relay(on_output)
        return self._call(caller, type, payload, timeout, on_partial)

    def list_files(self, caller: Caller, path: str) -> Deferred:
        try:
            path = paths.checked(path)
        except GatewayError as error:
            return fail(error)
        return self._call(caller, "list_files", {"path": path}, limits.FILE_REQUEST_TIMEOUT)

    def delete_file(self, caller: Caller, path: str, lock: bool = True) -> Deferred:
        """Delete ``path`` (a folder with all in it); ``lock=False`` for a change that
        holds the path already (``locks``)."""
        try:
            path = paths.checked(path, write=True)
        except GatewayError as error:
            return fail(error)
        request = {"path": path}
        if not lock:
            return self._call(caller, "delete_file", request, limits.FILE_REQUEST_TIMEOUT)
        return Deferred.fromCoroutine(
            self._holding(
                caller,
                (path,),
                lambda: self._call(caller, "delete_file", request, limits.FILE_REQUEST_TIMEOUT),
            )
        )

    def move_file(self, caller: Caller, source: str, target: str) -> Deferred:
        """
        Move the file or folder ``source`` to ``target`` in one step on the computer
        (``move_file``, a client announcing ``wire.MOVE_FILE``): it refuses ``target``
        inside ``source``, an existing ``target`` and read-only paths itself, with no
        yield between its checks and the move.  Fires with ``{moved, from, to}``.
        """
        try:
            source = paths.checked(source, write=True, name="from")
            target = paths.checked(target, write=True, name="to")
        except GatewayError as error:
            return fail(error)
        if paths.inside(target, source):
            return fail(errors.bad_request(f"to ({target}) must not be from ({source}) or in it"))
        payload = {"from": source, "to": target}
        return self._call(caller, "move_file", payload, limits.FILE_REQUEST_TIMEOUT)

    def make_folder(self, caller: Caller, path: str) -> Deferred:
        """Make the folder ``path`` (and any missing above it) on the computer
        (``make_folder``, a client announcing ``wire.MAKE_FOLDER``); one that exists is
        left as it is.  Fires with ``{made, existed}``."""
        try:
            path = paths.checked(path, write=True)
        except GatewayError as error:
            return fail(error)
        return self._call(caller, "make_folder", {"path": path}, limits.FILE_REQUEST_TIMEOUT)

    async def _holding(self, caller: Caller, held: tuple[str, ...], work: Callable[[], Any]) -> Any:
        """``work()`` (a Deferred or a coroutine) while ``held`` is held on the computer."""
        hold = await self._locks.acquire(caller.key, held)
        try:
            result = work()
            if not isinstance(result, Deferred):
                result = Deferred.fromCoroutine(result)
            return await result
        finally:
            hold.release()

    def snapshot_list(self, caller: Caller, timeout: float | None = None) -> Deferred:
        """Every file a snapshot holds, ``{files: [{path, size, modified}], total}`` (§15)."""
        timeout = limits.FILE_REQUEST_TIMEOUT if timeout is None else timeout
        return self._call(caller, "snapshot_list", {}, timeout)

    def screen(self, caller: Caller) -> Deferred:
        return self._call(caller, "screen", {}, limits.FILE_REQUEST_TIMEOUT)

    def input(self, caller: Caller, events: list[Any]) -> Deferred:
        """Queue ``events`` (SPEC §14) on the computer; fires with ``{queued}``."""
        return self._call(caller, "input", {"events": events}, limits.FILE_REQUEST_TIMEOUT)

    def list_peripherals(self, caller: Caller) -> Deferred:
        return self._call(caller, "list_peripherals", {}, limits.FILE_REQUEST_TIMEOUT)

    def call_peripheral(
        self,
        caller: Caller,
        name: str,
        method: str,
        args: list[Any],
    ) -> Deferred:
        """``method`` of peripheral ``name``; fires with ``{returns}`` (SPEC §16)."""
        payload = {"name": name, "method": method, "args": args}
        return self._call(caller, "call_peripheral", payload, limits.FILE_REQUEST_TIMEOUT)

    def turtle(self, caller: Caller, action: str, args: list[Any]) -> Deferred:
        """One turtle ``action``; fires with ``{returns, fuel, selected}`` (SPEC §16)."""
        payload = {"action": action, "args": args}
        return self._call(caller, "turtle", payload, limits.FILE_REQUEST_TIMEOUT)

    def watch_peripheral_events(
        self,
        caller: Caller,
        on_event: Callable[[dict[str, Any]], None],
        events: list[str],
        timeout_ms: int | None = None,
    ) -> Deferred:
        """
        A ``peripheral_events``: ``on_event`` hears each ``{type: "event", name,
        args}``.  It fires with ``{events, timedOut}`` at the computer's timeout,
        or fails when cancelled (which cancels it on the computer).
        """
        payload: dict[str, Any] = {"events": events}
        if timeout_ms is not None:
            payload["timeoutMs"] = timeout_ms
        wait = (timeout_ms or limits.PERIPHERAL_EVENTS_TIMEOUT_MS) / 1000
        return self._call(
            caller,
            "peripheral_events",
            payload,
            wait + limits.PERIPHERAL_EVENTS_GRACE,
            on_event,
        )

    def watch_screen(
        self,
        caller: Caller,
        on_frame: Callable[[dict[str, Any]], None],
        max_fps: float | None = None,
        room: Room | None = None,
    ) -> Deferred:
        """
        A ``screen_watch``: ``on_frame`` hears each frame as operators get them
        (``ScreenState``), when ``room()`` (if given) says the watcher has room
        for one (else merged with the next until it has).  It runs until the
        Deferred is cancelled (which cancels it on the computer) or the computer
        ends it (a failure).
        """
        payload = {} if max_fps is None else {"maxFps": max_fps}
        return self._call(
            caller,
            "screen_watch",
            payload,
            limits.SCREEN_WATCH_TIMEOUT,
            frames_to(on_frame, room),
        )

    def read_file(
        self,
        caller: Caller,
        path: str,
        offset: int = 0,
        length: int | None = None,
    ) -> Deferred:
        """
        Fires with ``{content: bytes, sizeBytes, offset, bytesRead}``: ``length``
        bytes from ``offset`` (default: to the end), read in chunks, at most
        ``MAX_FILE_BYTES``.
        """
        try:
            path = paths.checked(path)
        except GatewayError as error:
            return fail(error)
        return Deferred.fromCoroutine(self._read_file(caller, path, offset, length))

    async def _read_file(
        self, caller: Caller, path: str, offset: int, length: int | None
    ) -> dict[str, Any]:
        part, encoding = self._parts(caller)
        end = offset + (MAX_FILE_BYTES if length is None else min(length, MAX_FILE_BYTES))

        def ask(at: int) -> tuple[int, Deferred]:
            asked = min(part, end - at)
            payload = {"path": path, "offset": at, "length": asked, "encoding": encoding}
            return asked, self._call(caller, "read_file", payload, limits.FILE_REQUEST_TIMEOUT)

        # The first part says how large the file is; the rest are asked FILE_WINDOW at once.
        asked, first = ask(offset)
        answer = await first
        size = _count(answer, "sizeBytes")
        chunks = [_chunk(answer, asked)]
        got = len(chunks[0])
        end = min(end, size)
        if got < asked:
            end = offset + got
        window: deque[tuple[int, Deferred]] = deque()
        at = offset + got  # where the next part to ask starts
        try:
            while offset + got < end:
                while len(window) < limits.FILE_WINDOW and at < end:
                    window.append(ask(at))
                    at += window[-1][0]
                asked, d = window.popleft()
                answer = await d
                size = _count(answer, "sizeBytes")
                chunk = _chunk(answer, asked)
                chunks.append(chunk)
                got += len(chunk)
                if len(chunk) < asked:  # the file is shorter now than it was
                    break
        finally:
            _forget(d for _, d in window)
        return {"content": b"".join(chunks), "sizeBytes": size, "offset": offset, "bytesRead": got}

    def batch_bytes(self, caller: Caller) -> int:
        """How many bytes of whole files one ``write_files`` may carry to the computer: 0
        when its client takes no batches (then each file is a ``write_file``)."""
        features = self._registry.features(caller) or frozenset()
        return limits.BINARY_PART_BYTES if wire.WRITES_IN_BATCHES <= features else 0

    def write_files(self, caller: Caller, files: list[tuple[str, bytes]]) -> Deferred:
        """
        Replace each of ``files`` (``(path, content)``, at most ``batch_bytes`` in all) in one
        request, in order, each whole or not at all as ``write_file`` replaces one; holds their
        paths meanwhile.  Fires with the paths written, or fails with the first file's failure
        (those before it are written, none after it).
        """
        total = sum(len(content) for _, content in files)
        if total > self.batch_bytes(caller):
            return fail(
                errors.bad_request(
                    f"{total} bytes of files cannot go in one write_files to this computer"
                )
            )
        try:
            checked = [(paths.checked(path, write=True), content) for path, content in files]
        except GatewayError as error:
            return fail(error)
        held = tuple(path for path, _ in checked)
        return Deferred.fromCoroutine(
            self._holding(caller, held, lambda: self._write_files(caller, checked))
        )

    async def _write_files(self, caller: Caller, files: list[tuple[str, bytes]]) -> list[str]:
        payload = {
            "encoding": parts.BINARY,
            "writeId": uuid.uuid4().hex[:16],
            "files": [{"path": path, "size": len(content)} for path, content in files],
            "content": b"".join(content for _, content in files),
        }
        answer = await self._sent(caller, len(payload["content"]), "write_files", payload)
        failed = answer.get("failed")
        if isinstance(failed, dict):
            code, message = failed.get("code"), failed.get("message")
            raise GatewayError(
                code if isinstance(code, str) else errors.FS_ERROR,
                message if isinstance(message, str) else f"{failed.get('path')}: not written",
            )
        written = answer.get("written")
        said = (
            [w.get("path") for w in written if isinstance(w, dict)]
            if isinstance(written, list)
            else []
        )
        if said != [path for path, _ in files]:
            raise GatewayError(
                errors.INTERNAL, "the computer's answer does not name the files sent"
            )
        return said

    def _parts(self, caller: Caller) -> tuple[int, str]:
        """How large a part of a file may be, and how it crosses: binary to a client of
        this process that announced binary parts, else base64 text (``computers.parts``)."""
        if wire.BINARY_PARTS in (self._registry.features(caller) or ()):
            return limits.BINARY_PART_BYTES, parts.BINARY
        return FILE_CHUNK_BYTES, "base64"

    def write_file(
        self,
        caller: Caller,
        path: str,
        content: bytes,
        max_bytes: int = MAX_FILE_BYTES,
        on_written: Callable[[int], None] | None = None,
        lock: bool = True,
    ) -> Deferred:
        """
        Replace the file at ``path`` with ``content`` (at most ``max_bytes``: a restore
        writes back any file a snapshot holds), sent in parts into a temporary file of
        this write's own (``writeId``); the computer moves it into place with the last
        one, so the file is replaced whole or not at all.  Another write of the path
        waits for this one (``locks``; ``lock=False`` for a change that holds it
        already).  ``on_written`` hears how many bytes the computer holds after each part.
        """
        if len(content) > max_bytes:
            return fail(
                GatewayError(
                    errors.TOO_LARGE, f"at most {max_bytes} bytes can be written in one call"
                )
            )
        try:
            path = paths.checked(path, write=True)
        except GatewayError as error:
            return fail(error)
        if not lock:
            return Deferred.fromCoroutine(self._write_file(caller, path, content, on_written))
        return Deferred.fromCoroutine(
            self._holding(
                caller, (path,), lambda: self._write_file(caller, path, content, on_written)
            )
        )

    async def _write_file(
        self,
        caller: Caller,
        path: str,
        content: bytes,
        on_written: Callable[[int], None] | None,
    ) -> dict[str, Any]:
        part, encoding = self._parts(caller)
        # The computer's temporary file is this write's own; a client older than writeId
        # ignores it (and shares one per file, which the lock above keeps to one writer).
        write_id = uuid.uuid4().hex[:16]

        def send(offset: int) -> Deferred:
            chunk = content[offset : offset + part]
            final = offset + len(chunk) >= len(content)
            payload = {
                "path": path,
                "content": chunk if encoding == parts.BINARY else _base64(chunk),
                "encoding": encoding,
                # size: the computer checks the space for the whole file first.
                "part": {
                    "offset": offset,
                    "final": final,
                    "size": len(content),
                    "writeId": write_id,
                },
            }
            d = Deferred.fromCoroutine(
                self._sent(caller, len(chunk), "write_file", payload, failed)
            )
            if on_written is not None:
                d.addCallback(_tell, on_written, offset + len(chunk))
            return d

        # The parts before the last go FILE_WINDOW at once: the computer takes them in the
        # order sent and refuses one that does not start where what it holds ends.  None
        # goes once one has failed (refused before it was sent, say).  The last, which
        # moves the file into place, goes once all the others are written.
        last = max(0, (len(content) - 1) // part * part)
        window: deque[Deferred] = deque()
        failed: list[Failure] = []
        try:
            for offset in range(0, last, part):
                if len(window) == limits.FILE_WINDOW or failed:
                    await window.popleft()
                if failed:
                    break
                window.append(send(offset))
            while window:
                await window.popleft()
        finally:
            _forget(window)
        answer = await send(last)
        return {"bytesWritten": len(content), "sizeBytes": answer.get("sizeBytes", len(content))}


def _chunk(answer: dict[str, Any], asked: int) -> bytes:
    chunk = answer.get("content")
    if not isinstance(chunk, bytes):
        chunk = _decode(chunk)
    if len(chunk) > asked:
        raise GatewayError(errors.INTERNAL, "the computer sent more than was asked")
    return chunk


def _forget(deferreds: Iterable[Deferred]) -> None:
    """Cancel parts no longer wanted (one before them failed), their failures handled."""
    for d in list(deferreds):
        d.addErrback(lambda _: None)
        d.cancel()


def _tell(answer: dict[str, Any], on_written: Callable[[int], None], written: int) -> Any:
    on_written(written)
    return answer


def _base64(chunk: bytes) -> str:
    return base64.b64encode(chunk).decode("ascii")


def _output_relay(on_output: OutputListener) -> Callable[[dict[str, Any]], None]:
    def relay(payload: dict[str, Any]) -> None:
        kind, data = payload.get("type"), payload.get("data")
        if kind in ("stdout_delta", "stderr_delta") and isinstance(data, str) and data:
            on_output(kind, data)

    return relay
