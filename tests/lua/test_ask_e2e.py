"""
``sandbox ask`` end to end (SPEC §11): a computer on the CraftOS harness runs
the real Lua client against a real gateway on loopback, which drives the real
opencode, whose agent is a scripted model calling the gateway's MCP tools.
"""

import json

import treq
from twisted.logger import formatEvent
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool

from tests.harness.callers import asking
from tests.harness.fake_model import start_fake_model, tool_messages
from tests.harness.logcapture import LogCapture
from tests.harness.opencode import SharedOpencode
from tests.harness.support import bounded, reactor
from tests.lua.test_lua_e2e import GatewayMixin
from trapsandbox import limits
from trapsandbox.computers.session import describe_session
from trapsandbox.limits import LOCAL_ACCOUNT
from trapsandbox.ops import ctl

TOKEN = "ask-test-admin-token"
OPENCODE_PASSWORD = "oc-ask"
PROGRAM = "print('hello from the agent')\n"
SCRIPT = [
    ("trapsandbox_write_file", {"computer": "7:ask", "path": "/hello.lua", "content": PROGRAM}),
    ("trapsandbox_run_command", {"computer": "7:ask", "command": "/hello.lua"}),
]
CLOSING = "I wrote hello.lua and ran it: it printed its greeting."
# Sleeps its argument's seconds, a line each second, then says it finished.
SLOW = (
    "local seconds = tonumber(...)\n"
    "for i = 1, seconds do os.sleep(1) print('slept ' .. i .. ' s') end\n"
    "print('finished after ' .. seconds .. ' s')\n"
)


# Marks its start, ticks for ``...`` seconds; terminated, it leaves /ended saying so.
TICKER = (
    "local seconds = tonumber(...)\n"
    "local f = fs.open('/started', 'w') f.close()\n"
    "local ok, err = pcall(function()\n"
    "  for i = 1, seconds do print('tick ' .. i) os.sleep(1) end\n"
    "end)\n"
    "f = fs.open('/ended', 'w') f.write(ok and 'finished' or tostring(err)) f.close()\n"
)


class OnSharedOpencode:
    """
    Asks on one opencode for all of a class's tests (``shared``, each class its own: a start
    costs seconds of CPU), each test with its own scripted model (``fake_model``) and gateway,
    on the ports it keeps for them.  ``make test`` runs a class's tests in one worker
    (``--dist loadscope``).
    """

    shared: SharedOpencode

    @staticmethod
    def opencode_for_class() -> SharedOpencode:
        return SharedOpencode(OPENCODE_PASSWORD, env={"SANDBOX_ADMIN_TOKEN": TOKEN})

    @classmethod
    def tearDownClass(cls):
        cls.shared.stop()

    def setUp(self):
        self.shared.serves(self)
        self.opencode_url = self.shared.url
        self.start_gateway(
            self.shared.gateway_port,
            admin_token=TOKEN,
            opencode_password=OPENCODE_PASSWORD,
            ask_directory=self.mktemp(),
        )

    def fake_model(self, tool, arguments, **options):
        """The test's scripted model, where the shared opencode looks for it."""
        return start_fake_model(self, tool, arguments, port=self.shared.model_port, **options)

    async def opencode(self, model):
        config = {
            **model.opencode_config(),
            **ctl.opencode_config(f"http://127.0.0.1:{self.port}", True),
        }
        await self.shared.start(self, config)
        self.pool = HTTPConnectionPool(reactor(), persistent=False)


class AskEndToEndTests(OnSharedOpencode, GatewayMixin, TestCase):
    timeout = 150
    shared = OnSharedOpencode.opencode_for_class()

    async def session_status(self, session_id, directory):
        response = await bounded(
            treq.get(
                self.opencode_url + "/session/status",
                params={"directory": directory},
                auth=("opencode", OPENCODE_PASSWORD),
                pool=self.pool,
            )
        )
        return json.loads(await bounded(treq.content(response))).get(session_id)

    async def ready(self, allow="exec,fs.write"):
        c = self.computer(id=7, label="ask")
        c.set_settings({"sandbox.allow": allow})
        await self.start_daemon(c)
        return c

    def ask(self, c, command):
        """Type ``command`` at a shell in a tab of its own, in front, as a player does."""
        shell = c.run("/rom/programs/shell.lua")
        c.focus(shell)
        c.type_line(command)
        self.asking = shell
        return shell

    def on_screen(self, c, text, seconds):
        # Wrapped lines are joined: a line break is the cursor moving, not a character.
        d = c.wait_for(
            lambda: text in " ".join(line.strip() for line in self.asking.screen_lines()),
            seconds,
            f"{text!r} on the screen",
        )

        def show(failure):
            print("SCREEN:\n" + "\n".join(self.asking.screen_lines()))
            return failure

        return d.addErrback(show)

    def release(self, model):
        for request in model.held:
            if not request.finished and not request._disconnected:
                request.finish()

    async def test_ask_writes_and_runs_a_program_after_the_player_says_yes(self):
        model = await self.fake_model("", {}, script=SCRIPT, answer=CLOSING)
        await self.opencode(model)
        c = await self.ready()
        self.ask(c, "/programs/sandbox.lua ask write a program that greets me")
        # The detail is what the tool would do (the path), not the permission's pattern ("*").
        await c.wait_for_output("Allow write_file: /hello.lua (", 90)
        c.queue_event("char", "y")
        await c.wait_for_output("Allow run_command: /hello.lua?", 60)
        self.assertEqual(c.read_file("/hello.lua"), PROGRAM.encode())
        c.queue_event("char", "y")
        await self.on_screen(c, "printed its greeting.", 60)
        results = [text for body in model.requests for text in tool_messages(body)]
        self.assertIn("hello from the agent", results[-1])
        self.assertIn("exit code 0", results[-1])
        # The agent had the computer's tools and none of opencode's own (bash, edit, ...).
        offered = {tool["function"]["name"] for tool in model.requests[-1].get("tools") or []}
        self.assertIn("trapsandbox_write_file", offered)
        self.assertNotIn("bash", offered)
        screen = "\n".join(self.asking.screen_lines())
        self.assertIn("[write_file]", screen)
        self.assertIn("[run_command]", screen)
        metrics = self.gateway.metrics
        self.assertEqual(metrics._asks.labels("ok").value, 1)

    async def test_an_ask_that_wrote_a_file_says_so_and_sandbox_undo_removes_it(self):
        """
        SPEC §15: the gateway snapshots the computer before the ask's first change (the
        agent's write_file), the ask ends with the closing line, and ``sandbox undo``
        answered y brings the computer back: the file the agent wrote is gone.
        """
        script = [("trapsandbox_write_file", {"path": "/made.lua", "content": PROGRAM})]
        model = await self.fake_model("", {}, script=script, answer="Wrote it.")
        await self.opencode(model)
        c = await self.ready(allow="fs.read,fs.write")
        await self.gateway.snapshots.ready()
        c.write_file("/mine.txt", "the player's")
        self.ask(c, "/programs/sandbox.lua ask --yes write made.lua")
        await self.on_screen(c, "changed 1 file: sandbox changes / sandbox undo", 90)
        self.assertEqual(c.read_file("/made.lua"), PROGRAM.encode())
        (snapshot,) = await self.gateway.snapshots.list(asking("7:ask", "local"))
        self.assertEqual(snapshot["reason"], "ask")  # the client's files and /mine.txt

        undo = c.run("/programs/sandbox.lua undo")
        c.focus(undo)
        await c.wait_for_output("Undo these changes? [y/N]", 30)
        self.assertIn("added    /made.lua", c.output)
        self.assertIn("1 change since snapshot", c.output)
        c.type_line("y")
        await bounded(undo.done, 30)
        self.assertIn("0 written, 1 deleted", c.output)
        self.assertIsNone(c.read_file("/made.lua"))
        self.assertEqual(c.read_file("/mine.txt"), b"the player's")
        self.assertEqual(c.violations, [])

    async def test_the_tools_reach_the_asking_computer_only(self):
        # The model names another computer; the ask's token pins every tool to the asker.
        script = [
            (
                "trapsandbox_write_file",
                {"computer": "8:other", "path": "/x.txt", "content": "pinned"},
            )
        ]
        model = await self.fake_model("", {}, script=script, answer="ok.")
        await self.opencode(model)
        c = await self.ready()
        other = self.computer(id=8, label="other")
        other.set_settings({"sandbox.allow": "fs.write"})
        await self.start_daemon(other)
        self.ask(c, "/programs/sandbox.lua ask --yes write x")
        await self.on_screen(c, "ok.", 90)
        self.assertEqual(c.read_file("/x.txt"), b"pinned")
        self.assertIsNone(other.read_file("/x.txt"))

    async def test_reject_writes_nothing(self):
        model = await self.fake_model("", {}, script=SCRIPT[:1], answer="Fine, I won't.")
        await self.opencode(model)
        c = await self.ready()
        self.ask(c, "/programs/sandbox.lua ask write a program")
        # The detail is what the tool would do (the path), not the permission's pattern ("*").
        await c.wait_for_output("Allow write_file: /hello.lua (", 90)
        c.queue_event("char", "n")
        await c.wait_for_output("> refused", 10)
        # opencode ends the run with the tool's failure; the shell prompts again.
        await c.wait_for_output("write_file failed", 30)
        await c.wait_for(lambda: c.output.rstrip().endswith(">"), 30, "the shell's prompt")
        self.assertIsNone(c.read_file("/hello.lua"))

    async def test_ctrl_t_aborts_the_run_in_opencode(self):
        model = await self.fake_model("", {}, script=[], answer="Thinking hard", hold=True)
        self.addCleanup(self.release, model)
        await self.opencode(model)
        c = await self.ready()
        self.ask(c, "/programs/sandbox.lua ask think")
        await c.wait_for_output("Thinking", 90)
        c.terminate()
        await c.wait_for_output("sandbox ask: cancelled", 30)
        self.assertIn("Cancelling the agent", c.output)
        await bounded(model.hung_up, 10)  # opencode stopped the model's answer
        (conversation,) = self.gateway.asks.conversations.values()
        status = await self.session_status(conversation.session_id, conversation.directory)
        self.assertIn(status, (None, {"type": "idle"}))
        self.assertEqual(self.gateway.metrics._asks.labels("cancelled").value, 1)

    async def run_slow(self, seconds, **arguments):
        """
        ``sandbox ask --yes`` whose agent runs ``/slow.lua SECONDS``; the tool
        result the model received.  The harness's ``os.sleep`` is a reactor
        timer: the program takes real seconds, and so does opencode's call.
        """
        call = {"computer": "7:ask", "command": "/slow.lua", "args": [str(seconds)], **arguments}
        model = await self.fake_model(
            "", {}, script=[("trapsandbox_run_command", call)], answer="It ran."
        )
        await self.opencode(model)
        c = await self.ready()
        c.write_file("/slow.lua", SLOW.encode())
        self.ask(c, "/programs/sandbox.lua ask --yes run the slow program")
        await self.on_screen(c, "It ran.", seconds + 90)
        (result,) = [text for body in model.requests for text in tool_messages(body)][-1:]
        self.assertNotIn("MCP error", result)  # opencode's "-32001: Request timed out"
        return result

    async def test_a_tool_call_of_8_s_reaches_the_model(self):
        """
        Issue 26: the operator's MCP block (ctl.opencode_config) sets no
        ``timeout`` and the computer's copy used to say 5000 ms, which opencode
        1.18.33 applies to tool calls: an 8 s program was cut at 5.5 s with
        ``MCP error -32001: Request timed out``.
        """
        result = await self.run_slow(8)
        self.assertIn("finished after 8 s", result)
        self.assertIn("exit code 0", result)

    async def test_a_run_past_opencodes_timeout_reaches_the_model_with_progress(self):
        """
        SPEC §17 (and issue 26's pinned bound, lifted): opencode sends a
        progressToken and takes SSE, so the gateway reports the run while it
        goes on, each report resetting opencode's clock, and lets it last its
        own timeoutSeconds: a program that runs twice the ask's MCP block
        timeout (limits.ASK_MCP_TIMEOUT_MS, which opencode applies to the call)
        finishes and the model gets all of its output.  The block's timeout is
        made 6 s here, so that the test does not take the real one's 80 s.
        """
        self.assertLess(limits.MCP_PROGRESS_HEARTBEAT, limits.ASK_MCP_TIMEOUT_MS / 1000)
        self.patch(limits, "ASK_MCP_TIMEOUT_MS", 6000)
        result = await self.run_slow(12, timeoutSeconds=100)
        self.assertIn("finished after 12 s", result)
        self.assertIn("exit code 0", result)
        self.assertNotIn("timed out", result)

    async def test_the_agents_question_reaches_the_player_and_the_answer_the_model(self):
        question = {
            "questions": [
                {
                    "question": "Which colour should the lamp be?",
                    "header": "Colour",
                    "options": [
                        {"label": "red", "description": "warm"},
                        {"label": "blue", "description": "cold"},
                    ],
                }
            ]
        }
        model = await self.fake_model("", {}, script=[("question", question)], answer="Blue it is.")
        await self.opencode(model)
        c = await self.ready()
        self.ask(c, "/programs/sandbox.lua ask paint the lamp")
        await self.on_screen(c, "2. blue - cold", 90)
        self.assertIn("? Which colour should the lamp be?", c.output)
        c.type_line("2")
        await self.on_screen(c, "Blue it is.", 60)
        self.assertIn("> answered", c.output)
        (result,) = [text for body in model.requests for text in tool_messages(body)][-1:]
        # opencode 1.18.33's tool result: '... "Which colour should the lamp be?"="blue" ...'
        self.assertIn('="blue"', result)

    async def ticking(self):
        """A computer, and the model of an ask whose agent runs ``/ticker.lua 300`` there
        (it marks /started and /ended)."""
        call = {"computer": "7:ask", "command": "/ticker.lua", "args": ["300"]}
        model = await self.fake_model(
            "", {}, script=[("trapsandbox_run_command", {**call, "timeoutSeconds": 300})]
        )
        await self.opencode(model)
        c = await self.ready()
        c.write_file("/ticker.lua", TICKER.encode())
        return c, model

    async def test_ctrl_t_during_a_run_ends_the_run_on_the_computer(self):
        """
        opencode 1.18.33, aborted mid tool call, sends notifications/cancelled
        for it; the gateway ends that run on the computer (SPEC §17).
        """
        c, _ = await self.ticking()
        logs = LogCapture(self)
        self.ask(c, "/programs/sandbox.lua ask --yes tick")
        await c.wait_for(lambda: c.read_file("/started") is not None, 90, "the run's start")
        c.terminate()
        aborted = reactor().seconds()
        await c.wait_for(lambda: c.read_file("/ended") is not None, 10, "the run's end")
        print(f"the run ended {reactor().seconds() - aborted:.3f} s after Ctrl+T")
        self.assertEqual(c.read_file("/ended"), b"Terminated")
        await c.wait_for_output("sandbox ask: cancelled", 30)
        # It was opencode's cancel, not its hanging up, that ended the run.
        said = [formatEvent(event) for event in logs.events]
        self.assertTrue(any("cancelled by its client" in line for line in said), said[-20:])
        self.assertIn("MCP run_command on 7:ask: cancelled", "\n".join(said))

    async def test_sandbox_stop_ends_the_running_ask_and_what_it_runs(self):
        """
        SPEC §16: ``sandbox stop``, typed in another tab while the agent runs a
        program through an ask, terminates the program, ends the ask on the
        player's screen with a clear line, aborts the run in opencode, and
        shows the computer stopped; an ask while stopped is refused at once.
        """
        c, model = await self.ticking()
        self.ask(c, "/programs/sandbox.lua ask --yes tick")
        await c.wait_for(lambda: c.read_file("/started") is not None, 90, "the run's start")
        await c.run("/programs/sandbox.lua stop").done
        await c.wait_for(lambda: c.read_file("/ended") is not None, 10, "the run's end")
        self.assertEqual(c.read_file("/ended"), b"Terminated")
        await self.on_screen(c, "sandbox ask: stopped: the player stopped the sandbox agent", 30)
        await self.on_screen(c, 'on it, run "sandbox resume"', 5)
        session = self.gateway.registry.find(LOCAL_ACCOUNT, "7:ask")
        self.assertEqual(describe_session(session)["stopped"], True)
        self.assertEqual(self.gateway.metrics._asks.labels("cancelled").value, 1)
        (conversation,) = self.gateway.asks.conversations.values()
        status = await self.session_status(conversation.session_id, conversation.directory)
        self.assertIn(status, (None, {"type": "idle"}))
        # Stopped: a new ask is refused before opencode hears of it.
        asked = len(model.requests)
        self.ask(c, "/programs/sandbox.lua ask --yes tick again")
        await self.on_screen(c, "sandbox ask: stopped: the player stopped", 30)
        self.assertEqual(len(model.requests), asked)
        status = c.run("/programs/sandbox.lua status")
        await status.done
        self.assertIn("agent: stopped (the player stopped the sandbox agent", c.output)
        await c.run("/programs/sandbox.lua resume").done
        await c.wait_for(
            lambda: self.gateway.registry.find(LOCAL_ACCOUNT, "7:ask").stopped is None,
            10,
            "the gateway told",
        )
