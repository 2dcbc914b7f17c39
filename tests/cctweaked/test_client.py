"""
The client on CC:Tweaked's own core (``tests/harness/cctweaked.py``): the real ``lua/`` files
on the game's Lua VM, websockets, address rules and disk, against the real gateway on
loopback. What CraftOS-PC and the Lua harness cannot show is shown here.
"""

from __future__ import annotations

import orjson
import treq
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.cctweaked import CCTComputer, unavailable, wait_connected
from tests.harness.support import bounded, closed_port, reactor, start_gateway
from tests.lua.test_lua_e2e import OWN_STARTUP, TRAPOS_BOOT
from trapsandbox.computers.wire import GatewayError

PASSWORD = "sesame-sesame-sesame"
ALL = "exec,eval,fs.read,fs.write,screen,input"


class CCTGatewayMixin:
    """A gateway on loopback (opencode down) and CC:Tweaked computers that reach it."""

    timeout = 120

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

    async def eval(self, c: CCTComputer, code: str, timeout_ms: int = 10_000):
        answer = await self.sandbox.eval(c.trapos_id, code, timeout_ms=timeout_ms)
        return answer


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
        answer = await self.sandbox.execute(c.trapos_id, "hello", ["world"])
        self.assertEqual((answer["exitCode"], answer["stdout"]), (0, "hello world\n"), answer)
        screen = await self.sandbox.screen(c.trapos_id)
        self.assertEqual((screen["width"], screen["height"]), (51, 19))
        if banner:
            self.assertIn("CraftOS 1.9", "\n".join(screen["lines"]))

    async def test_the_players_own_startup_beside_a_shell(self):
        c = await self.started(self.computer(), OWN_STARTUP)
        await self.check_answers(c)

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
            await self.sandbox.write_file(c.trapos_id, "/keep.txt", b"n" * 200_000)
        self.assertEqual(caught.exception.code, "fs_error")
        message = caught.exception.message
        self.assertIn("Out of space: writing /keep.txt needs 200000 bytes", message)
        self.assertIn("/keep.txt is unchanged", message)
        self.assertUntouched(c, before, await self.free(c))
        # What fits is still written, whole, over the old file.
        await self.sandbox.write_file(c.trapos_id, "/keep.txt", b"m" * 90_000)
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
        taken = await snapshots.take("local", c.trapos_id)
        written = await self.eval(
            c, "local h = fs.open('/a.bin', 'wb') h.write(('2'):rep(400000)) h.close()"
        )
        self.assertTrue(written["ok"], written)
        c.write_file("/new.txt", "made after the snapshot")
        before = await self.free(c)
        with self.assertRaises(GatewayError) as caught:
            await snapshots.restore("local", c.trapos_id, taken["id"])
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
