"""A CraftOS computer for tests: real Lua 5.2 (lupa) driven by the Twisted reactor.

Enough of CraftOS to run the files in ``lua/`` unmodified, behaving as CC:Tweaked does: the
event queue (256 events, then dropped) with coroutines and ``parallel``; timers on the reactor;
"Too long without yielding" after ``yield_limit`` seconds without a yield; a terminal with a
real text/colour buffer (``term``, ``window``, ``colors``, CraftOS's word-wrapping ``write``),
multishell tabs each drawing into its own window; a filesystem rooted in a host directory with
CC:Tweaked's space accounting, binary handles and error messages; ``settings`` persisted to
``/.settings``; ``textutils`` serialisation and JSON with CraftOS's rules; ``shell``;
``read()`` fed by :meth:`Computer.type_line`; ``http.get`` and ``http.websocketAsync`` backed
by real connections. :attr:`Computer.output` is a flat log of everything written;
:meth:`Computer.screen_lines` is what the screen shows.

Lua strings are bytes on both sides (``encoding=None``): every string handed to Lua is bytes.

Usage (inside a trial ``TestCase`` or any reactor-driven test)::

    computer = Computer(self.mktemp(), id=7, label="lab")
    self.addCleanup(computer.shutdown)
    computer.write_file("/apis/libsandbox.lua", client.build_libsandbox())
    computer.set_settings({"sandbox.url": "ws://127.0.0.1:1234/gateway"})
    computer.run("/servers/sandbox.lua")          # a multishell tab: runs beside others
    proc = computer.run("/programs/sandbox.lua health")
    yield proc.done                               # (ok, error) when the program ends
    yield computer.wait_for_output("sandboxOk: true", timeout=5)
    computer.screen_lines()                       # the visible screen, one string a row

Options: ``size=(51, 19)`` (the terminal), ``colour=True`` (an advanced computer),
``capacity=1_000_000`` (bytes of disk, as CC:Tweaked's ``computer_space_limit``),
``yield_limit=7.0`` (seconds a computer may run without yielding), ``multishell=True`` (each
process is a multishell tab with its own window; keyboard events and ``terminate`` go to the
focused tab only, see :meth:`Computer.focus`).

Websocket behaviour follows CC:Tweaked by default (``close_mode="cct"``): a local ``close()``
sends no close frame and queues no ``websocket_closed``; ``close_mode="craftos-pc"`` sends a
close frame and queues ``websocket_closed`` when it completes. A close frame from the server
gives ``websocket_closed(url, reason, code)``, a dropped connection just ``(url)``.
Protocol slips the real emulators crash on (closing a handle twice, sending an empty string)
are recorded in :attr:`Computer.violations`.

Where it knowingly differs from CC:Tweaked (1.109+, whose sources it follows):

- The first process started is the focused tab (CraftOS's shell); a tab ends when its program
  ends (multishell would print "Press any key to continue" in a tab never focused); the tab bar
  has no scroll arrows and mouse events are not translated for it.
- The yield limit's error takes the position of the function running (as Cobalt's does);
  errors from API functions take their caller's line, except when the API function is called
  straight from ``pcall`` (Cobalt then uses the nearest Lua function's line).
- ``textutils.serialize`` orders non-array keys (numbers, then strings, then the rest);
  CraftOS uses ``next``'s order. Numbers print with Lua 5.2's ``%.14g``.
- No limit of 128 open files, no closing of dropped handles by the garbage collector; attribute
  times are the host's; timers are not rounded to 50 ms ticks; ``read()`` takes no history,
  completion or cursor keys, and a line wider than the terminal is cut, not scrolled (it is
  drawn as it is typed, as CraftOS's is).
- A program's own ``debug.sethook`` runs beside the yield limit's hook; a count hook asked for
  more than 5000 instructions apart is called every 5000.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from lupa import lua52
from twisted.internet import defer, task
from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers

from trapsandbox.web import client

BIOS = Path(__file__).with_name("craftos_bios.lua")
WORLD = Path(__file__).with_name("craftos_world.lua")
LUA = Path(__file__).resolve().parents[2] / "lua"
# Files of CC:Tweaked's ROM, copied as they are (rom/modules/main/cc/expect.lua).
ROM_COPY = Path(__file__).with_name("rom")
KEY_ENTER = 257
MAX_WEBSOCKETS = 4
MAX_WEBSOCKET_MESSAGE = 128 * 1024  # CC:Tweaked's default http.websocket_message limit


def _b(value: Any) -> Any:
    """Python str to Lua bytes; everything else unchanged."""
    return value.encode("utf-8") if isinstance(value, str) else value


def _s(value: Any) -> Any:
    """Lua bytes to Python str (for messages and paths)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


WAIT_TIMEOUT = 10.0


def _no_attributes(obj: Any, name: Any, is_setting: bool) -> Any:
    raise AttributeError("Lua code may not reach into Python objects")


# A tiny ROM: the programs the tests and the installer flow need.
ROM = {
    "programs/http/wget.lua": b"""
local args = { ... }
local run = args[1] == 'run'
if run then table.remove(args, 1) end
local url = table.remove(args, 1)
if not url then print('Usage: wget [run] <url> [args...]') return end
local response, err = http.get(url)
if not response then printError('Failed: ' .. tostring(err)) return end
local body = response.readAll()
response.close()
if run then
  local fn, loadErr = load(body, '=' .. url:match('[^/]*$'), 't', _ENV)
  if not fn then printError(loadErr) return end
  fn(table.unpack(args))
else
  local name = args[1] or url:match('([^/?]+)[^/]*$') or 'download'
  local h = fs.open(shell.resolve(name), 'w')
  h.write(body)
  h.close()
  print('Downloaded as ' .. name)
end
""",
    "programs/set.lua": b"""
local args = { ... }
if #args == 1 then print(args[1] .. ' is ' .. tostring(settings.get(args[1]))) return end
if #args ~= 2 then print('Usage: set <name> <value>') return end
local value = args[2]
if value == 'true' then value = true elseif value == 'false' then value = false
elseif tonumber(value) then value = tonumber(value) end
settings.set(args[1], value)
settings.save()
print(args[1] .. ' set to ' .. tostring(value))
""",
    "programs/bg.lua": b"""
local args = { ... }
if not shell.openTab then printError('Requires multishell') return end
shell.openTab(table.unpack(args))
""",
    "programs/shell.lua": b"""
while true do
  write('> ')
  local line = read()
  if line == 'exit' then return end
  shell.run(line)
end
""",
    # CC:Tweaked's own argument checks (libsandbox's sandbox/core.lua uses them).
    "modules/main/cc/expect.lua": (ROM_COPY / "modules/main/cc/expect.lua").read_bytes(),
}


class LuaProcessError(Exception):
    pass


@dataclass
class Screen:
    """What a terminal shows: a row is a string of ``width`` cells (bytes as Latin-1, one a
    cell), colours as blit strings (``0``-``f``, as ``window.getLine`` gives them)."""

    width: int
    height: int
    cursor: tuple[int, int]
    blink: bool
    lines: list[str]
    text_colours: list[str]
    background_colours: list[str]


def _screen(table: Any) -> Screen:
    rows = table[b"height"]

    def column(key: bytes) -> list[str]:
        return [table[key][i].decode("latin-1") for i in range(1, rows + 1)]

    return Screen(
        width=table[b"width"],
        height=rows,
        cursor=(table[b"x"], table[b"y"]),
        blink=bool(table[b"blink"]),
        lines=column(b"text"),
        text_colours=column(b"fg"),
        background_colours=column(b"bg"),
    )


# -- the disk -------------------------------------------------------------------------

MIN_FILE_SIZE = 500  # CC:Tweaked counts every file and folder as at least this many bytes
_ILLEGAL = frozenset(b'"*:<>?|')
_ILLEGAL_WILDCARDS = frozenset(b'":<>|')
OPEN_MODES = {  # mode -> (host mode, read, write, create, truncate, append, seekable)
    b"r": ("rb", True, False, False, False, False, True),
    b"w": ("wb", False, True, True, True, False, True),
    b"a": ("ab", False, True, True, False, True, False),
    b"r+": ("r+b", True, True, False, False, False, True),
    b"w+": ("w+b", True, True, True, True, False, True),
}


def sanitize_path(path: bytes, wildcards: bool = False) -> bytes:
    """CC:Tweaked's ``FileSystem.sanitizePath``: ``\\`` is ``/``, control characters and
    ``"*:<>?|`` (``*``/``?`` kept with ``wildcards``) dropped, parts stripped, ``.`` and
    ``...`` ignored, ``..`` folded (kept at the front), parts cut to 255 bytes."""
    illegal = _ILLEGAL_WILDCARDS if wildcards else _ILLEGAL
    cleaned = bytes(c for c in path.replace(b"\\", b"/") if c >= 32 and c not in illegal)
    parts: list[bytes] = []
    for raw in cleaned.split(b"/"):
        part = raw.strip()
        if not part or part == b"." or (len(part) >= 3 and part.strip(b".") == b""):
            continue
        if part == b"..":
            if parts and parts[-1] != b"..":
                parts.pop()
            else:
                parts.append(b"..")
        elif len(part) >= 255:
            parts.append(part[:255].strip())
        else:
            parts.append(part)
    return b"/".join(parts)


def _contains(parent: bytes, child: bytes) -> bool:
    parent, child = parent.lower(), child.lower()
    if child == b".." or child.startswith(b"../"):
        return False
    return child == parent or parent == b"" or child.startswith(parent + b"/")


class FsError(Exception):
    """A CraftOS filesystem error; its message is what Lua sees."""

    def __init__(self, message: str, path: bytes | None = None) -> None:
        if path is not None:
            message = "/" + os.fsdecode(path) + ": " + message
        super().__init__(message)
        self.message = message


class _Handle:
    def __init__(self, disk: Disk, fh: Any, path: Path, flags: tuple, rom: bool) -> None:
        self.disk, self.fh, self.path, self.rom = disk, fh, path, rom
        _, self.readable, self.writable, _, _, self.append, self.seekable = flags

    def write(self, data: bytes) -> None:
        if not data:
            return
        size = os.fstat(self.fh.fileno()).st_size
        position = size if self.append else self.fh.tell()
        grow = position + len(data) - max(MIN_FILE_SIZE, size)
        if grow > 0:
            if self.disk.used + grow > self.disk.capacity + MIN_FILE_SIZE:
                raise FsError("Out of space")
            self.disk.used += grow
        self.fh.write(data)

    def read(self, count: int) -> bytes | None:
        data = self.fh.read(count)
        return data if data else None

    def read_line(self, with_trailing: bool) -> bytes | None:
        start = self.fh.tell()
        chunks: list[bytes] = []
        while True:
            chunk = self.fh.read(8192)
            if not chunk:
                break
            at = chunk.find(b"\n")
            if at >= 0:
                chunks.append(chunk[: at + 1])
                self.fh.seek(start + sum(len(c) for c in chunks))
                break
            chunks.append(chunk)
        line = b"".join(chunks)
        if not line:
            return None
        if not line.endswith(b"\n"):
            return line
        if with_trailing:
            return line
        line = line[:-1]
        return line[:-1] if line.endswith(b"\r") else line

    def seek(self, whence: bytes, offset: int) -> int | None:
        base = {b"set": 0, b"cur": self.fh.tell(), b"end": os.fstat(self.fh.fileno()).st_size}
        target = base[whence] + offset
        if target < 0:
            return None
        self.fh.seek(target)
        return target


class Disk:
    """A computer's drive: the host directory ``root`` (``hdd``) with ``root/rom`` mounted
    read-only at ``/rom``, CC:Tweaked's space accounting (``WritableFileMount``: every file
    counts at least 500 bytes, every folder 500, the capacity is ``capacity`` + 500 for the
    root) and its error messages. Paths are CraftOS paths (bytes)."""

    def __init__(self, root: Path, capacity: int) -> None:
        self.root = root
        self.capacity = capacity
        self.used = 0
        self.handles: dict[int, _Handle] = {}
        self._next_handle = 0
        self.measure()

    def measure(self) -> None:
        """Recount the used space (after files were changed behind the computer's back)."""
        used = MIN_FILE_SIZE
        for dirpath, dirnames, filenames in os.walk(self.root):
            if Path(dirpath) == self.root and "rom" in dirnames:
                dirnames.remove("rom")
            used += MIN_FILE_SIZE * len(dirnames)
            for name in filenames:
                try:
                    used += max(MIN_FILE_SIZE, os.lstat(os.path.join(dirpath, name)).st_size)
                except OSError:
                    pass
        self.used = used

    @property
    def free(self) -> int:
        return max(self.capacity + MIN_FILE_SIZE - self.used, 0)

    # paths

    def resolve(self, path: bytes) -> tuple[bytes, bool, Path]:
        """(sanitised path, is it on the rom, host path); FsError for paths above the root."""
        clean = sanitize_path(path)
        if clean == b".." or clean.startswith(b"../"):
            raise FsError("Invalid Path", clean)
        parts = [os.fsdecode(p) for p in clean.split(b"/")] if clean else []
        rom = bool(parts) and parts[0].lower() == "rom"
        if rom:
            parts[0] = "rom"
        host = self.root.joinpath(*parts)
        if not host.resolve().is_relative_to(self.root):
            raise FsError("Access denied", clean)
        return clean, rom, host

    def _writable(self, path: bytes) -> tuple[bytes, Path]:
        clean, rom, host = self.resolve(path)
        if rom:
            raise FsError("Access denied", clean)
        return clean, host

    # queries

    def exists(self, path: bytes) -> bool:
        try:
            return self.resolve(path)[2].exists()
        except FsError:
            return False

    def is_dir(self, path: bytes) -> bool:
        try:
            return self.resolve(path)[2].is_dir()
        except FsError:
            return False

    def is_read_only(self, path: bytes) -> bool:
        try:
            return self.resolve(path)[1]
        except FsError:
            return False

    def drive(self, path: bytes) -> bytes | None:
        clean, rom, host = self.resolve(path)
        if not host.exists():
            return None
        return b"rom" if rom else b"hdd"

    def size(self, path: bytes) -> int:
        clean, _, host = self.resolve(path)
        if not host.exists():
            raise FsError("No such file", clean)
        return 0 if host.is_dir() else host.stat().st_size

    def attributes(self, path: bytes) -> dict[bytes, Any]:
        clean, rom, host = self.resolve(path)
        if not host.exists():
            raise FsError("No such file", clean)
        st = host.stat()
        modified = int(st.st_mtime * 1000)
        created = int(getattr(st, "st_birthtime", st.st_ctime) * 1000)
        return {
            b"size": 0 if host.is_dir() else st.st_size,
            b"isDir": host.is_dir(),
            b"isReadOnly": rom,
            b"created": created,
            b"modified": modified,
            b"modification": modified,
        }

    def list(self, path: bytes) -> list[bytes]:
        clean, _, host = self.resolve(path)
        if not host.exists():
            raise FsError("No such file", clean)
        if not host.is_dir():
            raise FsError("Not a directory", clean)
        return sorted(os.fsencode(p.name) for p in host.iterdir())

    def free_space(self, path: bytes) -> int:
        return 0 if self.resolve(path)[1] else self.free

    def capacity_of(self, path: bytes) -> int | None:
        return None if self.resolve(path)[1] else self.capacity

    # changes

    def make_dir(self, path: bytes) -> None:
        clean, host = self._writable(path)
        if host.exists():
            if not host.is_dir():
                raise FsError("File exists", clean)
            return
        missing = 1
        parent = host.parent
        while not parent.exists():
            missing += 1
            parent = parent.parent
        if self.free < missing * MIN_FILE_SIZE:
            raise FsError("Out of space", clean)
        try:
            host.mkdir(parents=True)
        except OSError:
            raise FsError("Access denied", clean) from None
        self.used += missing * MIN_FILE_SIZE

    def delete(self, path: bytes) -> None:
        clean, host = self._writable(path)
        if clean == b"":
            raise FsError("Access denied", clean)
        if host.exists() or host.is_symlink():
            self._delete_tree(host)

    def _delete_tree(self, host: Path) -> None:
        if host.is_dir() and not host.is_symlink():
            for child in host.iterdir():
                self._delete_tree(child)
            host.rmdir()
            self.used -= MIN_FILE_SIZE
        else:
            size = host.lstat().st_size
            host.unlink()
            self.used -= max(MIN_FILE_SIZE, size)

    def move(self, source: bytes, dest: bytes) -> None:
        src, src_rom, src_host = self.resolve(source)
        dst, dst_rom, dst_host = self.resolve(dest)
        if src_rom or dst_rom:
            raise FsError("Access denied")
        if not src_host.exists():
            raise FsError("No such file")
        if dst_host.exists():
            raise FsError("File exists")
        if _contains(src, dst):
            raise FsError("Can't move a directory inside itself")
        parent = dst.rpartition(b"/")[0]
        if parent and not self.resolve(parent)[2].exists():
            self.make_dir(parent)
        src_host.rename(dst_host)

    def copy(self, source: bytes, dest: bytes) -> None:
        src, _, src_host = self.resolve(source)
        dst, dst_rom, dst_host = self.resolve(dest)
        if dst_rom:
            raise FsError("Access denied", dst)
        if not src_host.exists():
            raise FsError("No such file", src)
        if dst_host.exists():
            raise FsError("File exists", dst)
        if _contains(src, dst):
            raise FsError("Can't copy a directory inside itself", src)
        self._copy_tree(src, dst, 0)

    def _copy_tree(self, src: bytes, dst: bytes, depth: int) -> None:
        host = self.resolve(src)[2]
        if depth >= 128:
            raise FsError("Too many directories to copy")
        if host.is_dir():
            self.make_dir(dst)
            for name in sorted(os.fsencode(p.name) for p in host.iterdir()):
                self._copy_tree(src + b"/" + name, dst + b"/" + name, depth + 1)
        else:
            handle = self.open(dst, b"w")
            try:
                self.handles[handle].write(host.read_bytes())
            finally:
                self.close(handle)

    # handles

    def open(self, path: bytes, mode: bytes) -> int:
        """Open a file; ``mode`` without its ``b``. Returns a handle id."""
        flags = OPEN_MODES[mode]
        host_mode, readable, writable, create, truncate, _, _ = flags
        clean, rom, host = self.resolve(path)
        if not writable:
            if not host.is_file():
                raise FsError("Not a file" if host.exists() else "No such file", clean)
        else:
            if rom:
                raise FsError("Access denied", clean)
            if clean == b"" or host.is_dir():
                raise FsError("Cannot write to directory" if create else "Not a file", clean)
            if create:
                parent = clean.rpartition(b"/")[0]
                if parent and not host.exists() and not host.parent.exists():
                    self.make_dir(parent)
            if not host.exists():
                if not create:
                    raise FsError("No such file", clean)
                if self.free < MIN_FILE_SIZE:
                    raise FsError("Out of space", clean)
                self.used += MIN_FILE_SIZE
            elif truncate:
                self.used -= max(host.stat().st_size, MIN_FILE_SIZE) - MIN_FILE_SIZE
        try:
            fh = open(host, host_mode, buffering=0)
        except OSError as e:
            raise FsError(e.strerror or "Access denied", clean) from None
        self._next_handle += 1
        self.handles[self._next_handle] = _Handle(self, fh, host, flags, rom)
        return self._next_handle

    def close(self, handle: int) -> None:
        h = self.handles.pop(handle, None)
        if h is not None:
            h.fh.close()

    def close_all(self) -> None:
        for handle in list(self.handles):
            self.close(handle)


class Process:
    """A top-level coroutine on a computer (a multishell tab, the startup program, ...)."""

    def __init__(self, computer: Computer, pid: int, name: str) -> None:
        self.computer = computer
        self.pid = pid
        self.name = name
        self.finished = False
        self.ok: bool | None = None
        self.error: str | None = None
        self._done: list[Deferred] = []

    @property
    def done(self) -> Deferred:
        """Fires with ``(ok, error)`` when the coroutine ends."""
        d: Deferred = Deferred()
        if self.finished:
            d.callback((self.ok, self.error))
        else:
            self._done.append(d)
        return d

    def screen(self) -> Screen:
        """This tab's own window (what the screen shows while the tab is focused, below the
        tab bar); the whole screen when the computer has no multishell."""
        table = self.computer.kernel[b"tabScreen"](self.pid)
        if table is None:
            raise LuaProcessError(f"process {self.pid} is not running")
        return _screen(table)

    def screen_lines(self) -> list[str]:
        return self.screen().lines

    def _finish(self, ok: bool, error: str | None) -> None:
        self.finished, self.ok, self.error = True, ok, error
        waiting, self._done = self._done, []
        for d in waiting:
            d.callback((ok, error))


class _WebSocket(WebSocketClientProtocol):
    """One ``http.websocketAsync`` connection; events go to the owning computer's queue."""

    computer: Computer
    sid: int
    url: bytes

    def onOpen(self) -> None:
        self.opened = True
        self.computer._ws_opened(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.computer._queue(b"websocket_message", self.url, payload, isBinary)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.computer._ws_closed(self, code, reason)

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        lost = self.factory.lost
        if not lost.called:
            lost.callback(None)


class Computer:
    """One emulated computer. See the module docstring for an example."""

    def __init__(
        self,
        root: str | Path,
        id: int = 0,
        label: str | None = None,
        *,
        reactor: Any = None,
        multishell: bool = True,
        http: bool = True,
        close_mode: str = "cct",
        size: tuple[int, int] = (51, 19),
        colour: bool = True,
        capacity: int = 1_000_000,
        yield_limit: float = 7.0,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.id = id
        self.label = label
        self.close_mode = close_mode
        self.alive = True
        self.violations: list[str] = []
        self._chunks: list[str] = []
        self._errors: list[str] = []
        self._text_cache: str | None = ""
        self._waiters: list[list[Any]] = []
        self._pump_call: Any = None
        self._flush_call: Any = None
        self._finished: list[tuple[Process, bool, str | None]] = []
        self._timers: dict[int, Any] = {}
        self._next_timer = 0
        self._sockets: dict[int, _WebSocket] = {}
        self._socket_lost: list[Deferred] = []
        self._connecting: list[Any] = []  # websockets' connectors (IConnector)
        self._next_socket = 0
        self._processes: dict[int, Process] = {}
        self._pending_http: list[Deferred] = []
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._agent = Agent(reactor, pool=self._pool)
        self._started = time.monotonic()
        self._write_rom()
        self.disk = Disk(self.root, capacity)

        # Lua reaches Python only through the host table's functions: no python.eval, no
        # builtins, no attributes of Python objects (debug.getupvalue can find `host`).
        self.lua = lua52.LuaRuntime(
            encoding=None,
            unpack_returned_tuples=True,
            register_eval=False,
            register_builtins=False,
            attribute_filter=_no_attributes,
        )
        host = self.lua.table_from(
            {
                b"wake": self._wake,
                b"out": self._out,
                b"err": self._err,
                b"procDone": self._proc_done,
                b"epoch": self._epoch,
                b"clock": lambda: time.monotonic() - self._started,
                b"ingameTime": lambda: ((time.monotonic() - self._started) / 50.0 + 6.0) % 24.0,
                b"setLabel": self._set_label,
                b"startTimer": self._start_timer,
                b"cancelTimer": self._cancel_timer,
                b"shutdown": self._lua_shutdown,
                b"fsSanitize": lambda p, wildcards: sanitize_path(p, bool(wildcards)),
                b"fsExists": self.disk.exists,
                b"fsIsDir": self.disk.is_dir,
                b"fsIsReadOnly": self.disk.is_read_only,
                b"fsSize": self._fs(self.disk.size),
                b"fsAttributes": self._fs(lambda p: self.lua.table_from(self.disk.attributes(p))),
                b"fsList": self._fs(lambda p: self.lua.table_from(self.disk.list(p))),
                b"fsDrive": self._fs(self.disk.drive),
                b"fsFreeSpace": self._fs(self.disk.free_space),
                b"fsCapacity": self._fs(self.disk.capacity_of),
                b"fsMakeDir": self._fs(self.disk.make_dir),
                b"fsDelete": self._fs(self.disk.delete),
                b"fsMove": self._fs(self.disk.move),
                b"fsCopy": self._fs(self.disk.copy),
                b"fsOpen": self._fs(self.disk.open),
                b"fsClose": self.disk.close,
                b"fsRead": self._fs_read,
                b"fsReadLine": lambda h, trailing: self.disk.handles[h].read_line(bool(trailing)),
                b"fsReadAll": lambda h: self.disk.handles[h].fh.read() or b"",
                b"fsWrite": self._fs(lambda h, data: self.disk.handles[h].write(data)),
                b"fsSeek": lambda h, whence, offset: self.disk.handles[h].seek(whence, int(offset)),
                b"wsOpen": self._ws_open,
                b"wsSend": self._ws_send,
                b"wsClose": self._ws_close,
                b"httpRequest": self._http_request,
            }
        )
        width, height = size
        options = self.lua.table_from(
            {
                b"id": id,
                b"label": _b(label),
                b"multishell": multishell,
                b"http": http,
                b"width": width,
                b"height": height,
                b"colour": colour,
                b"yieldLimit": float(yield_limit),
            }
        )
        bios = self.lua.eval("load")(BIOS.read_bytes(), b"@craftos_bios.lua")
        if isinstance(bios, tuple):
            raise RuntimeError(f"cannot load the bios: {bios[1]!r}")
        self.kernel = bios(host, options)

    # -- test-facing API --------------------------------------------------------------

    @property
    def output(self) -> str:
        """Everything written to the terminal (print, write, term.write and printError)."""
        if self._text_cache is None:
            self._text_cache = "".join(self._chunks)
        return self._text_cache

    def screen(self) -> Screen:
        """The computer's screen (the native terminal) as it is now."""
        return _screen(self.kernel[b"screen"]())

    def screen_lines(self) -> list[str]:
        """The visible screen, one string a row (trailing blanks kept: ``width`` cells)."""
        return self.screen().lines

    def focus(self, process: Process) -> None:
        """Switch to a multishell tab, as clicking it does: its window is shown and keyboard
        events and ``terminate`` go to it."""
        if not self.kernel[b"focus"](process.pid):
            raise LuaProcessError(f"process {process.pid} is not running")

    def terminate(self) -> None:
        """Hold Ctrl+T: a ``terminate`` event (to the focused tab under multishell)."""
        self.queue_event("terminate")

    @property
    def free_space(self) -> int:
        """``fs.getFreeSpace("/")``."""
        return self.disk.free

    @property
    def errors(self) -> str:
        """What printError wrote (also part of :attr:`output`)."""
        return "".join(self._errors)

    def install(self, source: str | Path, dest: str) -> None:
        """Copy a host file into the computer's filesystem at ``dest``."""
        target = self._path(_b(dest))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        self.disk.measure()

    def write_file(self, dest: str, content: str | bytes) -> None:
        target = self._path(_b(dest))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_b(content))
        self.disk.measure()

    def read_file(self, path: str) -> bytes | None:
        target = self._path(_b(path))
        return target.read_bytes() if target.is_file() else None

    def set_settings(self, values: dict[str, Any]) -> None:
        """Set and save settings, as `set name value` would."""
        settings = self.lua.globals()[b"settings"]
        for name, value in values.items():
            if value is None:
                settings[b"unset"](_b(name))
            else:
                settings[b"set"](_b(name), _b(value))
        settings[b"save"]()

    def get_setting(self, name: str) -> Any:
        return self.lua.globals()[b"settings"][b"get"](_b(name))

    def start_client(self, settings: dict) -> Process:
        """The client's library and daemon from ``lua/`` installed, ``settings`` set, the
        daemon run."""
        self.write_file("/apis/libsandbox.lua", client.build_libsandbox())
        self.install(LUA / "servers/sandbox.lua", "/servers/sandbox.lua")
        self.set_settings(settings)
        return self.run("/servers/sandbox.lua")

    def run(self, command: str) -> Process:
        """Run a shell command line in a new top-level process (like a new multishell tab)."""
        pid = self.kernel[b"runCommand"](_b(command))
        return self._process(pid, command)

    def run_lua(self, code: str, name: str = "harness") -> Process:
        """Run a Lua chunk as a new top-level process; it has `shell`, `require` and all APIs."""
        pid = self.kernel[b"runLua"](_b(code), _b(name))
        return self._process(pid, name)

    def boot(self) -> Process:
        """Run /startup.lua and the files in /startup/, as CraftOS does at boot."""
        return self._process(self.kernel[b"boot"](), "startup")

    def eval(self, code: str) -> Any:
        """Evaluate Lua synchronously in the computer's global environment (for inspection)."""
        return self.kernel[b"eval"](_b(code))

    def install_world(self, turtle: bool = False) -> Any:
        """Peripherals (``peripheral``, ``redstone``) and, with ``turtle``, a turtle in a small
        world (``craftos_world.lua``); returns its control table (``_G.harnessWorld``). Call it
        before the daemon starts: the daemon takes the APIs when it starts, as on CraftOS."""
        world = self.kernel[b"eval"](WORLD.read_bytes())
        if turtle:
            world[b"makeTurtle"]()
        return world

    def queue_event(self, name: str, *args: Any) -> None:
        self._queue(_b(name), *(_b(a) for a in args))

    def type_line(self, text: str) -> None:
        """Type a line into whatever `read()` is waiting: a paste, then Enter."""
        self._queue(b"paste", _b(text))
        self._queue(b"key", KEY_ENTER, False)

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = WAIT_TIMEOUT, what: str = "condition"
    ) -> Deferred:
        """A Deferred that fires once ``predicate()`` holds, checked after every event and
        every output; it fails with TimeoutError (showing the output) after ``timeout``."""
        d: Deferred = Deferred()
        if predicate():
            d.callback(None)
            return d
        entry: list[Any] = [predicate, d, None]
        entry[2] = self.reactor.callLater(timeout, self._waiter_timeout, entry, what, timeout)
        self._waiters.append(entry)
        return d

    def wait_for_output(self, text: str, timeout: float = WAIT_TIMEOUT) -> Deferred:
        return self.wait_for(lambda: text in self.output, timeout, f"output containing {text!r}")

    def wait_for_lua(self, expression: str, timeout: float = WAIT_TIMEOUT) -> Deferred:
        """Wait until a Lua expression (evaluated in the computer's globals) is truthy."""
        return self.wait_for(lambda: bool(self.eval("return " + expression)), timeout, expression)

    @property
    def open_websockets(self) -> int:
        return len(self._sockets)

    def shutdown(self) -> Deferred:
        """Stop everything: processes, timers, sockets, pending waits. Fires when every
        connection this computer opened is closed."""
        if self.alive:
            self.alive = False
            self.kernel[b"killAll"]()
            self.disk.close_all()
            if self._pump_call is not None and self._pump_call.active():
                self._pump_call.cancel()
            self._pump_call = None
            if self._flush_call is not None and self._flush_call.active():
                self._flush_call.cancel()
            self._flush_call = None
            for call in self._timers.values():
                if call.active():
                    call.cancel()
            self._timers.clear()
            for proto in list(self._sockets.values()):
                if proto.transport is not None:
                    proto.transport.abortConnection()
            self._sockets.clear()
            # A websocket still connecting would connect to nobody (the gateway would drop it
            # at its hello timeout, 10 s later): stop it now, which fires its ``lost``.
            for connector in self._connecting:
                if connector.state == "connecting":
                    connector.stopConnecting()
            self._connecting.clear()
            for pending in self._pending_http:
                if not pending.called:
                    pending.cancel()
            for entry in self._waiters:
                if entry[2].active():
                    entry[2].cancel()
                entry[1].errback(LuaProcessError("computer shut down"))
            self._waiters.clear()
        waits = [d for d in self._socket_lost if not d.called]
        waits += [d for d in self._pending_http if not d.called]
        closing = defer.DeferredList(waits, consumeErrors=True)
        closing.addCallback(lambda _: self._pool.closeCachedConnections())
        return closing

    # -- the event pump ---------------------------------------------------------------

    def _queue(self, name: bytes, *args: Any) -> None:
        if self.alive:
            self.kernel[b"enqueue"](name, *args)

    def _wake(self) -> None:
        if self._pump_call is None and self.alive:
            self._pump_call = self.reactor.callLater(0, self._pump)

    def _pump(self) -> None:
        self._pump_call = None
        for _ in range(100):
            if not self.alive:
                return
            more = self.kernel[b"step"]()
            self._flush()
            if not more:
                return
        self._wake()

    def _check_waiters(self) -> None:
        for entry in list(self._waiters):
            predicate, d, call = entry
            if entry in self._waiters and predicate():
                self._waiters.remove(entry)
                call.cancel()
                d.callback(None)

    def _waiter_timeout(self, entry: list[Any], what: str, timeout: float) -> None:
        if entry in self._waiters:
            self._waiters.remove(entry)
            entry[1].errback(
                TimeoutError(
                    f"computer {self.id}: {what} not met within {timeout} s; output so far:\n"
                    f"{self.output}"
                )
            )

    def _process(self, pid: int, name: str) -> Process:
        proc = self._processes.get(pid)
        if proc is None:
            proc = self._processes[pid] = Process(self, pid, name)
        return proc

    def _proc_done(self, pid: int, ok: bool, error: bytes | None) -> None:
        # Called from inside Lua: Deferreds fire later, never re-entering the runtime.
        self._finished.append((self._process(pid, ""), bool(ok), _s(error)))
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_call is None and self.alive:
            self._flush_call = self.reactor.callLater(0, self._flush)

    def _flush(self) -> None:
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        finished, self._finished = self._finished, []
        for proc, ok, error in finished:
            proc._finish(ok, error)
        self._check_waiters()

    # -- terminal, clock ---------------------------------------------------------------

    def _out(self, text: bytes) -> None:
        self._chunks.append(_s(text))
        self._text_cache = None
        self._schedule_flush()

    def _err(self, text: bytes) -> None:
        self._errors.append(_s(text))
        self._out(text)

    def _epoch(self, kind: bytes) -> float:
        now = time.time()
        if kind == b"utc":
            return float(int(now * 1000))
        if kind == b"local":
            return float(int((now - time.timezone) * 1000))
        # In-game time: deliberately far from the real clock, like CraftOS's default.
        return float(int((time.monotonic() - self._started) * 72000))

    def _set_label(self, label: bytes | None) -> None:
        self.label = _s(label)

    def _start_timer(self, seconds: float) -> int:
        self._next_timer += 1
        timer = self._next_timer
        self._timers[timer] = self.reactor.callLater(max(0.0, float(seconds)), self._fire, timer)
        return timer

    def _fire(self, timer: int) -> None:
        self._timers.pop(timer, None)
        self._queue(b"timer", timer)

    def _cancel_timer(self, timer: int) -> None:
        call = self._timers.pop(timer, None)
        if call is not None and call.active():
            call.cancel()

    def _lua_shutdown(self) -> None:
        self.reactor.callLater(0, self.shutdown)

    # -- filesystem --------------------------------------------------------------------

    def _path(self, path: bytes) -> Path:
        """The host file behind a CraftOS path (never outside the computer's root)."""
        return self.disk.resolve(path)[2]

    def _write_rom(self) -> None:
        for name, source in ROM.items():
            target = self.root / "rom" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source)

    def _fs(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A Disk operation for Lua: ``(true, result)``, or ``(false, message)`` on FsError."""

        def call(*args: Any) -> Any:
            try:
                return (True, fn(*args))
            except FsError as e:
                return (False, e.message.encode("utf-8", "surrogateescape"))
            except OSError as e:
                return (False, _b(e.strerror or "Access denied"))

        return call

    def _fs_read(self, handle: int, count: int) -> bytes | None:
        return self.disk.handles[handle].read(int(count))

    # -- websockets --------------------------------------------------------------------

    def _ws_open(self, url: bytes, headers: Any) -> Any:
        if not self.alive:
            return (False, b"Computer is off")
        if len(self._sockets) >= MAX_WEBSOCKETS:
            return (False, b"Too many websockets already open")
        text = _s(url)
        parts = urlsplit(text)
        if parts.scheme != "ws" or not parts.hostname:
            return (False, b"Invalid URL or only ws:// is emulated")
        extra = {}
        if headers is not None:
            extra = {_s(k): _s(v) for k, v in headers.items()}
        factory = WebSocketClientFactory(text, headers=extra or None)
        factory.setProtocolOptions(maxMessagePayloadSize=MAX_WEBSOCKET_MESSAGE)
        factory.protocol = _WebSocket
        factory.lost = Deferred()
        self._socket_lost.append(factory.lost)
        self._next_socket += 1
        sid = self._next_socket
        computer = self

        def build(addr: Any) -> _WebSocket:
            proto = WebSocketClientFactory.buildProtocol(factory, addr)
            proto.computer, proto.sid, proto.url = computer, sid, url
            proto.opened, proto.closed_locally, proto.settled = False, False, False
            computer._sockets[sid] = proto
            return proto

        def failed(connector: Any, reason: Any) -> None:
            if not factory.lost.called:
                factory.lost.callback(None)
            self._queue(b"websocket_failure", url, _b(reason.getErrorMessage()))

        factory.buildProtocol = build
        factory.clientConnectionFailed = failed
        connector = self.reactor.connectTCP(parts.hostname, parts.port or 80, factory, timeout=5)
        self._connecting = [c for c in self._connecting if c.state == "connecting"]
        self._connecting.append(connector)
        return True

    def _ws_opened(self, proto: _WebSocket) -> None:
        proto.settled = True
        handle = self.kernel[b"makeWebsocket"](proto.sid, proto.url)
        self._queue(b"websocket_success", proto.url, handle)

    def _ws_closed(self, proto: _WebSocket, code: int | None, reason: str | None) -> None:
        self._sockets.pop(proto.sid, None)
        if not proto.settled:
            proto.settled = True
            self._queue(b"websocket_failure", proto.url, _b(reason or "Could not connect"))
            return
        if proto.closed_locally and self.close_mode == "cct":
            return
        remote_code = getattr(proto, "remoteCloseCode", None)
        if proto.closed_locally or remote_code is not None:
            self._queue(
                b"websocket_closed",
                proto.url,
                _b(getattr(proto, "remoteCloseReason", None) or None),
                remote_code if remote_code is not None else code,
            )
        else:
            self._queue(b"websocket_closed", proto.url)

    def _ws_send(self, sid: int, message: bytes, binary: bool) -> Any:
        proto = self._sockets.get(sid)
        if message == b"":
            self.violations.append("sent an empty string on a websocket")
        if proto is None or proto.closed_locally:
            return (False, b"attempt to use a closed file")
        proto.sendMessage(message, isBinary=bool(binary))
        return True

    def _ws_close(self, sid: int, already_closed: bool) -> None:
        if already_closed:
            self.violations.append("closed a websocket handle twice")
            return
        proto = self._sockets.get(sid)
        if proto is None or proto.closed_locally:
            return
        proto.closed_locally = True
        if self.close_mode == "cct":
            # CC:Tweaked sends no close frame: the server sees 1006.
            proto.transport.abortConnection()
        else:
            proto.sendClose(1000)

    # -- http.get ----------------------------------------------------------------------

    def _http_request(self, url: bytes, method: bytes, body: Any, headers: Any) -> Any:
        if not self.alive:
            return (False, b"Computer is off")
        parts = urlsplit(_s(url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return (False, b"Invalid URL")
        hdrs = Headers()
        if headers is not None:
            for k, v in headers.items():
                hdrs.addRawHeader(k, v)
        # Start on the next turn: a synchronous failure must not re-enter Lua from Lua.
        d = task.deferLater(self.reactor, 0, self._agent.request, method, url, hdrs, None)

        def got(response: Any) -> Deferred:
            return readBody(response).addCallback(lambda data: (response, data))

        def success(result: Any) -> None:
            response, data = result
            headers_table = self.lua.table_from(
                {k: b", ".join(v) for k, v in response.headers.getAllRawHeaders()}
            )
            handle = self.kernel[b"makeResponse"](response.code, data, headers_table)
            if 200 <= response.code < 300:
                self._queue(b"http_success", url, handle)
            else:
                self._queue(b"http_failure", url, _b(response.phrase or "HTTP error"), handle)

        def failure(reason: Any) -> None:
            self._queue(b"http_failure", url, _b(reason.getErrorMessage()))

        d.addCallback(got)
        d.addCallbacks(success, failure)
        self._pending_http.append(d)
        return True
