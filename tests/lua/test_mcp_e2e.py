"""
MCP end to end (SPEC §10): a real gateway on loopback, computers on the
CraftOS harness running the real Lua client, and two clients we did not
write: the official MCP Python SDK, and the real opencode driven by a
scripted model.
"""

import json
import os
import signal
import sys
from unittest import SkipTest

import treq
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.fake_model import start_fake_model, tool_messages
from tests.harness.opencode import SharedOpencode
from tests.harness.processes import REPO, clean_env, spawn
from tests.harness.rawhttp import events as rawhttp_events
from tests.harness.rawhttp import raw
from tests.harness.support import both_modes, bounded, closed_port, reactor
from tests.lua.test_lua_e2e import GatewayMixin
from trapsandbox.mcp import schemas
from trapsandbox.ops import ctl

TOKEN = "mcp-test-token"
OPENCODE_PASSWORD = "oc-mcp"


class McpMixin(GatewayMixin):
    timeout = 120

    def setUp(self):
        from tests.harness.support import closed_port

        self.opencode_url = f"http://127.0.0.1:{closed_port()}"
        self.start_gateway(0, admin_token=TOKEN)

    @property
    def mcp_url(self):
        return f"http://127.0.0.1:{self.port}/mcp"

    async def client(self, command, steps, seconds=60):
        """A client process ``command`` run on ``steps``: the JSON lines it printed."""
        path = os.path.abspath(self.mktemp())
        with open(path, "w", encoding="utf-8") as f:
            json.dump(steps, f)
        argv = [*command, self.mcp_url, path, "--token", TOKEN]
        child = spawn(self, argv, clean_env(PYTHONPATH=REPO))
        code = await child.wait_ended(seconds)
        lines = [json.loads(line) for line in child.output.splitlines() if line.startswith("{")]
        self.assertEqual(code, 0, child.output)
        self.assertTrue(lines and lines[-1].get("done"), child.output)
        return lines

    async def ready(self, label, allow, id=7):
        c = self.computer(id=id, label=label)
        c.set_settings({"sandbox.allow": allow})
        await self.start_daemon(c)
        return c


class SdkClientTests(McpMixin, TestCase):
    """The official MCP Python SDK's client, in a child process (it is asyncio)."""

    async def sdk(self, steps):
        return await self.client([sys.executable, "-m", "tests.harness.mcp_client"], steps)

    async def test_sdk_lists_tools_runs_lua_and_round_trips_a_file(self):
        c = await self.ready("mc", "eval,fs.read,fs.write")
        tools, lua, wrote, read, forbidden, done = await self.sdk(
            [
                ["list_tools"],
                ["call", "run_lua", {"computer": "7:mc", "code": "return 6*7"}],
                [
                    "call",
                    "write_file",
                    {"computer": "mc", "path": "/mcp/hello.txt", "content": "héllo from MCP\n"},
                ],
                ["call", "read_file", {"computer": "7", "path": "/mcp/hello.txt"}],
                ["call", "run_command", {"command": "ls"}],
            ]
        )
        self.assertEqual(tools["tools"], [tool["name"] for tool in schemas.TOOLS])
        self.assertFalse(lua["isError"], lua)
        self.assertIn("Returned: 42", lua["text"])
        self.assertEqual(lua["structuredContent"]["returns"], ["42"])
        self.assertFalse(wrote["isError"], wrote)
        self.assertEqual(c.read_file("/mcp/hello.txt"), "héllo from MCP\n".encode())
        self.assertFalse(read["isError"], read)
        self.assertIn("UTF-8 text:\nhéllo from MCP", read["text"])
        self.assertEqual(read["structuredContent"]["content"], "héllo from MCP\n")
        self.assertTrue(forbidden["isError"])
        self.assertIn('run "sandbox allow exec"', forbidden["text"])
        self.assertEqual((done["protocolVersion"], done["server"]), ("2025-11-25", "trapsandbox"))


# Prints a line a second for ``...`` seconds; terminated, it leaves /ended saying so.
TICKER = (
    "local seconds = tonumber(...)\n"
    "local ok, err = pcall(function()\n"
    "  for i = 1, seconds do print('tick ' .. i) os.sleep(1) end\n"
    "end)\n"
    "local f = fs.open('/ended', 'w') f.write(ok and 'finished' or tostring(err)) f.close()\n"
    "print('finished after ' .. seconds .. ' s')\n"
)


class SdkDeeperTests(McpMixin, TestCase):
    """SPEC §17 with the official SDK: progress, cancellation, resources."""

    sdk = SdkClientTests.sdk

    async def test_the_progress_callback_hears_a_run_as_it_goes(self):
        c = await self.ready("mc", "exec")
        c.write_file("/ticker.lua", TICKER.encode())
        call = {"command": "/ticker.lua", "args": ["4"], "timeoutSeconds": 60}
        ran, _ = await self.sdk([["call_progress", "run_command", call]])
        self.assertFalse(ran["isError"], ran)
        self.assertIn("finished after 4 s", ran["text"])
        progress = ran["progress"]
        # About one a second while it printed, each later and further than the one before.
        self.assertGreaterEqual(len(progress), 2, progress)
        self.assertEqual([p[0] for p in progress], sorted({p[0] for p in progress}))
        self.assertTrue(all(p[1] == 60 for p in progress), progress)
        self.assertRegex(progress[0][2], r"^\d+ bytes of output: tick \d$")
        times = [p[3] for p in progress]
        self.assertTrue(all(b - a >= 0.5 for a, b in zip(times, times[1:], strict=False)), times)

    async def test_a_cancelled_call_ends_its_run_on_the_computer(self):
        c = await self.ready("mc", "exec")
        c.write_file("/ticker.lua", TICKER.encode())
        call = {"command": "/ticker.lua", "args": ["600"], "timeoutSeconds": 600}
        path = os.path.abspath(self.mktemp())
        with open(path, "w", encoding="utf-8") as f:
            json.dump([["cancel", "run_command", call]], f)
        argv = [sys.executable, "-m", "tests.harness.mcp_client", self.mcp_url, path]
        child = spawn(self, argv + ["--token", TOKEN], clean_env(PYTHONPATH=REPO))
        await child.wait_for(r'"cancelling"', 60)
        sent = reactor().seconds()
        await c.wait_for(lambda: c.read_file("/ended") is not None, 5, "the run's end")
        ended_after = reactor().seconds() - sent
        print(f"the run ended {ended_after:.3f} s after the cancel was sent")
        self.assertLess(ended_after, 1.0)
        self.assertEqual(c.read_file("/ended"), b"Terminated")
        child.signal(signal.SIGUSR1)  # the run is over: the client checks no answer came
        self.assertEqual(await child.wait_ended(30), 0, child.output)
        self.assertIn('"answered": false', child.output)  # MCP: no response to a cancelled call
        self.assertEqual(
            self.gateway.metrics._mcp_calls.labels("run_command", "cancelled").value, 1
        )

    async def test_resources_list_and_read(self):
        c = await self.ready("mc", "screen,fs.read")
        c.write_file("/notes.txt", "héllo\n".encode())
        c.write_file("/bin.dat", b"\xff\xfe")
        # (The harness's daemon keeps no screen to read: reading one is the unit tests'.)
        listed, text, blob, other, _ = await self.sdk(
            [
                ["list_resources"],
                ["read_resource", "trapsandbox://7%3Amc/files/notes.txt"],
                ["read_resource", "trapsandbox://7%3Amc/files/bin.dat"],
                ["read_resource", "trapsandbox://8/screen"],
            ]
        )
        self.assertEqual(listed["resources"], ["trapsandbox://7%3Amc/screen"])
        self.assertEqual(listed["templates"], ["trapsandbox://{traposId}/files/{+path}"])
        self.assertEqual(text["contents"][0]["text"], "héllo\n")
        self.assertEqual(blob["contents"][0]["blob"], "//4=")
        self.assertIn('No connected computer is "8"', other["error"])


MCP2_PYTHON = os.path.join(REPO, ".tools", "mcp2", "bin", "python")


class Sdk2026Tests(McpMixin, TestCase):
    """
    The official MCP Python SDK 2.3.0 at 2026-07-28 (stateless: no initialize, each
    request on its own), in a child process on its own virtualenv (``make test``
    makes it): list, run, read a screen resource, subscribe and see an update.
    """

    async def sdk(self, steps):
        if not os.path.exists(MCP2_PYTHON):
            raise SkipTest("the MCP SDK 2.x is not installed: `make test` installs it")
        client = os.path.join(REPO, "tests", "harness", "mcp2_client.py")
        return await self.client([MCP2_PYTHON, client], steps, 90)

    async def test_a_2026_client_lists_runs_reads_and_hears_the_screen_change(self):
        c = await self.ready("mc", "eval,fs.read,fs.write,screen")
        c.write_file("/notes/plan.txt", b"dig")
        screen = "trapsandbox://7%3Amc/screen"
        template = {"type": "ref/resource", "uri": "trapsandbox://{traposId}/files/{+path}"}
        tools, lua, read, completed, listened, wrote, done = await self.sdk(
            [
                ["list_tools"],
                ["call", "run_lua", {"computer": "7:mc", "code": "return 6*7"}],
                ["read_resource", screen],
                ["complete", template, "path", "notes/p", {"traposId": "7:mc"}],
                ["listen", screen, "run_lua", {"computer": "mc", "code": "print('seen by MCP')"}],
                [
                    "listen",
                    "trapsandbox://7%3Amc/files/notes/plan.txt",
                    "write_file",
                    {"computer": "mc", "path": "/notes/plan.txt", "content": "dig deeper"},
                ],
            ]
        )
        self.assertEqual(done["protocolVersion"], "2026-07-28")
        self.assertEqual(done["server"], "trapsandbox")
        self.assertEqual(tools["tools"], [tool["name"] for tool in schemas.TOOLS])
        self.assertEqual(tools["outputSchemas"], tools["tools"])
        self.assertFalse(lua["isError"], lua)
        self.assertEqual(lua["structuredContent"]["returns"], ["42"])
        self.assertEqual(read["contents"][0]["uri"], screen)
        self.assertIn("sandbox daemon", read["contents"][0]["text"])
        self.assertEqual(completed["values"], ["notes/plan.txt"])
        self.assertEqual(listened["honored"], [screen])
        self.assertEqual(listened["updated"], screen)
        self.assertFalse(listened["call"]["isError"], listened)
        self.assertEqual(wrote["updated"], "trapsandbox://7%3Amc/files/notes/plan.txt")
        self.assertEqual(c.read_file("/notes/plan.txt"), b"dig deeper")


class SubscriptionStreamTests(McpMixin, TestCase):
    """The subscription streams over a real socket: the legacy GET /mcp, and listen's end."""

    async def post(self, message, session=None):
        """One POST over a socket of its own (no resolver thread, unlike treq's name lookup)."""
        body = json.dumps(message).encode()
        head = (
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n"
        )
        if session:
            head += f"Mcp-Session-Id: {session}\r\n"
        client = await raw(self, self.port, head.encode() + b"\r\n" + body)
        return await client.response()

    def get_stream(self, session):
        head = (
            "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nMcp-Session-Id: {session}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        )
        return raw(self, self.port, head.encode())

    async def test_a_legacy_client_hears_a_file_change_on_its_get_stream(self):
        await self.ready("mc", "fs.read,fs.write")
        initialize = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t"},
        }
        _, headers, _ = await self.post(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize}
        )
        session = headers[b"mcp-session-id"].decode()
        # Without subscriptions, GET is the 405 it always was.
        idle = await self.get_stream(session)
        status, _, _ = await idle.response()
        self.assertEqual(status, 405)
        uri = "trapsandbox://7%3Amc/files/plan.txt"
        subscribe = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "resources/subscribe",
            "params": {"uri": uri},
        }
        _, _, body = await self.post(subscribe, session)
        self.assertEqual(json.loads(body)["result"], {})
        stream = await self.get_stream(session)
        await stream.until(b": subscribed")
        write = {"computer": "mc", "path": "/plan.txt", "content": "dig"}
        call = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "write_file", "arguments": write},
        }
        await self.post(call, session)
        data = await stream.until(b"\n\n")
        while b"resources/updated" not in data:
            data = await stream.until(b"\n\n")
        [update] = rawhttp_events(data)
        self.assertEqual(update["params"], {"uri": uri})

    async def test_an_asks_get_is_the_405_it_always_was(self):
        # opencode GETs /mcp after initialize with the ask's token: anything but 405 (a
        # 415 for the missing content type, say) fails its connection and the ask's tools.
        token = self.gateway.asks.tokens.token(("local", "7:mc"))
        head = f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
        client = await raw(self, self.port, head.encode())
        status, headers, _ = await client.response()
        self.assertEqual((status, headers[b"allow"]), (405, b"POST"))

    async def test_closing_a_listen_stream_ends_the_screen_watch(self):
        c = await self.ready("mc", "screen")
        uri = "trapsandbox://7%3Amc/screen"
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        message = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": "listen-1",
                "method": "subscriptions/listen",
                "params": {"_meta": meta, "notifications": {"resourceSubscriptions": [uri]}},
            }
        ).encode()
        head = (
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
            f"Mcp-Method: subscriptions/listen\r\nContent-Length: {len(message)}\r\n\r\n"
        )
        stream = await raw(self, self.port, head.encode() + message)
        [ack] = rawhttp_events(
            await stream.until(b"acknowledged" + b'"') + await stream.until(b"\n\n")
        )
        self.assertEqual(ack["params"]["notifications"], {"resourceSubscriptions": [uri]})
        self.assertEqual(
            ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-1"
        )
        await c.wait_for_lua("traposSandboxSession.status().watches == 1")
        stream.transport.loseConnection()
        await c.wait_for_lua("traposSandboxSession.status().watches == 0")


class RealOpencodeTests(McpMixin, TestCase):
    """
    The real opencode as the MCP client, its agent driven by a scripted model: one opencode
    for the class (``SharedOpencode``), each test with its own model and gateway on the ports
    the class keeps, and its own instance of opencode's directory (given back at its end, so
    the next test's instance connects to the next gateway afresh).
    """

    shared = SharedOpencode(OPENCODE_PASSWORD, env={"SANDBOX_ADMIN_TOKEN": TOKEN})

    @classmethod
    def tearDownClass(cls):
        cls.shared.stop()

    def setUp(self):
        self.shared.serves(self)
        self.opencode_url = f"http://127.0.0.1:{closed_port()}"
        self.start_gateway(self.shared.gateway_port, admin_token=TOKEN)

    def fake_model(self, tool, arguments, **options):
        return start_fake_model(self, tool, arguments, port=self.shared.model_port, **options)

    async def opencode(self, model):
        config = {
            **model.opencode_config(),
            **ctl.opencode_config(self.mcp_url.removesuffix("/mcp"), True),
        }
        self.oc_url = await self.shared.start(self, config)
        self.pool = HTTPConnectionPool(reactor(), persistent=False)
        self.addCleanup(lambda: Deferred.fromCoroutine(self.oc("POST", "/instance/dispose")))

    async def oc(self, method, path, body=None, seconds=60):
        response = await bounded(
            treq.request(
                method,
                self.oc_url + path,
                json=body,
                auth=("opencode", OPENCODE_PASSWORD),
                pool=self.pool,
            ),
            seconds,
        )
        content = await bounded(treq.content(response), seconds)
        self.assertEqual(response.code, 200, content)
        return json.loads(content)

    async def connected(self):
        """opencode's GET /mcp, once it has connected to the gateway (or failed)."""
        deadline = reactor().seconds() + 30
        while True:
            status = await self.oc("GET", "/mcp")
            if status.get("trapsandbox", {}).get("status") != "pending" and "trapsandbox" in status:
                return status
            if reactor().seconds() > deadline:
                return status
            await deferLater(reactor(), 0.2, lambda: None)

    async def prompt(self, model, text):
        self.assertEqual((await self.connected())["trapsandbox"], {"status": "connected"})
        session = await self.oc("POST", "/session", {"title": "mcp test"})
        await self.oc(
            "POST",
            f"/session/{session['id']}/message",
            {
                "parts": [{"type": "text", "text": text}],
                "model": {"providerID": "fake", "modelID": "m1"},
            },
            seconds=90,
        )
        result = await model.tool_result()
        self.assertIn("trapsandbox_run_lua", model.offered_tools())
        return result

    async def test_opencode_calls_run_lua_and_the_model_gets_42(self):
        await self.ready("oc", "eval")
        model = await self.fake_model(
            "trapsandbox_run_lua", {"computer": "7:oc", "code": "return 6*7"}
        )
        await self.opencode(model)
        result = await self.prompt(model, "What is 6*7 on the computer?")
        self.assertIn("42", result)
        self.assertIn("Returned: 42", result)
        self.assertTrue(
            {"trapsandbox_list_computers", "trapsandbox_read_file"} <= model.offered_tools()
        )
        # The server has resources (SPEC §17): opencode 1.18.33 offers the model its own
        # tools to list and read them.
        self.assertTrue(
            {"list_mcp_resources", "read_mcp_resource"} <= model.offered_tools(),
            model.offered_tools(),
        )

    async def test_a_computer_that_allowed_nothing_gives_the_model_the_error_text(self):
        await self.ready("shy", "")
        model = await self.fake_model(
            "trapsandbox_run_lua", {"computer": "7:shy", "code": "return 6*7"}
        )
        await self.opencode(model)
        result = await self.prompt(model, "What is 6*7 on the computer?")
        self.assertIn('run "sandbox allow eval"', result)
        self.assertNotIn("42", result)

    async def test_opencode_lists_peripherals_and_writes_to_a_monitor(self):
        """
        SPEC §16 through the real opencode: its agent lists the peripherals of
        a computer with the harness's emulated monitor, then writes on it with
        call_peripheral; the monitor shows the text and the model got each
        tool's result.
        """
        c = self.computer(id=7, label="pm")
        c.set_settings({"sandbox.allow": "peripheral"})
        world = c.install_world()
        world[b"attach"](b"top", b"monitor")
        await self.start_daemon(c)
        monitor = {"computer": "7:pm", "name": "top"}
        script = [
            ("trapsandbox_list_peripherals", {"computer": "7:pm"}),
            ("trapsandbox_call_peripheral", {**monitor, "method": "setCursorPos", "args": [2, 3]}),
            ("trapsandbox_call_peripheral", {**monitor, "method": "write", "args": ["hi agent"]}),
            ("trapsandbox_call_peripheral", {**monitor, "method": "getCursorPos"}),
            ("trapsandbox_call_peripheral", {**monitor, "method": "fly"}),
        ]
        model = await self.fake_model("", {}, script=script, answer="Written.")
        await self.opencode(model)
        await self.prompt(model, "Write on the monitor of computer 7:pm.")
        self.assertTrue(
            {"trapsandbox_list_peripherals", "trapsandbox_call_peripheral"} <= model.offered_tools()
        )
        results = max((tool_messages(body) for body in model.requests), key=len)
        self.assertEqual(len(results), len(script), results)
        listed, _, written, cursor, failed = results
        self.assertIn("- top (monitor): clear, getCursorPos, getSize", listed)
        self.assertEqual(written, "top.write on 7:pm returned: nothing")
        self.assertEqual(cursor, "top.getCursorPos on 7:pm returned: 10, 3")
        self.assertIn("peripheral_error: No such method fly", failed)
        self.assertEqual(world[b"monitorLines"](b"top")[3], b" hi agent      ")


both_modes(globals(), "Sdk2026Tests", "SubscriptionStreamTests")
