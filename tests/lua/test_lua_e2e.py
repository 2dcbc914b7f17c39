"""Full boot: the real lua/ files on the CraftOS harness against the real gateway on loopback."""

import base64
import os
import sys
from pathlib import Path

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from tests.harness.callers import asking
from tests.harness.craftos import Computer
from tests.harness.opencode import start_opencode
from tests.harness.processes import clean_env, spawn
from tests.harness.support import closed_port, start_gateway
from tests.unit.computers.test_settingsfile import SETTINGS_SPELLINGS
from trapsandbox.computers import hooks
from trapsandbox.errors import GatewayError
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.web import client

LUA = Path(__file__).resolve().parents[2] / "lua"
# Where the installer puts each file the gateway serves (client.read: the library built from
# its modules, the others as they are in lua/).
CLIENT_FILES = {
    "/apis/libsandbox.lua": "apis/libsandbox.lua",
    "/servers/sandbox.lua": "servers/sandbox.lua",
    "/programs/sandbox.lua": "programs/sandbox.lua",
}
PASSWORD = "sesame"
CTL = os.path.join(os.path.dirname(sys.executable), "trapsandbox-ctl")


class GatewayMixin:
    timeout = 60

    def setUp(self):
        self.opencode_url = f"http://127.0.0.1:{closed_port()}"
        self.start_gateway(0)

    def start_gateway(self, port, **settings):
        settings.setdefault("opencode_url", self.opencode_url)
        self.gateway = start_gateway(
            self, ports=(f"tcp:{port}:interface=127.0.0.1",), password=PASSWORD, **settings
        )
        self.port = self.gateway.port

    @property
    def url(self):
        return f"ws://127.0.0.1:{self.port}/gateway"

    def computer(self, id=7, label=None, password=PASSWORD, url=None, install=True):
        c = Computer(self.mktemp(), id=id, label=label)
        self.addCleanup(c.shutdown)
        if install:
            for dest, source in CLIENT_FILES.items():
                c.write_file(dest, client.read(source))
        c.set_settings({"sandbox.url": url or self.url, "sandbox.password": password})
        return c

    def ctl(self, *args):
        """``trapsandbox-ctl ARGS`` against this gateway (a real process)."""
        return spawn(self, [CTL, *args], clean_env(TRAPSANDBOX_URL=f"http://127.0.0.1:{self.port}"))

    @defer.inlineCallbacks
    def start_daemon(self, c, wait=True):
        c.run("/servers/sandbox.lua")
        if wait:
            yield c.wait_for_lua("traposSandboxState and traposSandboxState.connected")


class EndToEndTests(GatewayMixin, TestCase):
    @defer.inlineCallbacks
    def test_health_with_opencode_down(self):
        c = self.computer()
        yield self.start_daemon(c)
        proc = c.run("/programs/sandbox.lua health")
        yield proc.done
        self.assertIn("sandboxOk: true\n", c.output)
        self.assertIn("opencodeOk: false\n", c.output)
        self.assertIn("opencode: ", c.output)
        self.assertEqual(c.violations, [])

    @defer.inlineCallbacks
    def test_wrong_password_is_terminal(self):
        c = self.computer(password="wrong")
        yield self.start_daemon(c, wait=False)
        yield c.wait_for_lua("traposSandboxState and traposSandboxState.state == 'stopped'")
        proc = c.run("/programs/sandbox.lua health")
        yield proc.done
        self.assertIn("sandbox health failed: unauthorized", c.output)
        attempts = c.eval("return traposSandboxSession.status().attempts")
        self.assertEqual(attempts, 1)
        self.assertEqual(c.open_websockets, 0)
        proc = c.run("/programs/sandbox.lua status")
        yield proc.done
        self.assertIn("connected: false", c.output)
        self.assertIn("last error: unauthorized", c.output)

    @defer.inlineCallbacks
    def test_no_url_answers_at_once(self):
        c = self.computer(install=True)
        c.set_settings({"sandbox.url": None})
        start = reactor.seconds()
        proc = c.run("/programs/sandbox.lua health")
        yield proc.done
        self.assertIn("set sandbox.url first", c.output)
        self.assertLess(reactor.seconds() - start, 1.0)
        daemon = c.run("/servers/sandbox.lua")
        yield daemon.done
        self.assertIn("sandbox daemon inactive: sandbox.url not set", c.output)

    @defer.inlineCallbacks
    def test_reconnects_after_the_gateway_restarts(self):
        c = self.computer(label="rc")
        yield self.start_daemon(c)
        port = self.port
        yield self.gateway.service.stopService()
        yield c.wait_for_lua("not traposSandboxState.connected")
        proc = c.run("/programs/sandbox.lua health")
        yield proc.done
        self.assertIn("sandbox health failed: not_connected", c.output)
        self.start_gateway(port)
        yield c.wait_for_lua("traposSandboxState.connected", timeout=15)
        proc = c.run("/programs/sandbox.lua health")
        yield proc.done
        self.assertIn("sandboxOk: true", c.output)

    @defer.inlineCallbacks
    def test_gateway_ping_is_answered(self):
        c = self.computer(label="pinged")
        yield self.start_daemon(c)
        response = yield self.gateway.registry.request(asking("7:pinged"), "ping", {}, timeout=5)
        self.assertTrue(response.ok)
        self.assertEqual(response.payload, {"traposId": "7:pinged"})
        other = yield self.gateway.registry.request(asking("7:pinged"), "reboot", {}, timeout=5)
        self.assertFalse(other.ok)
        self.assertEqual(other.error.code, "unknown_type")

    @defer.inlineCallbacks
    def test_status_when_connected(self):
        c = self.computer(id=3, label="st")
        yield self.start_daemon(c)
        proc = c.run("/programs/sandbox.lua status")
        yield proc.done
        self.assertIn("connected: true", c.output)
        self.assertIn("traposId: 3:st", c.output)
        self.assertIn("gateway: " + self.url, c.output)

    @defer.inlineCallbacks
    def test_newest_wins_stops_the_older_daemon(self):
        older = self.computer(id=4)
        yield self.start_daemon(older)
        newer = self.computer(id=4)
        yield self.start_daemon(newer)
        yield older.wait_for_lua("traposSandboxState.state == 'stopped'")
        self.assertEqual(older.eval("return traposSandboxState.lastError.code"), b"replaced")
        proc = newer.run("/programs/sandbox.lua health")
        yield proc.done
        self.assertIn("sandboxOk: true", newer.output)

    @defer.inlineCallbacks
    def test_installer_sets_up_a_plain_craftos_computer(self):
        """wget run of the gateway's installer gives a computer that passes sandbox health."""
        c = self.computer(install=False)
        c.set_settings({"sandbox.url": None, "sandbox.password": None})
        base = f"http://127.0.0.1:{self.port}"
        proc = c.run(f"wget run {base}/client/install.lua {PASSWORD} --allow=exec,fs.read")
        ok, err = yield proc.done
        self.assertTrue(ok, err)
        self.assertIn("startup entry: /startup/sandbox-daemon.lua", c.output)
        self.assertIn(
            "note: exec, eval and input (running programs and Lua, typing on the computer) give "
            "the agent",
            c.output,
        )
        self.assertEqual(c.get_setting("sandbox.url"), self.url.encode())
        self.assertEqual(c.get_setting("sandbox.password"), PASSWORD.encode())
        self.assertEqual(c.get_setting("sandbox.allow"), b"exec,fs.read")
        for dest, source in CLIENT_FILES.items():
            self.assertEqual(c.read_file(dest), client.read(source))
        # Reboot: startup starts the daemon, and `sandbox` is an alias.
        yield c.shutdown()
        rebooted = Computer(c.root, id=7)
        self.addCleanup(rebooted.shutdown)
        yield rebooted.boot().done
        yield rebooted.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        proc = rebooted.run("sandbox health")
        yield proc.done
        self.assertIn("sandboxOk: true", rebooted.output)

    @defer.inlineCallbacks
    def test_installer_asks_for_consent(self):
        """Without --allow the installer asks once; Enter (no) allows nothing, y allows all."""
        base = f"http://127.0.0.1:{self.port}"
        for id, answer, expected in (
            (8, "", b""),
            (9, "y", b"exec,eval,fs.read,fs.write,screen,input,peripheral"),
        ):
            c = self.computer(id=id, install=False)
            c.set_settings({"sandbox.url": None, "sandbox.password": None})
            proc = c.run(f"wget run {base}/client/install.lua {PASSWORD}")
            yield c.wait_for_output("[y/N] ")
            # The question says what exec and eval give away, before the answer.
            self.assertIn(
                "see the screen, type on this computer and use its peripherals? Note: exec, "
                "eval and input (running programs and Lua, typing on the computer) give the "
                "agent the whole computer, including its sandbox password. [y/N]",
                c.output,
            )
            c.type_line(answer)
            ok, err = yield proc.done
            self.assertTrue(ok, err)
            self.assertEqual(c.get_setting("sandbox.allow"), expected)


class RealOpencodeEndToEndTests(GatewayMixin, TestCase):
    async def test_health_with_opencode_up(self):
        self.opencode_url = await start_opencode(self, "oc-e2e")
        self.start_gateway(0, opencode_password="oc-e2e")
        c = self.computer(label="oc")
        await self.start_daemon(c)
        proc = c.run("/programs/sandbox.lua health")
        await proc.done
        self.assertIn("sandboxOk: true\n", c.output)
        self.assertIn("opencodeOk: true\n", c.output)
        self.assertNotIn("opencode: ", c.output)


class SandboxEndToEndTests(GatewayMixin, TestCase):
    """The §9 requests answered by the real client files on the harness."""

    @defer.inlineCallbacks
    def ready(self, allow="exec,eval,fs.read,fs.write,screen", label="sb"):
        c = self.computer(label=label)
        if allow is not None:
            c.set_settings({"sandbox.allow": allow})
        yield self.start_daemon(c)
        return c

    def ask(self, c, type, payload):
        return self.gateway.registry.request(asking(f"7:{c.label}"), type, payload, timeout=10)

    @defer.inlineCallbacks
    def test_files_round_trip(self):
        c = yield self.ready()
        data = bytes(range(256)) * 200
        answer = yield self.ask(
            c,
            "write_file",
            {
                "path": "/data/blob.bin",
                "content": base64.b64encode(data).decode(),
                "encoding": "base64",
            },
        )
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(answer.payload, {"bytesWritten": len(data), "sizeBytes": len(data)})
        self.assertEqual(c.read_file("/data/blob.bin"), data)
        answer = yield self.ask(
            c, "read_file", {"path": "data/blob.bin", "offset": 1000, "length": 5000}
        )
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(base64.b64decode(answer.payload["content"]), data[1000:6000])
        self.assertEqual(answer.payload["sizeBytes"], len(data))
        answer = yield self.ask(c, "list_files", {"path": "/data"})
        self.assertEqual(
            answer.payload,
            {
                "path": "/data",
                "entries": [
                    {"name": "blob.bin", "type": "file", "size": len(data), "readOnly": False}
                ],
            },
        )
        # The gateway refuses a write to /rom as CraftOS would, before sending it.
        refused = yield self.assertFailure(
            self.ask(c, "write_file", {"path": "/rom/x", "content": "", "encoding": "base64"}),
            GatewayError,
        )
        self.assertEqual(refused.code, "fs_error")
        self.assertIn("Access denied", refused.message)
        answer = yield self.ask(c, "delete_file", {"path": "/data/blob.bin"})
        self.assertEqual(answer.payload, {"deleted": True})
        self.assertIsNone(c.read_file("/data/blob.bin"))
        self.assertEqual(c.violations, [])

    @defer.inlineCallbacks
    def test_a_file_of_many_parts_as_binary_messages_and_as_base64_on_craftos_pc(self):
        data = os.urandom(300_000)  # three binary parts, five base64 ones
        for host, binary in [(None, True), ("ComputerCraft 1.109.2 (CraftOS-PC v2.8.3)", False)]:
            trapos_id = "8:parts" if binary else "9:parts"
            c = self.computer(id=int(trapos_id[0]), label="parts")
            c.set_settings({"sandbox.allow": "fs.read,fs.write"})
            if host is not None:
                c.eval(f"_HOST = '{host}'")
            yield self.start_daemon(c)
            session = self.gateway.registry.find(LOCAL_ACCOUNT, trapos_id)
            self.assertEqual("binary_parts" in session.features, binary)
            caller = asking(trapos_id)
            written = yield self.gateway.sandbox.write_file(caller, "/big.bin", data)
            self.assertEqual(written, {"bytesWritten": len(data), "sizeBytes": len(data)})
            self.assertEqual(c.read_file("/big.bin"), data)
            read = yield self.gateway.sandbox.read_file(caller, "big.bin", 7)
            self.assertEqual(read["content"], data[7:])
            self.assertEqual(c.eval("return #fs.find('.big.bin*')"), 0, "no part file left")
            self.assertEqual(c.violations, [])

    @defer.inlineCallbacks
    def test_eval_and_a_quiet_exec(self):
        c = yield self.ready()
        answer = yield self.ask(c, "eval", {"code": "1 + 1"})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(answer.payload["returns"], ["2"])
        self.assertIs(answer.payload["ok"], True)
        c.write_file("/quiet.lua", "sleep(0.1) _G.quietRan = (...)")
        answer = yield self.ask(c, "exec", {"command": "quiet", "args": ["yes"]})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual((answer.payload["exitCode"], answer.payload["timedOut"]), (0, False))
        self.assertEqual(c.eval("return quietRan"), b"yes")
        ping = yield self.ask(c, "ping", {})
        self.assertTrue(ping.ok)

    @defer.inlineCallbacks
    def test_nothing_allowed_is_forbidden_until_sandbox_allow(self):
        c = yield self.ready(allow=None)
        # The gateway refuses without sending anything...
        failure = yield self.assertFailure(self.ask(c, "eval", {"code": "1"}), GatewayError)
        self.assertEqual(failure.code, "forbidden")
        self.assertIn('run "sandbox allow eval"', failure.message)
        # ... and so does the computer, should the gateway believe otherwise.
        session = self.gateway.registry.find(LOCAL_ACCOUNT, "7:sb")
        session.capabilities = frozenset({"eval"})
        answer = yield self.ask(c, "eval", {"code": "1"})
        self.assertEqual((answer.ok, answer.error.code), (False, "forbidden"))
        self.assertIn('run "sandbox allow eval"', answer.error.message)
        session.capabilities = frozenset()
        proc = c.run("/programs/sandbox.lua allow eval")
        yield proc.done
        self.assertIn(
            "allowed: eval\nnote: exec, eval and input (running programs and Lua, typing on the "
            "computer) give the agent the "
            "whole computer, including its sandbox password\n",
            c.output,
        )
        self.assertEqual(c.get_setting("sandbox.allow"), b"eval")
        yield c.wait_for_lua("traposSandboxState.capabilities[1] == 'eval'")
        # Frames are handled in order: once a ping is answered, so is the announcement.
        yield self.ask(c, "ping", {})
        self.assertEqual(session.capabilities, {"eval"})
        answer = yield self.ask(c, "eval", {"code": "1"})
        self.assertTrue(answer.ok, answer.error)
        proc = c.run("/programs/sandbox.lua status")
        yield proc.done
        self.assertIn("allowed: eval", c.output)
        proc = c.run("/programs/sandbox.lua deny bogus")
        yield proc.done
        self.assertIn("unknown capability bogus", c.output)

    @defer.inlineCallbacks
    def test_screen_reads_the_whole_screen_of_a_daemon_started_from_the_shell(self):
        c = yield self.ready()
        answer = yield self.ask(c, "screen", {})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(answer.payload["lines"], c.screen_lines())
        self.assertIn("sandbox daemon 0.1.0: connecting to", "\n".join(answer.payload["lines"]))


# The daemon started from a shell whose terminal is a wrapper drawing through a metatable, as
# screen recorders, multiplexers and trapos write them (issue 25). `...` picks what the wrapper
# stands on: the terminal it was started with ('term'), or a window over it (a readable
# screen); 'none' runs the daemon without a wrapper.
WRAPPED_DAEMON = """
local over = ...
local parent = term.current()
_G.wrapperWrites = 0
if over == 'none' then return shell.run('/servers/sandbox.lua') end
if over == 'window' then
  local width, height = parent.getSize()
  parent = window.create(parent, 1, 1, width, height, true)
end
local wrapper = setmetatable({
  write = function(text) _G.wrapperWrites = _G.wrapperWrites + 1 return parent.write(text) end,
  blit = function(...) return parent.blit(...) end,
}, { __index = parent })
term.redirect(wrapper)
if over == 'window' then _G.traposSandboxScreen = wrapper end
shell.run('/servers/sandbox.lua')
"""


class WrappedTerminalTests(GatewayMixin, TestCase):
    """exec, eval and screen on a computer whose terminal is a metatable-backed wrapper."""

    @defer.inlineCallbacks
    def ready(self, over):
        c = self.computer(label="wr")
        c.set_settings({"sandbox.allow": "exec,eval,screen"})
        c.write_file("/wrapped.lua", WRAPPED_DAEMON)
        c.write_file("/hi.lua", "print('hi from agent')\nprintError('and a warning')")
        c.run(f"/wrapped.lua {over}")
        yield c.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        return c

    def ask(self, type, payload):
        return self.gateway.registry.request(asking("7:wr"), type, payload, timeout=10)

    @defer.inlineCallbacks
    def check_exec_and_eval(self, c, wrapped=True):
        answer = yield self.ask("exec", {"command": "hi"})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(answer.payload["exitCode"], 0, answer.payload)
        self.assertEqual(answer.payload["stdout"], "hi from agent\n")
        self.assertEqual(answer.payload["stderr"], "and a warning\n")
        answer = yield self.ask("eval", {"code": "print('evaluated') return term.isColour()"})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual((answer.payload["ok"], answer.payload["returns"]), (True, ["true"]))
        self.assertEqual(answer.payload["stdout"], "evaluated\n")
        # Drawn through the wrapper, where the player looks.
        self.assertEqual(c.eval("return wrapperWrites") > 0, wrapped)

    @defer.inlineCallbacks
    def test_exec_and_eval_under_a_wrapper_of_the_shells_terminal(self):
        c = yield self.ready("term")
        yield self.check_exec_and_eval(c)
        self.assertIn("hi from agent", "\n".join(c.screen_lines()))

    @defer.inlineCallbacks
    def test_exec_eval_and_screen_under_a_wrapper_of_a_window(self):
        c = yield self.ready("window")
        yield self.check_exec_and_eval(c)
        answer = yield self.ask("screen", {})
        self.assertTrue(answer.ok, answer.error)
        lines = [line.rstrip() for line in answer.payload["lines"]]
        self.assertIn("hi from agent", lines)
        self.assertIn("evaluated", lines)

    @defer.inlineCallbacks
    def test_exec_and_eval_on_the_native_terminal(self):
        c = yield self.ready("none")
        yield self.check_exec_and_eval(c, wrapped=False)
        self.assertIn("hi from agent", "\n".join(c.screen_lines()))


class SettingsFileTests(GatewayMixin, TestCase):
    """The computer refuses file requests on /.settings itself (the gateway's path rule is
    switched off here, so the requests reach it in every spelling)."""

    @defer.inlineCallbacks
    def test_file_requests_on_the_settings_file_are_forbidden_on_the_computer(self):
        self.patch(hooks, "request_paths", lambda kind, payload: payload)
        c = self.computer(label="st")
        c.set_settings({"sandbox.allow": "fs.read,fs.write"})
        yield self.start_daemon(c)
        saved = c.read_file("/.settings")
        self.assertIn(PASSWORD.encode(), saved)
        empty = base64.b64encode(b"stolen").decode()
        requests = {
            "read_file": {},
            "list_files": {},
            "write_file": {"content": empty, "encoding": "base64"},
            "delete_file": {},
        }
        for path, cwd in SETTINGS_SPELLINGS:
            for kind, extra in requests.items():
                payload = {"path": path, **extra}
                if cwd is not None:
                    payload["cwd"] = cwd
                answer = yield self.gateway.registry.request(
                    asking("7:st"), kind, payload, timeout=10
                )
                self.assertEqual(
                    (answer.ok, answer.error and answer.error.code),
                    (False, "forbidden"),
                    (kind, payload, answer.payload),
                )
                self.assertIn("sandbox password", answer.error.message)
                self.assertNotIn(PASSWORD, answer.error.message)
        self.assertEqual(c.read_file("/.settings"), saved)
        # No part file or folder was left behind.
        self.assertEqual(c.eval("return #fs.find('.settings*') + #fs.find('..settings*')"), 1)
        # Other files, and the listing of / (which names .settings), still work.
        answer = yield self.gateway.registry.request(
            asking("7:st"),
            "write_file",
            {"path": "/notes.txt", "content": empty, "encoding": "base64"},
        )
        self.assertTrue(answer.ok, answer.error)
        answer = yield self.gateway.registry.request(
            asking("7:st"), "read_file", {"path": "notes.txt"}
        )
        self.assertEqual(base64.b64decode(answer.payload["content"]), b"stolen")
        answer = yield self.gateway.registry.request(asking("7:st"), "list_files", {"path": "/"})
        self.assertIn(".settings", [entry["name"] for entry in answer.payload["entries"]])
        answer = yield self.gateway.registry.request(
            asking("7:st"), "delete_file", {"path": "/notes.txt"}
        )
        self.assertEqual(answer.payload, {"deleted": True})


# A trapos-style boot event loop (register / setTimeout, no registerAny): trapos's autostart
# runs /servers/sandbox.lua, which registers its handlers and returns.
TRAPOS_BOOT = """
local handlers, timers = {}, {}
_G.bootEventLoop = {
  register = function(event, fn)
    handlers[event] = handlers[event] or {}
    local entry = { fn = fn }
    table.insert(handlers[event], entry)
    return function()
      for i, e in ipairs(handlers[event]) do
        if e == entry then table.remove(handlers[event], i) return end
      end
    end
  end,
  setTimeout = function(fn, seconds)
    local id = os.startTimer(seconds)
    timers[id] = fn
    return function() if timers[id] then timers[id] = nil os.cancelTimer(id) end end
  end,
}
shell.run('/servers/sandbox.lua')
while true do
  local e = table.pack(os.pullEventRaw())
  if e[1] == 'timer' and timers[e[2]] then local fn = timers[e[2]] timers[e[2]] = nil fn() end
  local list = {}
  for i, entry in ipairs(handlers[e[1]] or {}) do list[i] = entry end
  for _, entry in ipairs(list) do entry.fn(table.unpack(e, 2, e.n)) end
end
"""

# The owner's own startup: the daemon beside a shell, without the installer's startup file.
OWN_STARTUP = """
parallel.waitForAny(
  function() shell.run('/servers/sandbox.lua') end,
  function() shell.run('/rom/programs/shell.lua') end
)
"""

ASKER = "print('name?')\nlocal name = read()\nprint('hello ' .. name)\n"


class ScreenAndInputTests(GatewayMixin, TestCase):
    """SPEC §9's screen however the daemon started, and §14's screen_watch and input."""

    def ask(self, type, payload, **kwargs):
        return self.gateway.registry.request(asking("7:si"), type, payload, timeout=10, **kwargs)

    def watch(self, payload):
        """A screen_watch: its Deferred, its frames, and until(predicate) -> a Deferred that
        fires once a frame makes predicate() true."""
        frames, waiters = [], []

        def on_partial(frame):
            frames.append(frame)
            for entry in list(waiters):
                if entry[0]():
                    waiters.remove(entry)
                    entry[1].callback(None)

        def until(predicate):
            d = defer.Deferred()
            if predicate():
                d.callback(None)
            else:
                waiters.append((predicate, d))
                d.addTimeout(10, reactor)
            return d

        d = self.ask("screen_watch", payload, on_partial=on_partial)
        d.addErrback(lambda f: f.trap(defer.CancelledError))
        return d, frames, until

    def computer(self, **kwargs):
        c = super().computer(label="si", **kwargs)
        c.set_settings({"sandbox.allow": "exec,screen,input"})
        return c

    @defer.inlineCallbacks
    def check_screen(self, c):
        yield c.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        answer = yield self.ask("screen", {})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(answer.payload["lines"], c.screen_lines())
        return answer.payload

    @defer.inlineCallbacks
    def test_screen_when_started_by_the_installers_startup_file(self):
        c = self.computer(install=False)
        c.set_settings({"sandbox.url": None, "sandbox.password": None})
        base = f"http://127.0.0.1:{self.port}"
        ok, err = yield c.run(f"wget run {base}/client/install.lua {PASSWORD} --allow=screen").done
        self.assertTrue(ok, err)
        yield c.shutdown()
        rebooted = Computer(c.root, id=7, label="si")
        self.addCleanup(rebooted.shutdown)
        rebooted.boot()
        yield self.check_screen(rebooted)

    @defer.inlineCallbacks
    def test_screen_when_started_by_a_trapos_style_boot_loop(self):
        c = self.computer()
        c.run_lua(TRAPOS_BOOT, "trapos")
        payload = yield self.check_screen(c)
        self.assertIn("sandbox daemon 0.1.0: connecting to", "\n".join(payload["lines"]))

    @defer.inlineCallbacks
    def test_screen_when_started_beside_a_shell_from_the_owners_startup(self):
        c = self.computer()
        c.write_file("/startup.lua", OWN_STARTUP)
        c.boot()
        payload = yield self.check_screen(c)
        # The shell's prompt, drawn beside the daemon.
        self.assertIn(">", [line.rstrip() for line in payload["lines"]])
        # Two daemons (or a reload) keep the one recorder.
        again = (
            "return traposSandboxRecorder == dofile('/apis/libsandbox.lua').installRecorder(term)"
        )
        self.assertEqual(c.eval(again), True)

    @defer.inlineCallbacks
    def test_input_drives_a_program_waiting_in_read_and_screen_watch_shows_it(self):
        c = self.computer()
        c.write_file("/asker.lua", ASKER)
        c.run("/servers/sandbox.lua")
        yield c.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        watch, frames, until = self.watch({"maxFps": 20})
        yield until(lambda: len(frames) == 1)
        self.assertEqual(len(frames[0]["rows"]), 19)
        self.assertEqual(len(frames[0]["palette"]), 16)
        run = self.ask("exec", {"command": "asker"})
        yield c.wait_for_output("name?")
        events = [{"char": ch} for ch in "Ada"] + [{"key": "enter"}]
        answer = yield self.ask("input", {"events": events})
        self.assertTrue(answer.ok, answer.error)
        self.assertEqual(answer.payload, {"queued": 4})
        answer = yield run
        self.assertEqual(answer.payload["stdout"], "name?\nAda\nhello Ada\n")
        yield until(
            lambda: any(
                row["line"].startswith("hello Ada") for f in frames for row in f["rows"].values()
            )
        )
        # Idle: once the last frame is out no timer is armed on the computer, so nothing can be
        # sent; a round trip through the daemon sends no frame either.
        yield c.wait_for(lambda: not c._timers, what="no timer armed")
        count = len(frames)
        yield self.ask("ping", {})
        yield self.ask("ping", {})
        self.assertEqual(len(frames), count)
        self.assertEqual(c.eval("return traposSandboxSession.status().watches"), 1)
        # Cancelling the request cancels the watch on the computer.
        watch.cancel()
        yield c.wait_for_lua("traposSandboxSession.status().watches == 0")
        self.assertEqual(c.violations, [])

    @defer.inlineCallbacks
    def test_a_terminate_typed_by_input_stops_the_program_not_the_daemon(self):
        c = self.computer()
        c.write_file("/asker.lua", ASKER)
        c.run("/servers/sandbox.lua")
        yield c.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        run = self.ask("exec", {"command": "asker"})
        yield c.wait_for_output("name?")
        answer = yield self.ask("input", {"events": [{"terminate": True}]})
        self.assertEqual(answer.payload, {"queued": 1})
        answer = yield run
        self.assertEqual(answer.payload["exitCode"], 1)
        self.assertIn("Terminated", answer.payload["stderr"])
        ping = yield self.ask("ping", {})
        self.assertTrue(ping.ok)
