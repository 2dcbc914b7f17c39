"""
Issue 33 on the real opencode: past ``SANDBOX_ASK_MAX_RUNNING`` asks wait in
order, each computer's player sees its place ("waiting for the agent: ..."),
one cancelled while it waits never reaches opencode, and the next runs when
the running one ends.
"""

from twisted.trial.unittest import TestCase

from tests.harness.support import both_modes
from tests.lua import test_ask_e2e as ask_e2e
from tests.lua.test_lua_e2e import GatewayMixin


class AskQueueEndToEndTests(ask_e2e.OnSharedOpencode, GatewayMixin, TestCase):
    timeout = 150
    shared = ask_e2e.OnSharedOpencode.opencode_for_class()

    # test_ask_e2e's helpers, not its tests.
    release = ask_e2e.AskEndToEndTests.release

    def start_gateway(self, port, **settings):
        super().start_gateway(port, ask_max_running=1, **settings)

    async def asking(self, id, label):
        c = self.computer(id=id, label=label)
        await self.start_daemon(c)
        shell = c.run("/rom/programs/shell.lua")
        c.focus(shell)
        c.type_line(f"/programs/sandbox.lua ask think, {label}")
        return c

    async def test_asks_wait_in_order_and_one_cancelled_while_waiting_never_runs(self):
        # The closing text's first word is printed (the wrapper holds back the last one).
        model = await self.fake_model("", {}, script=[], answer="Thinking hard", hold=True)
        self.addCleanup(self.release, model)
        await self.opencode(model)
        first = await self.asking(7, "first")
        await first.wait_for_output("Thinking", 90)
        second = await self.asking(8, "second")
        await second.wait_for_output("waiting for the agent: next in line", 30)
        third = await self.asking(9, "third")
        await third.wait_for_output("waiting for the agent: 1 ask ahead", 30)

        second.terminate()  # Ctrl+T while it waits
        await second.wait_for_output("sandbox ask: cancelled", 30)
        await third.wait_for_output("waiting for the agent: next in line", 30)
        self.assertNotIn("Thinking", third.output)

        first.terminate()  # the first ends: the third's turn
        await first.wait_for_output("sandbox ask: cancelled", 30)
        await third.wait_for_output("Thinking", 90)
        prompts = [
            body["messages"][-1]
            for body in model.requests
            if body.get("tools") and body["messages"][-1].get("role") == "user"
        ]
        said = " ".join(str(message.get("content")) for message in prompts)
        self.assertLess(said.index("think, first"), said.index("think, third"))
        self.assertNotIn("think, second", said)
        self.assertEqual(
            {key[1] for key in self.gateway.asks.conversations}, {"7:first", "9:third"}
        )
        self.assertEqual(self.gateway.metrics._asks.labels("cancelled").value, 2)


both_modes(globals(), "AskQueueEndToEndTests")
