"""
Issue 44 on the real opencode: a computer that disconnects mid-ask has its run
aborted in opencode and its slot freed (its next ask starts at once), and a
stopping gateway aborts the running ask in opencode and starts none that waits.
"""

from twisted.trial.unittest import TestCase

from tests.harness.support import both_modes, bounded
from tests.lua import test_ask_e2e as ask_e2e
from tests.lua.test_lua_e2e import GatewayMixin


class AskEdgesEndToEndTests(ask_e2e.OnSharedOpencode, GatewayMixin, TestCase):
    timeout = 150
    shared = ask_e2e.OnSharedOpencode.opencode_for_class()

    # test_ask_e2e's helpers, not its tests.
    release = ask_e2e.AskEndToEndTests.release
    session_status = ask_e2e.AskEndToEndTests.session_status

    def start_gateway(self, port, **settings):
        super().start_gateway(port, ask_max_running=1, **settings)

    async def asking(self, id, label):
        c = self.computer(id=id, label=label)
        await self.start_daemon(c)
        shell = c.run("/rom/programs/shell.lua")
        c.focus(shell)
        c.type_line(f"/programs/sandbox.lua ask think, {label}")
        return c

    def prompts(self, model):
        return " ".join(
            str(body["messages"][-1].get("content"))
            for body in model.requests
            if body.get("tools") and body["messages"][-1].get("role") == "user"
        )

    async def test_a_disconnect_aborts_the_run_and_the_next_ask_starts_at_once(self):
        model = await self.fake_model("", {}, script=[], answer="Thinking hard", hold=True)
        self.addCleanup(self.release, model)
        await self.opencode(model)
        first = await self.asking(7, "gone")
        await first.wait_for_output("Thinking", 90)
        (conversation,) = self.gateway.asks.conversations.values()
        await first.shutdown()  # the computer's connection drops mid-answer
        await bounded(model.hung_up, 10)  # opencode stopped the run: the gateway aborted it
        self.assertEqual(self.gateway.asks.runs, {})
        self.assertEqual(self.gateway.metrics._asks.labels("disconnected").value, 1)
        status = await self.session_status(conversation.session_id, conversation.directory)
        self.assertIn(status, (None, {"type": "idle"}))
        # Back again (one ask may run at once here): its next ask runs, not waits.
        again = await self.asking(7, "gone")
        await again.wait_for_output("Thinking", 90)
        self.assertNotIn("waiting for the agent", again.output)
        self.assertNotIn("already running", again.output)

    async def test_the_gateway_stopping_aborts_the_run_and_starts_no_waiting_ask(self):
        model = await self.fake_model("", {}, script=[], answer="Thinking hard", hold=True)
        self.addCleanup(self.release, model)
        await self.opencode(model)
        first = await self.asking(7, "first")
        await first.wait_for_output("Thinking", 90)
        second = await self.asking(8, "second")
        await second.wait_for_output("waiting for the agent: next in line", 30)
        (conversation,) = self.gateway.asks.conversations.values()
        await self.gateway.service.stopService()
        await bounded(model.hung_up, 10)  # the running one was aborted in opencode
        await first.wait_for_output("shutting down", 30)  # and its player told
        status = await self.session_status(conversation.session_id, conversation.directory)
        self.assertIn(status, (None, {"type": "idle"}))
        self.assertNotIn("think, second", self.prompts(model))
        self.assertEqual(list(self.gateway.asks.conversations), [("local", "7:first")])


both_modes(globals(), "AskEdgesEndToEndTests")
