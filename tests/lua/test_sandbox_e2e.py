"""
The computer as a sandbox from an operator's seat: ``trapsandbox-ctl`` (a real process)
against the real gateway, the real Lua client running on the CraftOS harness.
"""

import os

from twisted.trial.unittest import TestCase

from tests.harness.craftos import Computer
from tests.harness.processes import clean_env, spawn
from tests.lua.test_lua_e2e import CTL, PASSWORD, GatewayMixin

ALL = "exec,eval,fs.read,fs.write,screen"


class OperatorTests(GatewayMixin, TestCase):
    async def ready(self, allow=ALL, label="sb"):
        c = self.computer(label=label)
        c.set_settings({"sandbox.allow": allow})
        await self.start_daemon(c)
        return c

    async def test_exec_streams_a_real_program_and_exits_with_its_code(self):
        c = await self.ready()
        c.write_file(
            "/count.lua",
            "local n = tonumber((...))\n"
            "for i = 1, n do print('line ' .. i) sleep(0.05) end\n"
            "printError('done counting')\n"
            "error('and then it fails', 0)\n",
        )
        child = self.ctl("exec", "7:sb", "--", "count", "3")
        # Streamed: the first line arrives while the program still runs.
        await child.wait_for("line 1\n")
        self.assertEqual(await child.wait_ended(20), 1, child.output)
        for expected in ("line 1\nline 2\nline 3\n", "done counting", "and then it fails"):
            self.assertIn(expected, child.output)
        self.assertEqual(child.output.count("line 2"), 1)
        # The player saw it too.
        self.assertIn("line 3", c.output)
        self.assertEqual(c.violations, [])

    async def test_a_ping_is_answered_while_a_program_sleeps(self):
        c = await self.ready()
        c.write_file("/nap.lua", "print('napping') sleep(10) print('woke')")
        child = self.ctl("exec", "7:sb", "--timeout", "20", "--", "nap")
        await child.wait_for("napping\n")
        ping = self.ctl("ping", "7:sb", "--timeout", "2")
        self.assertEqual(await ping.wait_ended(5), 0, ping.output)
        self.assertRegex(ping.output, r"answered ping in \d+ ms")
        self.assertFalse(child.ended, child.output)
        child.signal("TERM")
        await child.wait_ended(5)

    async def test_put_and_get_300_kb_back_identical(self):
        await self.ready()
        data = bytes((i * 31 + i // 256) % 256 for i in range(300_000))
        local = os.path.abspath(self.mktemp())
        with open(local, "wb") as f:
            f.write(data)
        put = self.ctl("put", "7:sb", local, "/data/big.bin")
        self.assertEqual(await put.wait_ended(30), 0, put.output)
        self.assertIn("(300000 bytes)", put.output)
        back = os.path.abspath(self.mktemp())
        get = self.ctl("get", "7:sb", "/data/big.bin", back)
        self.assertEqual(await get.wait_ended(30), 0, get.output)
        with open(back, "rb") as f:
            self.assertEqual(f.read(), data)
        ls = self.ctl("ls", "7:sb", "/data")
        self.assertEqual(await ls.wait_ended(10), 0, ls.output)
        self.assertIn("300000  big.bin", ls.output)
        rm = self.ctl("rm", "7:sb", "/data/big.bin")
        self.assertEqual(await rm.wait_ended(10), 0, rm.output)

    async def test_nothing_allowed_nothing_touched(self):
        c = await self.ready(allow="")
        c.write_file("/secret.txt", "mine")
        for args in (("exec", "7:sb", "--", "ls"), ("cat", "7:sb", "/secret.txt")):
            child = self.ctl(*args)
            self.assertEqual(await child.wait_ended(10), 1, child.output)
            self.assertIn("forbidden", child.output)
            self.assertIn('run "sandbox allow', child.output)
        self.assertEqual(c.read_file("/secret.txt"), b"mine")


class ScreenTests(GatewayMixin, TestCase):
    async def test_screen_after_print_on_an_installed_computer(self):
        c = self.computer(install=False)
        c.set_settings({"sandbox.url": None, "sandbox.password": None})
        base = f"http://127.0.0.1:{self.port}"
        ok, err = await c.run(f"wget run {base}/client/install.lua {PASSWORD} --allow=all").done
        self.assertTrue(ok, err)
        await c.shutdown()
        # Rebooted as the player would: the startup file keeps a readable screen.
        rebooted = Computer(c.root, id=7)
        self.addCleanup(rebooted.shutdown)
        await rebooted.boot().done
        await rebooted.wait_for_lua("traposSandboxState and traposSandboxState.connected")
        rebooted.write_file("/hello.lua", "print('hello from the agent')")
        env = clean_env(TRAPSANDBOX_URL=f"http://127.0.0.1:{self.port}")
        run = spawn(self, [CTL, "exec", "7:", "--", "hello"], env)
        self.assertEqual(await run.wait_ended(10), 0, run.output)
        screen = spawn(self, [CTL, "screen", "7:"], env)
        self.assertEqual(await screen.wait_ended(10), 0, screen.output)
        self.assertIn("hello from the agent", screen.output)
        self.assertIn("hello from the agent", "\n".join(rebooted.screen_lines()))
