"""
Issue 33 on two real opencode servers (``OPENCODE_URL`` a list): one killed
while a computer's ask runs on it, the ask ends with a clear message, the
computer's next ask goes to the other server, the player told that the
conversation starts afresh, and ``sandbox health`` says which server is down.
"""

from twisted.trial.unittest import TestCase

from tests.harness.fake_model import start_fake_model
from tests.harness.opencode import start_opencode
from tests.harness.support import closed_port
from tests.lua import test_ask_e2e as ask_e2e
from tests.lua.test_lua_e2e import GatewayMixin
from trapsandbox import limits
from trapsandbox.ops import ctl


class AskServersEndToEndTests(GatewayMixin, TestCase):
    timeout = 180

    release = ask_e2e.AskEndToEndTests.release

    def setUp(self):
        # A lost server's asks end once its event stream cannot be opened for this long
        # (ten seconds in the gateway: what matters here is that it ends, not the bound).
        self.patch(limits, "ASK_SERVER_GONE", 2.0)
        self.urls = [f"http://127.0.0.1:{closed_port()}" for _ in range(2)]
        self.opencode_url = ",".join(self.urls)
        self.start_gateway(
            0,
            admin_token=ask_e2e.TOKEN,
            opencode_password=ask_e2e.OPENCODE_PASSWORD,
            ask_directory=self.mktemp(),
        )

    async def opencodes(self, model):
        config = {
            **model.opencode_config(),
            **ctl.opencode_config(f"http://127.0.0.1:{self.port}", True),
        }
        self.children = {}
        for url in self.urls:
            children = []
            await start_opencode(
                self,
                ask_e2e.OPENCODE_PASSWORD,
                config,
                env={"SANDBOX_ADMIN_TOKEN": ask_e2e.TOKEN},
                global_config=True,
                port=int(url.rsplit(":", 1)[1]),
                children=children,
            )
            self.children[url] = children[0]

    def ask(self, c, words):
        shell = c.run("/rom/programs/shell.lua")
        c.focus(shell)
        c.type_line(f"/programs/sandbox.lua ask {words}")

    async def test_a_server_killed_mid_answer_ends_the_ask_and_the_next_goes_to_the_other(self):
        # The closing text's first word is printed (the wrapper holds back the last one).
        model = await start_fake_model(self, "", {}, script=[], answer="Thinking hard", hold=True)
        self.addCleanup(self.release, model)
        await self.opencodes(model)
        c = self.computer(id=7, label="ask")
        await self.start_daemon(c)
        self.ask(c, "think")
        await c.wait_for_output("Thinking", 90)
        (conversation,) = self.gateway.asks.conversations.values()
        home = conversation.server.url
        (other,) = [url for url in self.urls if url != home]

        self.children[home].signal("KILL")
        await self.children[home].wait_ended(10)
        await c.wait_for_output("the agent's run was cut off", 60)
        self.assertIn("the next ask goes to another opencode server", c.output)

        model.hold = False
        model.answer = "Done now. "
        self.ask(c, "again")
        await c.wait_for_output("Done now.", 90)
        # Wrapped lines are joined without their break (a cursor move, not a character).
        said = "".join(c.output.split())
        self.assertIn(f"(opencodeat{home}isnotanswering:thisconversationstartsafresh", said)
        (conversation,) = self.gateway.asks.conversations.values()
        self.assertEqual(conversation.server.url, other)

        health = c.run("/programs/sandbox.lua health")
        await health.done
        self.assertIn("opencodeOk: true", c.output)
        self.assertIn("1 of 2 opencode servers up; down: " + home, c.output)
