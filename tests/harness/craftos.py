"""A CraftOS computer for tests: real Lua 5.2 (lupa) driven by the Twisted reactor.

Enough of CraftOS to run the files in ``lua/`` unmodified: the event queue (256 events, then
dropped) with coroutines and ``parallel``, timers on the reactor, a filesystem rooted in a host
directory, ``settings`` persisted to ``/.settings``, ``textutils`` JSON with CraftOS's rules,
``shell``/``multishell``, ``read()`` fed by :meth:`Computer.type_line`, ``http.get`` and
``http.websocketAsync`` backed by real connections, and captured terminal output.

Lua strings are bytes on both sides (``encoding=None``): every string handed to Lua is bytes.

Usage (inside a trial ``TestCase`` or any reactor-driven test)::

    computer = Computer(self.mktemp(), id=7, label="lab")
    self.addCleanup(computer.shutdown)
    computer.install(LUA_DIR / "apis/libsandbox.lua", "/apis/libsandbox.lua")
    computer.set_settings({"sandbox.url": "ws://127.0.0.1:1234/gateway"})
    computer.run("/servers/sandbox.lua")          # a multishell tab: runs beside others
    proc = computer.run("/programs/sandbox.lua health")
    yield proc.done                               # (ok, error) when the program ends
    yield computer.wait_for_output("sandboxOk: true", timeout=5)

Websocket behaviour follows CC:Tweaked by default (``close_mode="cct"``): a local ``close()``
sends no close frame and queues no ``websocket_closed``; ``close_mode="craftos-pc"`` sends a
close frame and queues ``websocket_closed`` when it completes. A close frame from the server
gives ``websocket_closed(url, reason, code)``, a dropped connection just ``(url)``.
Protocol slips the real emulators crash on (closing a handle twice, sending an empty string)
are recorded in :attr:`Computer.violations`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from lupa import lua52
from twisted.internet import defer, task
from twisted.internet.defer import Deferred
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers

BIOS = Path(__file__).with_name("craftos_bios.lua")
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
}


class LuaProcessError(Exception):
    pass


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
        self._next_socket = 0
        self._processes: dict[int, Process] = {}
        self._pending_http: list[Deferred] = []
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._agent = Agent(reactor, pool=self._pool)
        self._started = time.monotonic()
        self._write_rom()

        self.lua = lua52.LuaRuntime(encoding=None, unpack_returned_tuples=True)
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
                b"fsExists": lambda p: self._path(p).exists(),
                b"fsIsDir": lambda p: self._path(p).is_dir(),
                b"fsSize": self._fs_size,
                b"fsList": self._fs_list,
                b"fsMakeDir": lambda p: self._path(p).mkdir(parents=True, exist_ok=True),
                b"fsDelete": self._fs_delete,
                b"fsMove": lambda a, b: shutil.move(self._path(a), self._path(b)),
                b"fsCopy": self._fs_copy,
                b"fsRead": self._fs_read,
                b"fsWrite": self._fs_write,
                b"wsOpen": self._ws_open,
                b"wsSend": self._ws_send,
                b"wsClose": self._ws_close,
                b"httpRequest": self._http_request,
            }
        )
        options = self.lua.table_from(
            {b"id": id, b"label": _b(label), b"multishell": multishell, b"http": http}
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

    @property
    def errors(self) -> str:
        """What printError wrote (also part of :attr:`output`)."""
        return "".join(self._errors)

    def install(self, source: str | Path, dest: str) -> None:
        """Copy a host file into the computer's filesystem at ``dest``."""
        target = self._path(_b(dest))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)

    def write_file(self, dest: str, content: str | bytes) -> None:
        target = self._path(_b(dest))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_b(content))

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
        parts: list[str] = []
        for seg in _s(path).replace("\\", "/").split("/"):
            if seg in ("", "."):
                continue
            if seg == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(seg)
        return self.root.joinpath(*parts)

    def _write_rom(self) -> None:
        for name, source in ROM.items():
            target = self.root / "rom" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source)

    def _fs_size(self, path: bytes) -> int:
        target = self._path(path)
        return target.stat().st_size if target.is_file() else 0

    def _fs_list(self, path: bytes) -> Any:
        target = self._path(path)
        if not target.is_dir():
            return None
        return self.lua.table_from(sorted(p.name.encode() for p in target.iterdir()))

    def _fs_delete(self, path: bytes) -> None:
        target = self._path(path)
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()

    def _fs_copy(self, a: bytes, b: bytes) -> None:
        src, dst = self._path(a), self._path(b)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copyfile(src, dst)

    def _fs_read(self, path: bytes) -> bytes | None:
        target = self._path(path)
        return target.read_bytes() if target.is_file() else None

    def _fs_write(self, path: bytes, data: bytes, append: bool) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab" if append else "wb") as fh:
            fh.write(data)

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
        self.reactor.connectTCP(parts.hostname, parts.port or 80, factory, timeout=5)
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
