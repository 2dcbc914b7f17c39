"""
The client on CC:Tweaked's own core (``tests/harness/cctweaked.py``): the real ``lua/`` files
on the game's Lua VM, websockets, address rules and disk, against the real gateway on
loopback. What CraftOS-PC and the Lua harness cannot show is shown here.
"""

from __future__ import annotations

import re

import orjson
import treq
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.defer import Deferred
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.callers import asking
from tests.harness.cctweaked import CCTComputer, unavailable, wait_connected, wait_gone
from tests.harness.logcapture import LogCapture
from tests.harness.support import bounded, closed_port, reactor, start_gateway
from tests.lua.test_lua_e2e import OWN_STARTUP, TRAPOS_BOOT
from trapsandbox.errors import GatewayError
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.web import client

PASSWORD = "sesame-sesame-sesame"
ALL = "exec,eval,fs.read,fs.write,screen,input"


class CCTGatewayMixin:
    """A gateway on loopback (opencode down) and CC:Tweaked computers that reach it."""

    timeout = 180

    def setUp(self):
        reason = unavailable()
        if reason:
            raise SkipTest(reason)
        self.start_gateway(0)

    def start_gateway(self, port, **settings):
        settings.setdefault("opencode_url", f"http://127.0.0.1:{closed_port()}")
        self.gateway = start_gateway(
            self, ports=(f"tcp:{port}:interface=127.0.0.1",), password=PASSWORD, **settings
        )
        self.port = self.gateway.port

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sandbox(self):
        return self.gateway.sandbox

    def computer(self, allow=ALL, label="lab", **options) -> CCTComputer:
        """A computer with the client installed and set up, not booted."""
        c = CCTComputer(self, label=label, **options)
        c.install_client()
        c.set_settings(
            {
                "sandbox.url": f"ws://127.0.0.1:{self.port}/gateway",
                "sandbox.password": PASSWORD,
                "sandbox.allow": allow,
            }
        )
        return c

    async def started(self, c: CCTComputer, startup="shell.run('bg /servers/sandbox.lua')"):
        """``c`` booted with ``startup`` as its startup.lua, once its daemon is connected."""
        c.write_file("/startup.lua", startup)
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        return c

    def eval(self, c: CCTComputer, code: str, timeout_ms: int = 10_000):
        return self.sandbox.eval(asking(c.trapos_id), code, timeout_ms=timeout_ms)


async def mcp_call(testcase, port: int, tool: str, arguments: dict) -> dict:
    """One MCP ``tools/call`` on the gateway's /mcp (loopback: no token needed)."""
    pool = HTTPConnectionPool(reactor(), persistent=False)
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    call["params"] = {"name": tool, "arguments": arguments}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    response = await bounded(
        treq.post(
            f"http://127.0.0.1:{port}/mcp", data=orjson.dumps(call), headers=headers, pool=pool
        ),
        60,
    )
    result = orjson.loads(await bounded(treq.content(response)))["result"]
    return {"isError": result.get("isError", False), "text": result["content"][0]["text"]}


class InstallTests(CCTGatewayMixin, TestCase):
    async def test_the_installer_on_an_advanced_computer_with_default_settings(self):
        # As a player does: wget run from the gateway, the daemon in a multishell tab.
        c = CCTComputer(self, label="lab")
        c.write_file(
            "/startup.lua",
            f"shell.run('wget run {self.base}/client/install.lua {PASSWORD} --allow=all')\n"
            "os.pullEvent('trapos_sandbox_connected')\n"
            "shell.run('sandbox health')\n",
        )
        c.boot()
        await c.wait_for_screen("daemon started in a new tab")
        await wait_connected(self.gateway.registry, c.trapos_id)
        await c.wait_for_screen("sandboxOk: true")
        await c.wait_for_screen("opencodeOk: false")
        self.assertTrue(c.path("/startup/sandbox-daemon.lua").exists())


class StartTests(CCTGatewayMixin, TestCase):
    """SPEC §9's start paths besides the installer's: each one answers exec and screen."""

    async def check_answers(self, c: CCTComputer, banner=True):
        c.write_file("/hello.lua", "print('hello ' .. ...)")
        answer = await self.sandbox.execute(asking(c.trapos_id), "hello", ["world"])
        self.assertEqual((answer["exitCode"], answer["stdout"]), (0, "hello world\n"), answer)
        screen = await self.sandbox.screen(asking(c.trapos_id))
        self.assertEqual((screen["width"], screen["height"]), (51, 19))
        if banner:
            self.assertIn("CraftOS 1.9", "\n".join(screen["lines"]))

    async def test_the_players_own_startup_beside_a_shell(self):
        c = await self.started(self.computer(), OWN_STARTUP)
        await self.check_answers(c)

    async def test_libsandbox_names_its_module_and_line_and_checks_with_cc_expect(self):
        # The one-file build loads each module as @sandbox/NAME.lua: Cobalt numbers its lines,
        # and the ROM's cc.expect words the argument errors.
        c = await self.started(self.computer())
        wire = (client.lua_dir() / "sandbox" / "wire.lua").read_text().splitlines()
        line = wire.index("  local id = osLike.getComputerID()") + 1
        answer = await self.eval(
            c,
            "local lib = dofile('/apis/libsandbox.lua')\n"
            "local _, trace = xpcall(lib.traposId, debug.traceback, {})\n"
            "local _, checked = pcall(lib.computerRequest, '7:', 'm', 't', 'x')\n"
            "return trace, checked",
        )
        trace, checked = answer["returns"]
        self.assertIn(f"sandbox/wire.lua:{line}: attempt to call", trace)
        self.assertIn("bad argument #4 (table expected, got string)", checked)

    async def test_eval_sees_the_shell_and_multishell_as_a_program_does(self):
        # Neither is a global on CC:Tweaked: each program gets them in its environment.
        c = await self.started(self.computer())
        answer = await self.eval(c, "return type(shell.run), multishell.getCount()")
        self.assertEqual(answer["returns"], ['"function"', "2"], answer)

    async def test_a_trapos_like_autostart(self):
        c = await self.started(self.computer(), TRAPOS_BOOT)
        answer = await self.eval(c, "return 6 * 7")
        self.assertEqual(answer["returns"], ["42"])
        await self.check_answers(c, banner=False)

    async def test_a_basic_computer_through_its_installer(self):
        c = CCTComputer(self, label="lab", basic=True)
        c.write_file(
            "/startup.lua",
            f"shell.run('wget run {self.base}/client/install.lua {PASSWORD} --allow=all')\n",
        )
        c.boot()
        await c.wait_for_screen("Reboot to start the daemon")
        await c.shutdown()
        # Rebooted as the player would; the installer's entry starts the daemon.
        c.path("/startup.lua").unlink()
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        await self.check_answers(c)


class FullDiskTests(CCTGatewayMixin, TestCase):
    """
    CC:Tweaked enforces its 1,000,000-byte disk (CraftOS-PC does not): a write that does not
    fit is refused before anything is touched, and the file it would replace stays whole.
    """

    KEEP = bytes(range(256)) * 117  # 29,952 bytes

    async def nearly_full(self, free: int) -> CCTComputer:
        """A connected computer holding /keep.txt with ``free`` bytes left (about)."""
        c = self.computer()
        c.write_file("/keep.txt", self.KEEP)
        await self.started(c)
        now = (await self.eval(c, "return fs.getFreeSpace('/')"))["returns"][0]
        fill = int(now) - free - 500
        answer = await self.eval(
            c, f"local h = fs.open('/fill.bin', 'wb') h.write(('x'):rep({fill})) h.close()"
        )
        self.assertTrue(answer["ok"], answer)
        return c

    async def free(self, c: CCTComputer) -> int:
        return int((await self.eval(c, "return fs.getFreeSpace('/')"))["returns"][0])

    def assertUntouched(self, c: CCTComputer, free_before: int, free_after: int):
        self.assertEqual(c.read_file("/keep.txt"), self.KEEP)
        self.assertEqual(sorted(p.name for p in c.root.iterdir() if p.name.startswith(".keep")), [])
        self.assertEqual(free_after, free_before)

    async def test_a_write_too_large_for_the_disk_leaves_the_file_whole(self):
        c = await self.nearly_full(100_000)
        before = await self.free(c)
        # 200 KB: the first 64 KiB part would fit, the whole file does not.
        with self.assertRaises(GatewayError) as caught:
            await self.sandbox.write_file(asking(c.trapos_id), "/keep.txt", b"n" * 200_000)
        self.assertEqual(caught.exception.code, "fs_error")
        message = caught.exception.message
        self.assertIn("Out of space: writing /keep.txt needs 200000 bytes", message)
        self.assertIn("/keep.txt is unchanged", message)
        self.assertUntouched(c, before, await self.free(c))
        # What fits is still written, whole, over the old file.
        await self.sandbox.write_file(asking(c.trapos_id), "/keep.txt", b"m" * 90_000)
        self.assertEqual(c.read_file("/keep.txt"), b"m" * 90_000)

    async def test_the_agents_write_through_mcp_is_refused_with_the_reason(self):
        c = await self.nearly_full(100_000)
        before = await self.free(c)
        content = "a" * 150_000
        result = await mcp_call(
            self,
            self.port,
            "write_file",
            {"computer": c.trapos_id, "path": "/keep.txt", "content": content},
        )
        self.assertTrue(result["isError"], result)
        self.assertIn("Out of space", result["text"])
        self.assertIn("/keep.txt is unchanged", result["text"])
        self.assertUntouched(c, before, await self.free(c))

    async def test_a_restore_that_does_not_fit_changes_nothing(self):
        # Snapshotted with /a.bin; then /a.bin changed and /new.txt made. Bringing /a.bin
        # back needs its whole size beside the file it replaces: more than is free.
        c = await self.nearly_full(500_000)
        written = await self.eval(
            c, "local h = fs.open('/a.bin', 'wb') h.write(('1'):rep(400000)) h.close()"
        )
        self.assertTrue(written["ok"], written)
        snapshots = self.gateway.snapshots
        taken = await snapshots.take(asking(c.trapos_id, "local"))
        written = await self.eval(
            c, "local h = fs.open('/a.bin', 'wb') h.write(('2'):rep(400000)) h.close()"
        )
        self.assertTrue(written["ok"], written)
        c.write_file("/new.txt", "made after the snapshot")
        before = await self.free(c)
        with self.assertRaises(GatewayError) as caught:
            await snapshots.restore(asking(c.trapos_id, "local"), taken["id"])
        self.assertEqual(caught.exception.code, "fs_error")
        self.assertRegex(
            caught.exception.message,
            rf"^Out of space: restoring snapshot {taken['id']} needs \d+ bytes free on "
            rf"{c.trapos_id}, which has {before}: nothing was changed",
        )
        # Nothing deleted, nothing written.
        self.assertEqual(c.read_file("/new.txt"), b"made after the snapshot")
        self.assertEqual(c.read_file("/a.bin"), b"2" * 400_000)
        self.assertUntouched(c, before, await self.free(c))


def logged(testcase, pattern: str, seconds: float = 60):
    """Fires with the text of the first event the gateway logs that matches ``pattern``."""
    d = Deferred()

    def observe(event):
        text = formatEvent(event)
        if re.search(pattern, text) and not d.called:
            d.callback(text)

    globalLogPublisher.addObserver(observe)
    testcase.addCleanup(globalLogPublisher.removeObserver, observe)
    return bounded(d, seconds)


class Echo(WebSocketServerProtocol):
    def onMessage(self, payload, isBinary):
        self.sendMessage(payload, isBinary)


def echo_server(testcase) -> int:
    """A websocket echo server on loopback (a player's own chat, remote terminal...)."""
    factory = WebSocketServerFactory()
    factory.protocol = Echo
    port = reactor().listenTCP(0, factory, interface="127.0.0.1")
    testcase.addCleanup(port.stopListening)
    return port.getHost().port


# A player's program in its own tab with two sockets. (Not to the same URL: CC:Tweaked tells
# sockets apart by URL only, so each one's receive() would take the other's messages. The
# daemon's own URL carries a nonce per attempt for that reason.)
PLAYERS_SOCKETS = """
local url = ...
local one = assert(http.websocket(url .. 'one'))
local two = assert(http.websocket(url .. 'two'))
-- One at a time: a receive() discards other sockets' messages that come while it waits.
for i = 1, 3 do
  one.send('one ' .. i)
  local first = one.receive(30)
  two.send('two ' .. i)
  print('echo ' .. tostring(first) .. ' / ' .. tostring(two.receive(30)))
end
os.pullEvent('trapos_sandbox_connected')
one.send('after')
print('still open: ' .. tostring(one.receive(30)))
"""


class WebSocketTests(CCTGatewayMixin, TestCase):
    """The daemon shares the computer's websocket events with every program and tab."""

    async def test_a_players_own_websockets_beside_the_daemon(self):
        echo = f"ws://127.0.0.1:{echo_server(self)}/"
        c = self.computer()
        c.write_file("/chat.lua", PLAYERS_SOCKETS)
        # The daemon's tab first, then the player's program in another, while it connects.
        startup = f"shell.openTab('/servers/sandbox.lua')\nshell.run('/chat.lua', '{echo}')\n"
        await self.started(c, startup)
        await c.wait_for_screen("echo one 3 / two 3")
        # The daemon reconnects (a new socket of its own) while the player's stays open.
        self.gateway.registry.find(LOCAL_ACCOUNT, c.trapos_id).link.close(
            1000, "the test closes it"
        )
        await c.wait_for_screen("still open: after")
        await wait_connected(self.gateway.registry, c.trapos_id)
        self.assertNotIn("closed file", c.output)

    async def test_the_installer_kept_in_startup_starts_one_daemon(self):
        # A player who leaves the install line in startup.lua: from the second boot the
        # installer and its own /startup/sandbox-daemon.lua both start the daemon.
        c = CCTComputer(self, label="lab")
        c.write_file(
            "/startup.lua",
            f"shell.run('wget run {self.base}/client/install.lua {PASSWORD} --allow=all')\n",
        )
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        gone = wait_gone(self.gateway.registry, c.trapos_id)
        await c.shutdown()
        await gone
        c.boot()
        await c.wait_for_screen("daemon started in a new tab")
        first = await wait_connected(self.gateway.registry, c.trapos_id)
        c.write_file("/tabs.lua", "print(multishell.getCount() .. ' tabs')")
        answer = await self.sandbox.execute(asking(c.trapos_id), "tabs")
        self.assertEqual(answer["stdout"], "2 tabs\n")  # the shell and one daemon
        # One started by hand says so and leaves the running one alone.
        answer = await self.sandbox.execute(asking(c.trapos_id), "/servers/sandbox.lua")
        self.assertIn("sandbox daemon already running (ready", answer["stdout"])
        answer = await self.eval(c, "return 6 * 7")
        self.assertEqual(answer["returns"], ["42"])
        self.assertIs(self.gateway.registry.find(LOCAL_ACCOUNT, c.trapos_id), first)
        self.assertNotIn("closed file", c.output)

    async def test_a_socket_closed_without_a_close_frame_is_no_fault(self):
        # CC:Tweaked's close() sends no close frame: the gateway sees the connection drop.
        captured = LogCapture(self)
        c = await self.started(self.computer())
        c.write_file(
            "/stopper.lua", "os.queueEvent('go') os.pullEvent('go') traposSandboxSession.stop()"
        )
        disconnected = logged(self, f"{c.trapos_id} from .* disconnected")
        await self.eval(c, "shell.openTab('/stopper.lua')")
        self.assertIn("disconnected (1006 ", await disconnected)
        self.assertEqual(captured.errors(), [])


class GameRulesTests(CCTGatewayMixin, TestCase):
    """What CC:Tweaked enforces and CraftOS-PC (as we ran it) does not."""

    async def test_a_host_the_admin_has_not_allowed(self):
        # CC:Tweaked denies private and local addresses ($private) unless the server allows them.
        c = self.computer(allow_hosts=())
        startup = (
            f"shell.run('wget run {self.base}/client/install.lua')\n"
            "shell.run('bg /servers/sandbox.lua')\n"
            "repeat os.pullEvent() until traposSandboxState and traposSandboxState.lastError\n"
            "shell.run('/programs/sandbox.lua health')\n"
        )
        c.write_file("/startup.lua", startup)
        c.boot()
        # The installer cannot even be fetched: CraftOS's wget says so.
        await c.wait_for_screen("Domain not permitted")
        # A client installed by hand says what the admin must add.
        await c.wait_for_screen("sandbox health failed: not_connected")
        await c.wait_for_screen("Domain not permitted")
        await c.wait_for_screen(
            "The server admin must add, before the $private rule in "
            'serverconfig/computercraft-server.toml: [[http.rules]] host = "127.0.0.1" '
            'action = "allow"'
        )
        self.assertIsNone(self.gateway.registry.find(LOCAL_ACCOUNT, c.trapos_id))

    async def test_a_program_that_never_yields(self):
        c = await self.started(self.computer())
        answer = await self.eval(c, "while true do end", timeout_ms=30_000)
        self.assertFalse(answer["ok"], answer)
        self.assertIn("Too long without yielding", answer["error"])
        self.assertFalse(answer["timedOut"])
        # The daemon lives on.
        answer = await self.eval(c, "return 'alive'")
        self.assertEqual(answer["returns"], ['"alive"'])

    async def test_messages_stay_under_128_kib(self):
        # A larger frame either way closes the socket or fails to send ("Message is too large").
        c = await self.started(self.computer())
        c.write_file(
            "/loud.lua", "for i = 1, 4000 do print(('%04d '):format(i) .. ('y'):rep(95)) end"
        )
        answer = await self.sandbox.execute(asking(c.trapos_id), "loud", max_output_bytes=64 * 1024)
        self.assertEqual(answer["exitCode"], 0)
        self.assertTrue(answer["stdoutTruncated"])
        self.assertEqual(len(answer["stdout"].encode()), 64 * 1024)
        # The largest file a call takes (1 MiB) goes and comes back whole: base64 and JSON in
        # parts, each under the 7 s the computer may run without yielding.
        data = bytes((i * 7 + i // 251) % 256 for i in range(1024 * 1024 - 300_000))
        await self.sandbox.write_file(asking(c.trapos_id), "/data/blob.bin", data)
        back = await self.sandbox.read_file(asking(c.trapos_id), "/data/blob.bin")
        self.assertEqual(back["content"], data)
        self.assertEqual(c.read_file("/data/blob.bin"), data)
        self.assertIsNotNone(self.gateway.registry.find(LOCAL_ACCOUNT, c.trapos_id))

    async def test_a_snapshot_of_a_disk_full_of_small_files(self):
        c = self.computer()
        for i in range(1200):
            c.write_file(f"/notes/n{i:04d}.txt", f"note {i}\n")
        await self.started(c)
        taken = await self.gateway.snapshots.take(asking(c.trapos_id, "local"))
        self.assertEqual(taken["files"], 1204)  # and the client's four files
        answer = await self.eval(c, "return 'alive'")
        self.assertEqual(answer["returns"], ['"alive"'])

    async def test_a_flood_of_input_loses_none_of_the_daemons_events(self):
        # CC:Tweaked keeps 256 events and drops the rest: 250 keys typed at once all arrive,
        # and the daemon's own events (its socket's messages) still do.
        c = self.computer()
        c.write_file("/reader.lua", "local line = read() print('got ' .. #line .. ' keys')")
        await self.started(c, "shell.openTab('/servers/sandbox.lua')")
        events = [{"paste": "reader"}, {"key": "enter"}]
        events += [{"char": "abcdefghij"[i % 10]} for i in range(250)] + [{"key": "enter"}]
        answer = await self.sandbox.input(asking(c.trapos_id), events)
        self.assertEqual(answer["queued"], len(events))
        await c.wait_for_screen("got 250 keys")
        answer = await self.eval(c, "return 'alive'")
        self.assertEqual(answer["returns"], ['"alive"'])

    async def test_a_reconnect_after_the_gateway_restarts(self):
        c = await self.started(self.computer())
        port = self.port
        gone = wait_gone(self.gateway.registry, c.trapos_id)
        await self.gateway.service.stopService()
        await gone
        self.start_gateway(port)
        await wait_connected(self.gateway.registry, c.trapos_id, seconds=45)
        answer = await self.eval(c, "return 'back'")
        self.assertEqual(answer["returns"], ['"back"'])
