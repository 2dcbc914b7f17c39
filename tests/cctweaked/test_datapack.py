"""
The client as a server admin installs it (issue 47): the gateway's data pack
(``GET /client/datapack.zip``) merged over CC:Tweaked's ROM as the game merges a pack in the
world's ``datapacks/``. Every computer has ``sandbox``, ``help sandbox`` and completion; none
connects before its player runs ``sandbox setup``; after it, it works as an installed one.
"""

from __future__ import annotations

import io
import zipfile

import treq
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.client import HTTPConnectionPool

from tests.cctweaked.test_client import PASSWORD, CCTGatewayMixin
from tests.harness.callers import asking
from tests.harness.cctweaked import CCTComputer, unavailable, wait_connected
from tests.harness.fake_model import start_fake_model
from tests.harness.opencode import start_opencode
from tests.harness.support import bounded, closed_port, reactor
from tests.lua.test_ask_e2e import OPENCODE_PASSWORD, PROGRAM, TOKEN
from trapsandbox.ops import ctl
from trapsandbox.web import client

# isSettingsPath's first line indexes its path: called without one, it raises there.
IS_SETTINGS_PATH_LINE = 1 + (client.lua_dir() / "sandbox" / "handlers.lua").read_text().split(
    "\n"
).index("function M.isSettingsPath(path, cwd)")

# What a fresh computer (nothing typed, nothing saved) finds in its ROM, written to /fresh.txt
# (the help page drawn next clears the screen before its rows are printed).
FRESH = """
local lines = {}
local realPrint = print
local function say(s) lines[#lines + 1] = s end
say('program: ' .. tostring(shell.resolveProgram('sandbox')))
local pages = {}
local topics = { 'sandbox', 'sandbox-ask', 'sandbox-allow', 'sandbox-stop' }
topics[#topics + 1] = 'sandbox-snapshots'
for _, topic in ipairs(topics) do
  pages[#pages + 1] = tostring(help.lookup(topic))
end
say('help: ' .. table.concat(pages, ', '))
say('require: ' .. type(require('libsandbox').request))
local _, err = pcall(require('libsandbox').isSettingsPath)
say('error: ' .. tostring(err):match('^%S*'))
local _, trace = xpcall(require('libsandbox').isSettingsPath, debug.traceback)
say('traceback: ' .. tostring(tostring(trace):match('\\n%s*(sandbox/handlers%.lua:%d+: in)')))
local running = rawget(_G, 'traposSandboxState') ~= nil
say('daemon: ' .. tostring(running) .. ', tabs ' .. multishell.getCount())
local d = settings.getDetails('sandbox.allow')
say('set: ' .. d.type .. ' [' .. d.default .. '] ' .. d.description:sub(1, 22))
say('complete: ' .. table.concat(shell.complete('sandbox al'), '|') .. '/'
  .. table.concat(shell.complete('sandbox deny exec fs.'), '|') .. '/'
  .. table.concat(shell.complete('sandbox ask --n'), '|'))
_G.print = function(s) say(tostring(s)) end
shell.run('sandbox health')
_G.print = realPrint
say('saved: ' .. tostring(fs.exists('/.settings')))
local f = fs.open('/fresh.txt', 'w') f.write(table.concat(lines, '\\n')) f.close()
shell.run('help sandbox')
"""
FRESH_LINES = [
    "program: rom/programs/sandbox.lua",
    "help: rom/help/sandbox.txt, rom/help/sandbox-ask.txt, rom/help/sandbox-allow.txt, "
    "rom/help/sandbox-stop.txt, rom/help/sandbox-snapshots.txt",
    "require: function",
    # Run from the pack's module files, a module's error and traceback name it and its line.
    f"error: sandbox/handlers.lua:{IS_SETTINGS_PATH_LINE + 1}:",
    f"traceback: sandbox/handlers.lua:{IS_SETTINGS_PATH_LINE + 1}: in",
    "daemon: false, tabs 1",
    "set: string [] What the sandbox agent",
    "complete: low /read |write /ew ",
    "set sandbox.url first",
    "(or run: sandbox setup)",
    "saved: false",
]

# The player's typing, queued before `sandbox setup` reads it: the password, then Enter.
SETUP = f"""
os.queueEvent('paste', '{PASSWORD}')
os.queueEvent('key', keys.enter)
shell.run('sandbox setup --allow=all')
os.pullEvent('trapos_sandbox_connected')
shell.run('sandbox health')
"""


class DatapackTests(CCTGatewayMixin, TestCase):
    async def served_pack(self, query: str = "") -> bytes:
        pool = HTTPConnectionPool(reactor(), persistent=False)
        response = await bounded(treq.get(f"{self.base}/client/datapack.zip{query}", pool=pool))
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders("content-type"), ["application/zip"])
        return await bounded(treq.content(response))

    async def pack_computer(self, **options) -> CCTComputer:
        pack = await self.served_pack()
        # The gateway names itself as the computers reach it; the same files, the same bytes.
        self.assertEqual(pack, client.datapack(self.base))
        return CCTComputer(self, label="lab", datapack=pack, **options)

    async def test_the_served_pack_holds_the_client_under_rom(self):
        pack = zipfile.ZipFile(io.BytesIO(await self.served_pack()))
        rom = "data/computercraft/lua/rom/"
        names = set(pack.namelist())
        self.assertLessEqual(
            {
                "pack.mcmeta",
                rom + "programs/sandbox.lua",
                rom + "modules/main/libsandbox.lua",
                *(rom + f"modules/main/sandbox/{name}.lua" for name in client.MODULES),
                rom + "autorun/sandbox.lua",
                rom + "help/sandbox.txt",
                rom + "sandbox/daemon.lua",
            },
            names,
        )
        self.assertEqual([n for n in names if n != n.lower()], [], "CC:Tweaked wants lower case")
        # The loader of the modules, not the one-file build.
        self.assertEqual(pack.read(rom + "modules/main/libsandbox.lua"), client.pack_loader())
        self.assertIn(self.base.encode(), pack.read(rom + "modules/main/sandbox/gateway.lua"))
        bare = zipfile.ZipFile(io.BytesIO(await self.served_pack("?url=none")))
        self.assertNotIn(rom + "modules/main/sandbox/gateway.lua", bare.namelist())

    async def test_a_fresh_computer_has_sandbox_and_help_and_does_not_connect(self):
        c = await self.pack_computer()
        c.write_file("/startup.lua", FRESH)
        c.boot()
        # `help sandbox` shows the page.
        await c.wait_for_screen("sandbox connects this computer to a trapsandbox gateway")
        self.assertEqual(c.read_file("/fresh.txt").decode().split("\n"), FRESH_LINES)
        self.assertEqual(len(self.gateway.registry), 0)
        self.assertIsNone(c.read_file("/.settings"))

    async def test_sandbox_setup_then_it_works_as_an_installed_one(self):
        c = await self.pack_computer()
        c.write_file("/startup.lua", SETUP)
        c.boot()
        # (Not its "gateway: …" line: printed in the tick the daemon's tab opens, multishell's
        # redraw can move it before the harness sees it stay; the saved URL says the same.)
        await c.wait_for_screen("daemon started in a new tab")
        await wait_connected(self.gateway.registry, c.trapos_id)
        await c.wait_for_screen("sandboxOk: true")
        settings = c.read_file("/.settings").decode()
        self.assertIn(f"ws://127.0.0.1:{self.port}/gateway", settings)
        self.assertIn(PASSWORD, settings)
        self.assertIn("exec,eval,fs.read,fs.write,screen,input,peripheral", settings)
        await self.works(c)

        # Rebooted without the startup: the ROM's autorun starts the daemon, once.
        await c.shutdown()
        c.path("/startup.lua").unlink()
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        answer = await self.eval(c, "return multishell.getCount(), multishell.getTitle(2)")
        self.assertEqual(answer["returns"], ["2", '"sandbox"'], answer)
        await self.works(c)

    async def works(self, c: CCTComputer) -> None:
        """eval, files and exec answer as on an installed computer."""
        answer = await self.eval(c, "return 6 * 7")
        self.assertEqual(answer["returns"], ["42"], answer)
        caller = asking(c.trapos_id)
        await self.sandbox.write_file(caller, "/hello.lua", b"print('hello ' .. ...)")
        read = await self.sandbox.read_file(caller, "/hello.lua")
        self.assertEqual(read["content"], b"print('hello ' .. ...)")
        answer = await self.sandbox.execute(caller, "hello", ["pack"])
        self.assertEqual((answer["exitCode"], answer["stdout"]), (0, "hello pack\n"), answer)

    async def test_a_computer_with_the_pack_and_the_installer_runs_one_daemon(self):
        c = await self.pack_computer()
        c.write_file(
            "/startup.lua",
            f"shell.run('wget run {self.base}/client/install.lua {PASSWORD} --allow=all')\n",
        )
        c.boot()
        await c.wait_for_screen("daemon started in a new tab")
        await wait_connected(self.gateway.registry, c.trapos_id)
        await c.shutdown()
        c.path("/startup.lua").unlink()
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        # The ROM's autorun started one; the installer's startup file found it running.
        answer = await self.eval(
            c, "return multishell.getCount(), fs.exists('/startup/sandbox-daemon.lua')"
        )
        self.assertEqual(answer["returns"], ["2", "true"], answer)
        await self.works(c)

    async def test_setup_on_a_basic_computer_starts_the_daemon_at_the_next_boot(self):
        # Beside another pack's autoruns, one sorted before ours and one after: each runs once
        # a boot (the ROM's startup run again from ours ran the first twice).
        counting = "local f = fs.open('/autoruns.txt', 'a') f.writeLine('%s') f.close()\n"
        pack = with_files(
            await self.served_pack(),
            {
                "data/computercraft/lua/rom/autorun/a_before.lua": counting % "before",
                "data/computercraft/lua/rom/autorun/z_after.lua": counting % "after",
            },
        )
        c = CCTComputer(self, label="lab", datapack=pack, basic=True)
        typed = SETUP.split("os.pullEvent")[0]
        c.write_file("/startup.lua", typed)
        c.boot()
        await c.wait_for_screen("Reboot to start the daemon")
        self.assertEqual(len(self.gateway.registry), 0)
        await c.shutdown()
        # The player's own startup still runs, once, beside the daemon the autorun started.
        c.write_file(
            "/startup.lua",
            "local f = fs.open('/ran.txt', 'a') f.writeLine('ran') f.close()\n"
            "print('own startup ran')\n",
        )
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        await c.wait_for_screen("own startup ran")
        await self.works(c)
        self.assertEqual(c.read_file("/ran.txt"), b"ran\n")
        self.assertEqual(c.read_file("/autoruns.txt"), b"before\nafter\n" * 2)  # two boots


def with_files(pack: bytes, files: dict[str, str]) -> bytes:
    """``pack`` (a zip) with ``files`` added, as another data pack's would merge with it."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(pack)) as source, zipfile.ZipFile(out, "w") as made:
        for item in source.infolist():
            made.writestr(item, source.read(item))
        for name, text in files.items():
            made.writestr(name, text)
    return out.getvalue()


class DatapackAskTests(CCTGatewayMixin, TestCase):
    """`sandbox ask` on a computer set up through the data pack, the agent a scripted model."""

    def setUp(self):
        reason = unavailable()
        if reason:
            raise SkipTest(reason)
        self.oc_port = closed_port()
        self.start_gateway(
            0,
            opencode_url=f"http://127.0.0.1:{self.oc_port}",
            admin_token=TOKEN,
            opencode_password=OPENCODE_PASSWORD,
            ask_directory=self.mktemp(),
        )

    async def test_ask_writes_a_file_through_the_agent(self):
        script = [("trapsandbox_write_file", {"path": "/made.lua", "content": PROGRAM})]
        model = await start_fake_model(self, "", {}, script=script, answer="Wrote it.")
        config = {
            **model.opencode_config(),
            **ctl.opencode_config(f"http://127.0.0.1:{self.port}", True),
        }
        await start_opencode(
            self,
            OPENCODE_PASSWORD,
            config,
            env={"SANDBOX_ADMIN_TOKEN": TOKEN},
            global_config=True,
            port=self.oc_port,
        )
        c = CCTComputer(self, label="lab", datapack=client.datapack(self.base))
        c.write_file("/startup.lua", SETUP + "shell.run('sandbox ask --yes write made.lua')\n")
        c.boot()
        await c.wait_for_screen("changed 1 file: sandbox changes / sandbox undo", 120)
        self.assertEqual(c.read_file("/made.lua"), PROGRAM.encode())


class InstallerConventionsTests(CCTGatewayMixin, TestCase):
    """A computer set up by the installer (no data pack) follows the same shell conventions."""

    async def test_help_completion_and_described_settings(self):
        c = CCTComputer(self, label="lab")
        c.write_file(
            "/startup.lua",
            f"shell.run('wget run {self.base}/client/install.lua {PASSWORD} --allow=all')\n",
        )
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        await c.shutdown()
        c.path("/startup.lua").unlink()
        c.boot()
        await wait_connected(self.gateway.registry, c.trapos_id)
        answer = await self.eval(
            c,
            "return help.lookup('sandbox'), table.concat(shell.complete('sandbox allow fs.'), '|'),"
            " settings.getDetails('sandbox.allow').description:sub(1, 22)",
        )
        self.assertEqual(
            answer["returns"],
            ['"help/sandbox.txt"', '"read |write "', '"What the sandbox agent"'],
            answer,
        )
